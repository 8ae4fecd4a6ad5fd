#!/usr/bin/env python3
"""LoRA reference dumps on the golden LM folders (issue 14), made with PEFT's own LoRA layers.

For each folder (tests/golden/{llama,qwen2,gpt2}-tiny) it applies peft.LoraConfig(r=4, lora_alpha=8,
lora_dropout=0, every linear module of the layers) to the transformers model, gives every lora_A and
lora_B seeded Normal(0, 0.1) values (B non-zero, so the adapters change the output), and writes
the folder <folder>/lora/ (`zeropipe parity <folder>/lora` runs it): lora.json (the LoRA settings)
and io.safetensors with, under the engine's internal names (PEFT's without "base_model.model." and
the adapter name):

  input.lora.<module>.lora_A.weight, ...B.weight  the adapter values (float32 copies of the float64 ones)
  output.logits, output.loss                      the forward on io.safetensors' input_ids, labels = ids
  grad.<module>.lora_A.weight / .lora_B.weight    d loss / d adapter

all computed in float64 on the CPU (eager attention), and reference_error.json: what
PEFT itself reaches against that float64 dump in float32 (TF32 off) and in bf16 autocast, on the CPU
and the GPU (the larger of the two), by the golden README's relative error per tensor, so `zeropipe parity` holds the engine to the README's criterion
(tests/test_lora.cpp, LoraGolden*).

Needs torch, transformers, peft, safetensors (the GPU host has them):
  python3 tests/reference/lora_golden_reference.py tests/golden/{llama,qwen2,gpt2}-tiny
"""
import json
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def internal(peft_name):
    n = peft_name.removeprefix("base_model.model.")
    return n.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def build(folder, model_type, dtype, device):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS[model_type],
                     fan_in_fan_out=(model_type == "gpt2"), bias="none")
    pm = get_peft_model(model, cfg, autocast_adapter_dtype=False).to(device)
    pm.train()
    return pm


def adapter_values(pm):
    values = {}
    g = torch.Generator().manual_seed(2026)
    for name, p in sorted(pm.named_parameters()):
        if ".lora_A." in name or ".lora_B." in name:
            values[internal(name)] = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1
    return values


def run(pm, values, ids, autocast_bf16):
    for name, p in pm.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            p.data.copy_(values[internal(name)].to(p.dtype))
            p.grad = None
    device = ids.device.type
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast_bf16):
        out = pm(input_ids=ids, labels=ids)
    out.loss.backward()
    res = {"output.logits": out.logits.detach(), "output.loss": out.loss.detach().reshape(1)}
    for name, p in pm.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            res["grad." + internal(name)] = p.grad.detach()
    return res


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for folder in sys.argv[1:]:
        model_type = json.load(open(f"{folder}/config.json"))["model_type"]
        ids = load_file(f"{folder}/io.safetensors")["input.input_ids"]
        ref_model = build(folder, model_type, torch.float64, "cpu")
        values = adapter_values(ref_model)
        ref = run(ref_model, values, ids, False)
        dump = {k: v.float().contiguous() for k, v in ref.items()}
        for k, v in values.items():
            dump["input.lora." + k] = v.float().contiguous()
        out = f"{folder}/lora"
        os.makedirs(out, exist_ok=True)
        save_file(dump, f"{out}/io.safetensors")
        with open(f"{out}/lora.json", "w") as f:
            json.dump({"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": TARGETS[model_type], "rslora": False},
                      f, indent=1)
        errors = {"fp32": {}, "bf16": {}}
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for mode in ("fp32", "bf16"):
            for device in devices:
                pm = build(folder, model_type, torch.float32, device)
                got = run(pm, values, ids.to(device), mode == "bf16")
                for k, v in ref.items():
                    errors[mode][k] = max(errors[mode].get(k, 0.0), rel(got[k].float(), v))
        with open(f"{out}/reference_error.json", "w") as f:
            json.dump(errors, f, indent=1, sort_keys=True)
        worst = {m: max(e.values()) for m, e in errors.items()}
        print(f"{folder}: {len(values)} adapter tensors, loss {float(ref['output.loss']):.6f}, "
              f"PEFT's own worst error fp32 {worst['fp32']:.2e} bf16 {worst['bf16']:.2e}")


if __name__ == "__main__":
    main()
