#!/usr/bin/env python3
"""Fails on an #include that points to a higher layer (DESIGN.md "Layers"), naming file, line and
both layers. Run by test.sh; the per-layer libraries of CMakeLists.txt also refuse such a call at
link time, but only when it is a call: this catches headers too.
    launch/check-layers.py [REPO_ROOT]
"""
import os
import re
import sys

ORDER = ["core", "kernels", "comm", "io", "nn", "parallel", "models", "runtime", "app"]
RANK = {n: i for i, n in enumerate(ORDER)}
# parallel implements nn's block-access interface; models (above parallel in the list) must still
# never include it: models hold weights, the engine shards them.
FORBIDDEN = {("models", "parallel"), ("nn", "parallel")}
INCLUDE = re.compile(r'\s*#\s*include\s+"([a-z_]+)/')


def layer_of(path):
    parts = path.split(os.sep)
    if parts[0] == "kernels":
        return "kernels"
    return parts[1] if parts[0] == "src" and len(parts) > 2 else None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    os.chdir(root)
    bad = []
    for top in ("src", "kernels"):
        for d, _, files in os.walk(top):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(d, f)
                me = layer_of(path)
                if me not in RANK:
                    continue
                with open(path, errors="replace") as src:
                    for n, line in enumerate(src, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in RANK:
                            continue
                        to = m.group(1)
                        if RANK[to] > RANK[me] or (me, to) in FORBIDDEN:
                            bad.append(f"{path}:{n}: layer {me} includes {to}/ ({line.strip()})")
    for b in bad:
        print(b)
    print(f"layers: {len(bad)} upward include(s)" if bad else "layers: every include points downward")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
