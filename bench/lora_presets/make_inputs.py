# Inputs for running the two LoRA presets at their real sizes (bench/lora_presets/run.sh), under ROOT
# (the repository root, where the presets' relative paths point): a Llama hub folder with random bf16
# weights (Llama 3 8B's config, or a 2-layer d=64 one with --tiny; 4 safetensors shards and an index;
# the Llama 3 tokenizer from tests/data), instruction records, and OUT_CONFIG: the SDXL LoRA preset
# starting from random weights of SDXL's UNet config (configs/sdxl-unet-zero2.json's).
# Writes safetensors by hand (header + raw bf16) so that it needs only numpy; torch, where present,
# draws the values on the GPU.
# Usage: make_inputs.py ROOT OUT_CONFIG [--tiny]
import json, os, random, struct, subprocess, sys
import numpy as np
root, out_config, tiny = sys.argv[1], sys.argv[2], "--tiny" in sys.argv
hub = os.path.join(root, "models/Meta-Llama-3-8B-Instruct")
os.makedirs(hub, exist_ok=True)
H, I, L, NH, NKV = (64, 128, 2, 4, 2) if tiny else (4096, 14336, 32, 32, 8)
V, KV = 128256, NKV * (H // NH)
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
       "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
       "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128009, "hidden_act": "silu",
       "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02}
json.dump(cfg, open(os.path.join(hub, "config.json"), "w"), indent=1)
try:
    import torch
    gen = torch.Generator(device="cuda").manual_seed(0)
    def rnd(*shape):  # bf16 bits as uint16
        t = (torch.randn(*shape, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
except Exception:
    rs = np.random.default_rng(0)
    def rnd(*shape):
        f = (rs.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
        return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)
def ones(n):
    return np.full(n, 0x3F80, dtype=np.uint16)
tensors = [("model.embed_tokens.weight", lambda: rnd(V, H))]
for l in range(L):
    p = f"model.layers.{l}."
    tensors += [(p + "self_attn.q_proj.weight", lambda: rnd(H, H)), (p + "self_attn.k_proj.weight", lambda: rnd(KV, H)),
                (p + "self_attn.v_proj.weight", lambda: rnd(KV, H)), (p + "self_attn.o_proj.weight", lambda: rnd(H, H)),
                (p + "mlp.gate_proj.weight", lambda: rnd(I, H)), (p + "mlp.up_proj.weight", lambda: rnd(I, H)),
                (p + "mlp.down_proj.weight", lambda: rnd(H, I)),
                (p + "input_layernorm.weight", lambda: ones(H)),
                (p + "post_attention_layernorm.weight", lambda: ones(H))]
tensors += [("model.norm.weight", lambda: ones(H)), ("lm_head.weight", lambda: rnd(V, H))]
def save(path, part):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for n, a in part:
        header[n] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, a in part:
            f.write(np.ascontiguousarray(a).tobytes())
shards = 4
per = (len(tensors) + shards - 1) // shards
weight_map, total = {}, 0
for s in range(shards):
    name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = [(n, f()) for n, f in tensors[s * per:(s + 1) * per]]
    for n, a in part:
        weight_map[n] = name
        total += a.nbytes
    save(os.path.join(hub, name), part)
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(os.path.join(hub, "model.safetensors.index.json"), "w"), indent=1)
subprocess.run(["tar", "-xJf", os.path.join(root, "tests/data/tokenizers/llama3.tar.xz"), "-C", hub,
                "--strip-components=1", "llama3/tokenizer.json", "llama3/tokenizer_config.json"], check=True)
print(f"llama hub: {total / 1e9:.2f} GB in {shards} shards")
# Instruction records: prompt/response pairs of random words, enough to pack many 2048-token rows.
rng = random.Random(1)
words = ("the of and to in is was for on that with as by at from his her an which are were be this have had "
         "model train data token layer weight gradient shard stage memory card node loss step rate batch").split()
os.makedirs(os.path.join(root, "data"), exist_ok=True)
with open(os.path.join(root, "data/instruct-train.jsonl"), "w") as f:
    for i in range(6000):
        p = " ".join(rng.choice(words) for _ in range(rng.randint(20, 120)))
        r = " ".join(rng.choice(words) for _ in range(rng.randint(40, 300)))
        f.write(json.dumps({"prompt": p.capitalize() + "?", "response": r.capitalize() + "."}) + "\n")
# The SDXL LoRA preset from random weights (the GPU hosts cannot download): the real UNet config inline.
c = json.load(open(os.path.join(root, "configs/sdxl-unet-lora.json")))
c["model"]["init"] = "random"
c["model"].pop("hub_dir")
c["model"]["config"] = json.load(open(os.path.join(root, "configs/sdxl-unet-zero2.json")))["model"]["config"]
json.dump(c, open(out_config, "w"), indent=1)
