#!/usr/bin/env python3
"""Holds a PEFT adapter folder written by `zeropipe convert --from LORA.h5 --to DIR` to what PEFT itself
does with it, and a merged folder written by `zeropipe convert --merge-lora` to PEFT's own merge.

  1. loads the base hub folder with transformers (float32) and requires that it loaded every weight
     (no missing or unexpected keys besides tied ones);
  2. applies the adapter with peft.PeftModel.from_pretrained, with every warning an error, and then
     checks independently that each tensor of adapter_model.safetensors landed in exactly one LoRA
     parameter of the model with identical values, and that no LoRA parameter was left out (PEFT
     loads with strict=False and says nothing about unexpected keys, and only warns on missing ones);
  3. merges with merge_and_unload() and compares every tensor of the merged folder with it: prints
     the largest absolute difference and the largest relative one (max |a - b| / max |b| per tensor)
     and exits 1 when any relative one is above --rtol (1e-5).

Exit status: 0 all good; 1 merged weights differ; 2 the adapter or the base did not load cleanly.

Needs torch, transformers, peft and safetensors; this repository's CI has none of them, so it runs on
the GPU host (CPU is enough; the models are tiny):

  zeropipe convert --from lora.h5 --to /tmp/adapter
  zeropipe convert --merge-lora lora.h5 --from tests/golden/llama-tiny --to /tmp/merged
  python3 tests/reference/check_peft_adapter.py /tmp/adapter tests/golden/llama-tiny /tmp/merged

Not run here (no peft on the development machine): written against peft's LoraConfig and
save_and_load.py and transformers' from_pretrained(output_loading_info=True).
"""
import argparse
import glob
import json
import os
import re
import sys
import warnings


def fail(code, msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(code)


def load_folder_tensors(folder):
    """Every tensor of a hub folder's or adapter folder's safetensors files (single or sharded)."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        fail(2, f"{folder}: no .safetensors files")
    tensors = {}
    for f in files:
        for k, v in load_file(f).items():
            if k in tensors:
                fail(2, f"{folder}: tensor {k} is in more than one file")
            tensors[k] = v
    return tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter", help="PEFT adapter folder (adapter_config.json + adapter_model.safetensors)")
    ap.add_argument("base", help="base model hub folder")
    ap.add_argument("merged", help="merged hub folder written by zeropipe convert --merge-lora")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        if not os.path.isfile(os.path.join(args.adapter, f)):
            fail(2, f"{args.adapter}: no {f}")
    with open(os.path.join(args.adapter, "adapter_config.json")) as fh:
        config = json.load(fh)

    # 1. The base, every weight loaded.
    base, info = AutoModelForCausalLM.from_pretrained(
        args.base, torch_dtype=torch.float32, output_loading_info=True, attn_implementation="eager")
    tied = {"lm_head.weight"} if getattr(base.config, "tie_word_embeddings", False) else set()
    missing = [k for k in info.get("missing_keys", []) if k not in tied]
    unexpected = list(info.get("unexpected_keys", []))
    if missing or unexpected or info.get("mismatched_keys"):
        fail(2, f"{args.base}: transformers did not load it cleanly: missing {missing}, unexpected {unexpected}, "
                f"mismatched {info.get('mismatched_keys')}")
    base.eval()

    # 2. The adapter, with any warning an error (PEFT warns on missing adapter keys, on unknown config
    # fields, on fan_in_fan_out set wrongly for the layer type).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            model = PeftModel.from_pretrained(base, args.adapter, is_trainable=False)
        except Exception as e:  # a warning turned error, or PEFT's own refusal
            fail(2, f"{args.adapter}: PEFT did not load it cleanly: {type(e).__name__}: {e}")
    loaded_cfg = model.peft_config["default"]
    for field, want in (("r", config["r"]), ("lora_alpha", config["lora_alpha"]),
                        ("use_rslora", config.get("use_rslora", False)),
                        ("fan_in_fan_out", config.get("fan_in_fan_out", False))):
        if getattr(loaded_cfg, field) != want:
            fail(2, f"{args.adapter}: PEFT read {field} = {getattr(loaded_cfg, field)}, the file says {want}")

    file_tensors = load_folder_tensors(args.adapter)
    # The model's LoRA parameters under the names PEFT saves them: without the adapter name.
    lora_params = {}
    for name, p in model.named_parameters():
        if ".lora_" not in name:
            continue
        saved = re.sub(r"\.(lora_[A-Za-z_]+)\.default\.", r".\1.", name)
        lora_params[saved] = p
    unconsumed = sorted(set(file_tensors) - set(lora_params))
    left_out = sorted(set(lora_params) - set(file_tensors))
    if unconsumed:
        fail(2, f"{args.adapter}: {len(unconsumed)} tensors of the file match no LoRA parameter "
                f"(PEFT ignores them silently), e.g. {unconsumed[:3]}")
    if left_out:
        fail(2, f"{args.adapter}: {len(left_out)} LoRA parameters got nothing from the file, e.g. {left_out[:3]}")
    for k, v in file_tensors.items():
        p = lora_params[k].detach().cpu()
        if p.shape != v.shape or not torch.equal(p.to(v.dtype), v):
            fail(2, f"{args.adapter}: {k}: the model holds {tuple(p.shape)} other values than the file's {tuple(v.shape)}")
    print(f"adapter: {len(file_tensors)} tensors, all loaded into the model; r={config['r']} "
          f"lora_alpha={config['lora_alpha']} fan_in_fan_out={config.get('fan_in_fan_out', False)}")

    # 3. PEFT's merge against ours.
    merged = model.merge_and_unload()
    ref = {k: v.detach().cpu().float() for k, v in merged.state_dict().items()}
    ours = load_folder_tensors(args.merged)
    missing_here = sorted(k for k in ref if k not in ours and k not in tied)
    extra_here = sorted(k for k in ours if k not in ref)
    if missing_here or extra_here:
        fail(1, f"{args.merged}: tensors differ from the merged model's: missing {missing_here[:5]}, extra {extra_here[:5]}")
    worst_abs, worst_rel, worst_name = 0.0, 0.0, None
    for k, v in sorted(ours.items()):
        a, b = v.float(), ref[k]
        if a.shape != b.shape:
            fail(1, f"{args.merged}: {k} has shape {tuple(a.shape)}, PEFT's merge {tuple(b.shape)}")
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        scale = b.double().abs().max().item() if b.numel() else 0.0
        rel = diff / scale if scale > 0 else diff
        worst_abs = max(worst_abs, diff)
        if rel >= worst_rel:
            worst_rel, worst_name = rel, k
    print(f"merged: {len(ours)} tensors; max abs diff {worst_abs:.3e}; max relative {worst_rel:.3e} ({worst_name})")
    if worst_rel > args.rtol:
        fail(1, f"{args.merged}: {worst_name} differs from PEFT's merge by {worst_rel:.3e} relative (limit {args.rtol:g})")
    print("OK")


if __name__ == "__main__":
    main()
