#!/usr/bin/env python3
"""Where one training step's device time goes, by kernel family, from Nsight Compute's CSV.

Profile one steady-state step (the benches run their first timed iteration between
cudaProfilerStart and cudaProfilerStop under ZP_BENCH_PROFILE=1), each kernel timed alone:

  ZP_BENCH_PROFILE=1 ncu --clock-control none --profile-from-start off \
      --metrics gpu__time_duration.sum --csv --print-units base \
      zp_bench_unet --benchmark_filter='BM_TrainStepSd15/B:8/ckpt:0/in_backward:0' > sd15.csv
  python3 bench/kernel_breakdown.py sd15.csv

Kernels run one at a time under ncu, so the sum is the step without overlap or launch gaps; the
shares say which families to work on, the event-timed step in the bench's own output is the speed.
Families are matched on the demangled name, first match wins; what matches none is listed by name.
A .json argument is bench/reference/torch_step_profile.py's output (a PyTorch reference's step under
PyTorch's profiler), grouped the same way, so the two tables compare family by family.
"""
import json
import csv
import re
import sys
from collections import defaultdict

FAMILIES = [
    ("attention (cuDNN SDPA)", r"sdpa|dot_do_o|convert_dq_to_16bits"),
    ("AdamW", r"adamw|fusedoptimizer"),
    ("flash attention backward", r"flash_backward|flash_dq_convert"),
    ("flash attention forward", r"flash_forward"),
    ("attention (general kernels)", r"attention"),
    ("GroupNorm", r"group_?norm|groupnorm|gn_"),
    ("LayerNorm", r"layer_?norm|layernorm"),
    ("RMSNorm", r"rms_?norm"),
    ("layout (NCHW <-> NHWC, filters KCRS <-> KRSC)", r"nchwtonhwc|nhwctonchw|transpose|to_krsc|from_krsc"),
    ("bias gradients", r"bias_grad"),
    ("convolution (cuDNN)", r"cudnn|conv|implicit_gemm|fprop|dgrad|wgrad"),
    ("GEMM (cuBLASLt)", r"gemm|nvjet|cutlass|sm90_|ampere_|gmma"),
    ("cross-entropy", r"cross_entropy"),
    ("reductions (norms, clipping)", r"reduce|norm_sq|sum_sq"),
    ("elementwise and activations",
     r"elementwise|silu|gelu|swiglu|activation|add|scale|cast|copy|fill|mul|upsample|mse|dropout|embedding|cat_"),
]


def family(name):
    low = name.lower()
    for fam, pat in FAMILIES:
        if re.search(pat, low):
            return fam
    return None


def kernel_times(path):
    """(name, launches, nanoseconds) of every kernel in an ncu CSV or a torch_step_profile JSON."""
    if path.endswith(".json"):
        with open(path) as f:
            return [(name, k["count"], 1e3 * k["us"]) for name, k in json.load(f)["kernels"].items()]
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    return [(row["Kernel Name"], 1, float(row["Metric Value"].replace(",", "")))
            for row in csv.DictReader(lines) if row.get("Metric Name") == "gpu__time_duration.sum"]


def main(path):
    times = defaultdict(float)
    counts = defaultdict(int)
    by_name = defaultdict(float)
    for name, launches, ns in kernel_times(path):
        fam = family(name) or "other: " + re.sub(r"\(.*", "", name)[:90]
        times[fam] += ns
        counts[fam] += launches
        by_name[re.sub(r"\(.*", "", name)[:110]] += ns
    total = sum(times.values())
    if total == 0:
        sys.exit(f"{path}: no kernel times")
    print(f"{path}: {sum(counts.values())} kernels, {total / 1e6:.2f} ms")
    print(f"{'family':<44} {'ms':>8} {'share':>6} {'launches':>8}")
    for fam, ns in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{fam:<44} {ns / 1e6:8.2f} {100 * ns / total:5.1f}% {counts[fam]:8d}")
    print("\nlongest kernels by name:")
    for name, ns in sorted(by_name.items(), key=lambda kv: -kv[1])[:15]:
        print(f"{ns / 1e6:8.2f} ms  {name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: kernel_breakdown.py NCU_CSV | TORCH_PROFILE_JSON")
    main(sys.argv[1])
