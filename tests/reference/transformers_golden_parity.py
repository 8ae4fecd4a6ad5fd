#!/usr/bin/env python3
"""What the reference implementation itself reaches on the golden LM folders (tests/golden/*-tiny).

`zeropipe parity` compares our engine with float64 dumps at fixed tolerances (fp32 1e-4, bf16 3e-2).
This script runs transformers the same way, in float32 and with bf16 autocast, on the CPU and the
GPU, and prints the same relative errors (||a - b|| / ||b|| per tensor), so a tensor that fails in
our engine can be told apart from one no float32/bf16 implementation can meet. Needs torch and
transformers (the GPU host has both).

  python3 tests/reference/transformers_golden_parity.py tests/golden/{gpt2,llama,qwen2}-tiny
"""
import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def run(folder, device, mode):
    io = load_file(f"{folder}/io.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").to(device)
    model.train()
    ids = io["input.input_ids"].to(device)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=(mode == "bf16"))
    errs = {}
    with autocast:
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    errs["output.logits"] = rel(out.logits.float(), io["output.logits"])
    errs["output.loss"] = rel(out.loss.detach().float().reshape(1), io["output.loss"])
    named = dict(model.named_parameters())
    for name, p in named.items():
        if f"grad.{name}" in io:
            errs[f"grad.{name}"] = rel(p.grad, io[f"grad.{name}"])
    # 5 full-batch AdamW steps as the golden README describes (fresh gradients each step).
    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(float(loss))
        opt.step()
    errs["train.loss"] = rel(torch.tensor(losses), io["train.loss"])
    for name, p in named.items():
        if f"train.final.{name}" in io:
            errs[f"train.final.{name}"] = rel(p.detach(), io[f"train.final.{name}"])
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    torch.backends.cudnn.allow_tf32 = False
    for folder in args.folders:
        for device in args.devices.split(","):
            if device == "cuda" and not torch.cuda.is_available():
                continue
            for mode, tol in (("fp32", 1e-4), ("bf16", 3e-2)):
                if mode == "bf16" and device == "cpu":
                    continue
                errs = run(folder, device, mode)
                bad = {k: v for k, v in errs.items() if not v <= tol}
                worst = max(errs, key=errs.get)
                print(f"{folder} {device} {mode}: {len(errs) - len(bad)} of {len(errs)} within {tol:g} "
                      f"(worst {errs[worst]:.3e} {worst})")
                for k, v in sorted(bad.items(), key=lambda kv: -kv[1]):
                    print(f"  FAIL {k} {v:.3e}")
                if args.verbose:
                    for k, v in errs.items():
                        print(f"  {k} {v:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
