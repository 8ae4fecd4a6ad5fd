#!/usr/bin/env bash
# `zeropipe report` in a real browser. A short real run (the demo GPT-2 on the CPU, two ranks as two
# pipeline stages, so two metrics files, a bubble, the step-time breakdown, the stage link's send_recv
# among the communication kinds, and the config) is reported,
# and so is a file with every field the reader knows (per-rank arrays too); the distribution's headless
# Chromium opens both pages with the network blocked. Fails on any console message (a script error,
# a resource it tried to fetch), and unless the DOM Chromium built holds every chart as an <svg> with
# data points. Keeps the pages and a screenshot of the real run's in ARTEFACT_DIR.
# A missing browser is a failure, not a skip: launch/prepare-build.sh installs chromium-headless-shell.
# Usage: report_browser_test.sh ZEROPIPE_BINARY SOURCE_DIR ARTEFACT_DIR
set -u
bin=$1 src=$2 out=$3
tmp=$(mktemp -d /tmp/zp_report.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; exit 1; }

browser=$(command -v chromium-headless-shell || command -v chromium || true)
[ -n "$browser" ] || fail "no headless Chromium on PATH (apt-get install chromium-headless-shell)"
mkdir -p "$out"
rm -f "$out"/*.html "$out"/*.png
cd "$src"

mpirun --oversubscribe --bind-to none -np 2 "$bin" train --config configs/demo-tiny.json \
  --set training.device=cpu --set training.max_steps=60 --set training.eval_every=10 --set steps_per_print=20 \
  --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2 --set pipeline.stages=2 \
  --set data.seq_len=32 --set "training.metrics_file=\"$tmp/metrics.jsonl\"" > "$tmp/train.log" 2>&1 ||
  fail "the training run failed"
"$bin" report "$tmp/metrics.jsonl" "$tmp/metrics.jsonl.1" --out "$out/report.html" > "$tmp/report.log" 2>&1 ||
  fail "zeropipe report failed on the run's files"

# Every field the reader knows, as the step-time telemetry writes it: two ranks, 30 steps.
python3 - "$tmp/full.jsonl" <<'PY' || fail "could not write the full metrics file"
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"event": "start", "world": 2, "banner": ["rank 0: host <a&b>, cpu"],
                        "config": {"note": "<script>alert('x')</script> & \"q\""}}) + "\n")
    for s in range(1, 31):
        f.write(json.dumps({"step": s, "loss": 5 - 0.1 * s, "lr": 1e-3, "grad_norm": 1.0, "mfu": 0.3,
                            "peak_mem_gib": 1.0, "step_ms": 100, "tokens_per_s": 5000, "comm_busy_ms": 20,
                            "breakdown": {"data_ms": 5, "forward_backward_ms": 80, "forward_ms": 30,
                                          "backward_ms": 50, "optimizer_ms": 10, "comm_busy_ms": 20,
                                          "exposed_comm_ms": 10, "other_ms": 5,
                                          "comm_busy_by_kind_ms": {"all_gather": 8, "reduce_scatter": 7,
                                                                   "all_reduce": 0, "send_recv": 5}},
                            "per_rank": {"step_ms": [100, 104], "comm_busy_ms": [20, 31],
                                         "peak_mem_gib": [1.0, 1.2]},
                            "pipeline": {"bubble": 0.2, "theoretical_bubble": 0.25},
                            **({"val_loss": 5.2 - 0.1 * s} if s % 10 == 0 else {})}) + "\n")
        if s == 15:
            f.write(json.dumps({"event": "checkpoint", "step": 15, "path": "ck/step-15.h5", "seconds": 0.5,
                                "bytes": 10**6, "gb_per_s": 0.002}) + "\n")
PY
"$bin" report "$tmp/full.jsonl" --out "$out/report-full.html" > "$tmp/report-full.log" 2>&1 ||
  fail "zeropipe report failed on the full metrics file"

# open PAGE NAME [chromium options...]: the DOM Chromium built into $tmp/NAME.dom, its log into NAME.log.
open_page() {
  local page=$1 name=$2
  shift 2
  "$browser" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 --no-first-run \
    --host-resolver-rules="MAP * ~NOTFOUND" "$@" "file://$page" > "$tmp/$name.dom" 2> "$tmp/$name.log" ||
    fail "$browser failed on $page"
  # The page has no script: any console message is an error, a blocked fetch included.
  grep -E "CONSOLE|Uncaught|net::ERR|Failed to load" "$tmp/$name.log" && fail "console messages opening $page"
  return 0
}

# charts DOM ID... : each chart is an <svg> with at least two data points (polyline points or bars).
charts() {
  python3 - "$@" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
bad = []
for id in sys.argv[2:]:
    m = re.search(r'<svg id="%s"[^>]*>(.*?)</svg>' % re.escape(id), dom, re.S)
    if not m:
        bad.append(id + ": no svg"); continue
    points = sum(p.count(",") for p in re.findall(r'<polyline[^>]* points="([^"]*)"', m.group(1)))
    bars = len(re.findall(r'<rect class="bar"', m.group(1)))
    print(f"{id}: {points} points, {bars} bars")
    if points + bars < 2: bad.append(id + ": no data points")
if bad: sys.exit("charts missing data: " + "; ".join(bad))
PY
}

line_charts="loss-step loss-items lr grad-norm throughput mfu step-time memory bubble"
open_page "$out/report.html" run --dump-dom
charts "$tmp/run.dom" $line_charts breakdown comm-per-rank comm-exposed comm-kinds || fail "the run's report"
grep -q '<pre class="config">' "$tmp/run.dom" || fail "the run's config is not in the report"
grep -q "metrics.jsonl.1" "$tmp/run.dom" || fail "the second rank's file is not in the report"
open_page "$out/report-full.html" full --dump-dom
charts "$tmp/full.dom" $line_charts breakdown comm-per-rank comm-exposed comm-kinds || fail "the full report"
grep -q "<script" "$tmp/full.dom" && fail "a config string became a script element"
grep -q "ck/step-15.h5" "$tmp/full.dom" || fail "no checkpoint table"

open_page "$out/report.html" shot --screenshot="$out/report.png" --window-size=1400,2400
[ -s "$out/report.png" ] || fail "no screenshot"
echo "kept $out/report.html, $out/report-full.html and $out/report.png"
echo PASS
