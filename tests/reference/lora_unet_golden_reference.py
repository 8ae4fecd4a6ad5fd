#!/usr/bin/env python3
"""LoRA reference dumps on the golden UNet folders (issue 14), made with PEFT's own LoRA layers
injected into diffusers' UNet2DConditionModel (peft.inject_adapter_in_model, as diffusers' own
add_adapter does).

For each folder (tests/golden/unet-{sd,sdxl}-tiny) it adapts, with LoraConfig(r=4, lora_alpha=8,
lora_dropout=0), the transformer blocks' linear modules: to_q, to_k, to_v, to_out.0, ff.net.0.proj,
ff.net.2, and proj_in / proj_out where the config makes them linear (SDXL); gives every lora_A and
lora_B seeded Normal(0, 0.1) values; and writes <folder>/lora/ (`zeropipe parity <folder>/lora`):
lora.json (the settings) and io.safetensors with, under the engine's names (diffusers' module path
without PEFT's adapter name):

  input.lora.<module>.lora_A.weight, ...B.weight  the adapter values (float32 copies of the float64 ones)
  output.sample                                    the forward on the folder's io.safetensors inputs
  grad_input.sample, grad.<module>.lora_{A,B}.weight   gradients of sum(output.sample * grad_output.sample)

all in float64 on the CPU, and reference_error.json: what the same model reaches in float32 (TF32 off)
and bf16 autocast, CPU and GPU (the larger), by the golden README's relative error per tensor.

Needs torch, peft, safetensors and diffusers' source (the GPU host has no diffusers package; the
reference bench packs its source):
  python3 tests/reference/lora_unet_golden_reference.py --src diffusers/src tests/golden/unet-{sd,sdxl}-tiny
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def internal(name):
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="diffusers' src folder")
    ap.add_argument("folders", nargs="+")
    a = ap.parse_args()
    sys.path.insert(0, a.src)
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig, inject_adapter_in_model
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    for folder in a.folders:
        cfg = json.load(open(f"{folder}/config.json"))
        targets = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
        if cfg.get("use_linear_projection"):
            targets += ["proj_in", "proj_out"]
        io = load_file(f"{folder}/io.safetensors")

        def build(dtype, device):
            unet = UNet2DConditionModel.from_pretrained(folder, torch_dtype=dtype)
            unet = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets), unet)
            return unet.to(device=device, dtype=dtype).train()

        def run(unet, values, device, dtype, bf16):
            for name, p in unet.named_parameters():
                p.requires_grad_(".lora_" in name)
                if ".lora_" in name:
                    p.data.copy_(values[internal(name)].to(dtype))
                p.grad = None
            # A fresh leaf each run: .to() of a tensor that already required grad would give a non-leaf.
            sample = io["input.sample"].detach().to(device=device, dtype=dtype).clone().requires_grad_(True)
            kw = {}
            if "input.text_embeds" in io:
                kw["added_cond_kwargs"] = {"text_embeds": io["input.text_embeds"].to(device=device, dtype=dtype),
                                           "time_ids": io["input.time_ids"].to(device=device, dtype=dtype)}
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
                out = unet(sample, io["input.timestep"].to(device=device, dtype=dtype),
                           encoder_hidden_states=io["input.encoder_hidden_states"].to(device=device, dtype=dtype),
                           **kw).sample
            (out.float() * io["grad_output.sample"].to(device).float()).sum().backward()
            res = {"output.sample": out.detach(), "grad_input.sample": sample.grad.detach()}
            for name, p in unet.named_parameters():
                if ".lora_" in name:
                    res["grad." + internal(name)] = p.grad.detach()
            return res

        ref_model = build(torch.float64, "cpu")
        g = torch.Generator().manual_seed(2026)
        values = {internal(n): torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1
                  for n, p in sorted(ref_model.named_parameters()) if ".lora_" in n}
        ref = run(ref_model, values, "cpu", torch.float64, False)
        out = f"{folder}/lora"
        os.makedirs(out, exist_ok=True)
        dump = {k: v.float().contiguous() for k, v in ref.items()}
        dump.update({"input.lora." + k: v.float().contiguous() for k, v in values.items()})
        save_file(dump, f"{out}/io.safetensors")
        with open(f"{out}/lora.json", "w") as f:
            json.dump({"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": targets, "rslora": False}, f, indent=1)
        errors = {"fp32": {}, "bf16": {}}
        for mode in ("fp32", "bf16"):
            for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
                got = run(build(torch.float32, device), values, device, torch.float32, mode == "bf16")
                for k, v in ref.items():
                    errors[mode][k] = max(errors[mode].get(k, 0.0), rel(got[k].float(), v))
        with open(f"{out}/reference_error.json", "w") as f:
            json.dump(errors, f, indent=1, sort_keys=True)
        print(f"{folder}: {len(values)} adapter tensors; diffusers + PEFT's own worst error fp32 "
              f"{max(errors['fp32'].values()):.2e} bf16 {max(errors['bf16'].values()):.2e}")


if __name__ == "__main__":
    main()
