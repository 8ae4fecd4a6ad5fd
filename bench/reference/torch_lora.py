#!/usr/bin/env python3
"""The anchor of zp_bench_lora (issue 14): a LoRA fine-tuning step of a Llama 3 8B-shaped model in
transformers with PEFT's LoRA layers, on one GPU, with the same shapes: r = 16, lora_alpha 32,
lora_dropout 0.05 on q/k/v/o/gate/up/down_proj, bf16 weights, SDPA attention, B = 1, T = 2048,
fused AdamW on the adapters (PEFT keeps them in float32: autocast_adapter_dtype, its default), random
tokens, random initialisation (values do not change timings). Prints tokens/s and peak memory
(torch.cuda.max_memory_allocated) as one JSON line.

  python3 bench/reference/torch_lora.py --ckpt 0|1 [--steps 8]
"""
import argparse
import json
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", type=int, default=0, help="gradient checkpointing")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--T", type=int, default=2048)
    a = ap.parse_args()
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.config.use_cache = False
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    if a.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, a.T), device="cuda", generator=g)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / a.steps
    print(json.dumps({"impl": "transformers+peft", "ckpt": a.ckpt, "T": a.T, "ms_per_step": secs * 1e3,
                      "tokens_per_s": a.T / secs, "peak_allocated_GiB": torch.cuda.max_memory_allocated() / 2**30,
                      "trainable_M": sum(p.numel() for p in params) / 1e6,
                      "device": torch.cuda.get_device_name(0)}))


if __name__ == "__main__":
    main()
