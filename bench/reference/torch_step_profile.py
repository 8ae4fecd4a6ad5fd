#!/usr/bin/env python3
"""One more step of a shared/reference-bench script under PyTorch's profiler: its kernels' device time.

  python3 bench/reference/torch_step_profile.py OUT.json REFERENCE_SCRIPT STEP_FUNCTION -- SCRIPT_ARGS...
  e.g. ... torch_unet_sd15.json ../shared/reference-bench/torch_unet.py step -- --src src --model sd15 --B 8 --compile 1

The script runs as it is (its warm-up, its timed steps and its printed line); then its step function
(`step` in torch_unet.py, `train_step` in torch_gpt2.py) runs once more under torch.profiler, and OUT.json
gets every CUDA kernel's launch count and device microseconds. `bench/kernel_breakdown.py OUT.json`
groups them by family as it does ncu's CSV for our benches.
"""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    if len(sys.argv) < 4 or "--" not in sys.argv:
        sys.exit(__doc__)
    out, script, step_name = sys.argv[1:4]
    sys.argv = [script] + sys.argv[sys.argv.index("--") + 1:]
    scope = {"__name__": "__main__", "__file__": script}
    with open(script) as f:
        exec(compile(f.read(), script, "exec"), scope)
    step = scope[step_name]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, {"count": 0, "us": 0.0})
            k["count"] += 1
            k["us"] += e.device_time
    with open(out, "w") as f:
        json.dump({"script": script, "args": sys.argv[1:], "kernels": kernels}, f)
    total = sum(k["us"] for k in kernels.values())
    print(f"profiled step: {total / 1e3:.1f} ms of kernels in {sum(k['count'] for k in kernels.values())} launches")


if __name__ == "__main__":
    main()
