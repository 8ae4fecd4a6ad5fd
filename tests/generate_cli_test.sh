#!/usr/bin/env bash
# `zeropipe generate` end to end on the CPU: the same completions at 1, 2 and 3 ranks, in input order
# (requests split across ranks and merged on rank 0), greedy or seeded sampling; weight streaming
# from host memory or NVMe gives the same tokens, and so does a KV cache too small for the job (its
# preempted sequences recomputed or swapped to host memory); a LoRA adapter merged at load equals the
# merged model; bad input names the file and line and exits 1 on every rank count.
# Usage: generate_cli_test.sh ZEROPIPE_BINARY SOURCE_DIR
set -u
bin=$1 src=$2
tmp=$(mktemp -d /tmp/zp_generate.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
model=$src/tests/golden/llama-tiny
fail() { echo "FAIL: $*"; exit 1; }
cat > "$tmp/in.jsonl" <<'JSONL'
{"input_ids": [5, 17, 3], "max_new_tokens": 12, "id": "a"}
{"input_ids": [200, 1, 2, 3, 4, 5, 6, 7, 8], "max_new_tokens": 5}
{"input_ids": [42], "temperature": 0.8, "top_p": 0.9, "seed": 3}

{"input_ids": [9, 9], "max_new_tokens": 3, "stop_token_ids": [9]}
{"input_ids": [1, 2, 3, 4, 5, 6, 7], "temperature": 1.0, "top_k": 20, "repetition_penalty": 1.3, "seed": 11}
JSONL
run() {  # run NP OUT [more options]
  local np=$1 out=$2
  shift 2
  mpirun --oversubscribe --bind-to none -np "$np" "$bin" generate --model "$model" --prompts "$tmp/in.jsonl" \
    --out "$out" --device cpu --max-new-tokens 10 "$@" > "$out.log" 2>&1
}
run 1 "$tmp/np1.jsonl" --metrics-file "$tmp/metrics.jsonl" || { cat "$tmp/np1.jsonl.log"; fail "np 1"; }
[ "$(wc -l < "$tmp/np1.jsonl")" -eq 5 ] || fail "5 output lines expected"
/usr/bin/python3 - "$tmp/np1.jsonl" "$tmp/metrics.jsonl" <<'PY' || fail "output checks"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["index"] for r in rows] == [0, 1, 2, 3, 4], rows
assert rows[0]["id"] == "a" and len(rows[0]["output_ids"]) == 12 and rows[0]["finish_reason"] == "length"
assert len(rows[1]["output_ids"]) == 5 and len(rows[2]["output_ids"]) == 10
r3 = rows[3]["output_ids"]
assert r3[-1] == 9 and rows[3]["finish_reason"] == "stop" or len(r3) == 3, rows[3]
assert all(r["prompt_tokens"] > 0 and r["time_to_first_token_ms"] > 0 for r in rows)
m = [json.loads(l) for l in open(sys.argv[2])]
assert m[-1]["event"] == "summary" and m[-1]["generated_tokens"] == sum(len(r["output_ids"]) for r in rows)
assert sum(x.get("decode_tokens", 0) + x.get("prefill_tokens", 0) for x in m[:-1]) > 0
PY
for np in 2 3; do
  run "$np" "$tmp/np$np.jsonl" || { cat "$tmp/np$np.jsonl.log"; fail "np $np"; }
done
run 1 "$tmp/offload.jsonl" --offload-param cpu || { cat "$tmp/offload.jsonl.log"; fail "offload"; }
# From NVMe: the swap file under a folder the command creates, unlinked at once, so nothing stays there.
run 2 "$tmp/nvme.jsonl" --offload-param nvme --nvme-path "$tmp/swap" || { cat "$tmp/nvme.jsonl.log"; fail "nvme"; }
[ -d "$tmp/swap" ] && [ -z "$(ls -A "$tmp/swap")" ] || fail "the swap folder should exist and be empty"
# Weights sharded ZeRO-3 style over the ranks (on their own, and in host memory), each rank told how
# much it holds; the same tokens. With one request on 3 ranks two ranks have none and only join.
for np in 2 3; do
  run "$np" "$tmp/shard$np.jsonl" --shard-weights || { cat "$tmp/shard$np.jsonl.log"; fail "shard np $np"; }
  grep -q "weights sharded over $np ranks" "$tmp/shard$np.jsonl.log" || { cat "$tmp/shard$np.jsonl.log"; fail "no shard banner"; }
done
run 2 "$tmp/shardcpu.jsonl" --shard-weights --offload-param cpu || { cat "$tmp/shardcpu.jsonl.log"; fail "shard + cpu"; }
head -1 "$tmp/in.jsonl" > "$tmp/one.jsonl"
mpirun --oversubscribe --bind-to none -np 3 "$bin" generate --model "$model" --prompts "$tmp/one.jsonl" \
  --out "$tmp/one.out" --device cpu --shard-weights > "$tmp/one.log" 2>&1 || { cat "$tmp/one.log"; fail "one request on 3 sharded ranks"; }
[ "$(head -1 "$tmp/np1.jsonl" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])')" = \
  "$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_ids"])' "$tmp/one.out")" ] ||
  fail "one request on 3 sharded ranks differs from np 1"
# A KV cache of 8 blocks of 4 tokens cannot hold the five requests at once: preempted sequences are
# recomputed, or with swap space moved to host memory and back; the same tokens either way.
for swap in 0 1MiB; do
  run 1 "$tmp/small$swap.jsonl" --block-size 4 --kv-cache-memory 16KiB --kv-swap-memory $swap \
    --metrics-file "$tmp/small$swap.metrics" || { cat "$tmp/small$swap.jsonl.log"; fail "small cache, swap $swap"; }
done
/usr/bin/python3 - "$tmp/small0.metrics" "$tmp/small1MiB.metrics" <<'PY' || fail "preemption checks"
import json, sys
recomputed, swapped = ([json.loads(l) for l in open(f)][-1] for f in sys.argv[1:])
assert recomputed["preemptions"] > 0 and recomputed["swapped_preemptions"] == 0, recomputed
assert swapped["swapped_preemptions"] == swapped["preemptions"] > 0, swapped
PY
run 1 "$tmp/tiny_swap.jsonl" --kv-swap-memory 100B && fail "a swap space smaller than one block was accepted"
grep -q -- "--kv-swap-memory" "$tmp/tiny_swap.jsonl.log" || { cat "$tmp/tiny_swap.jsonl.log"; fail "the error does not name --kv-swap-memory"; }
ids() { /usr/bin/python3 -c 'import json,sys; [print(json.loads(l)["index"], json.loads(l)["output_ids"]) for l in open(sys.argv[1])]' "$1"; }
for f in np2 np3 offload nvme shard2 shard3 shardcpu small0 small1MiB; do
  diff <(ids "$tmp/np1.jsonl") <(ids "$tmp/$f.jsonl") || fail "$f differs from np 1"
done
# Bad input: an unknown key, on every rank count, names the file and line.
printf '{"input_ids": [1]}\n{"input_ids": [1], "temprature": 0.5}\n' > "$tmp/bad.jsonl"
for np in 1 2; do
  mpirun --oversubscribe --bind-to none -np $np "$bin" generate --model "$model" --prompts "$tmp/bad.jsonl" \
    --out "$tmp/bad.out" --device cpu > "$tmp/bad.log" 2>&1
  rc=$?
  [ $rc -eq 1 ] || { cat "$tmp/bad.log"; fail "np $np: exit $rc for bad input, 1 expected"; }
  grep -q "bad.jsonl:2: unknown key \"temprature\"" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "no FILE:LINE error"; }
  [ ! -e "$tmp/bad.out" ] || fail "an output file was written for bad input"
done
# --lora: a PEFT adapter (the golden LoRA dump's adapter values, in PEFT's folder layout) merged as the
# weights load gives the same tokens as the base merged beforehand by `convert --merge-lora`, and other
# tokens than the base alone; an adapter for modules the base lacks is refused naming the module.
cat > "$tmp/make_peft.py" <<'PY'
# make_peft.py LORA_DUMP DIR: the dump's adapter values (input.lora.*) as a PEFT folder
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
def read(path):
    f = open(path, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
    return {k: (v, data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
def write(path, tensors):
    header, blobs, off = {}, [], 0
    for k, (v, b) in tensors.items():
        header[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
prefix = "input.lora."
t = {"base_model.model." + k[len(prefix):]: v for k, v in read(src + "/io.safetensors").items() if k.startswith(prefix)}
assert t, "no adapter tensors"
os.makedirs(dst)
write(dst + "/adapter_model.safetensors", t)
cfg = json.load(open(src + "/lora.json"))
json.dump({"peft_type": "LORA", "r": cfg["r"], "lora_alpha": cfg["alpha"], "lora_dropout": 0.0,
           "target_modules": cfg["target_modules"], "bias": "none", "task_type": "CAUSAL_LM",
           "fan_in_fan_out": "gpt2" in src}, open(dst + "/adapter_config.json", "w"))
PY
lora_check() {  # lora_check NAME: the golden NAME-tiny base with its LoRA dump's adapter
  local name=$1 base=$src/tests/golden/$1-tiny
  /usr/bin/python3 "$tmp/make_peft.py" "$base/lora" "$tmp/peft_$name" || fail "$name: writing the PEFT adapter"
  gen() {  # gen MODEL OUT [options]
    local m=$1 out=$2
    shift 2
    "$bin" generate --model "$m" --prompts "$tmp/in.jsonl" --out "$out" --device cpu --max-new-tokens 10 "$@" \
      > "$out.log" 2>&1 || { cat "$out.log"; fail "$name: generate $m $*"; }
  }
  gen "$base" "$tmp/base_$name.jsonl"
  gen "$base" "$tmp/lora_$name.jsonl" --lora "$tmp/peft_$name"
  "$bin" convert --merge-lora "$tmp/peft_$name" --from "$base" --to "$tmp/merged_$name" > "$tmp/merge.log" 2>&1 ||
    { cat "$tmp/merge.log"; fail "$name: convert --merge-lora"; }
  gen "$tmp/merged_$name" "$tmp/merged_$name.jsonl"
  diff <(ids "$tmp/merged_$name.jsonl") <(ids "$tmp/lora_$name.jsonl") || fail "$name: --lora differs from the merged model"
  ! diff -q <(ids "$tmp/base_$name.jsonl") <(ids "$tmp/lora_$name.jsonl") > /dev/null ||
    fail "$name: --lora gave the base's tokens"
}
lora_check llama
lora_check gpt2
/usr/bin/python3 - "$tmp/peft_llama" "$tmp/peft_bad" <<'PY' || fail "writing the mismatched adapter"
import os, shutil, struct, json, sys
shutil.copytree(sys.argv[1], sys.argv[2])
p = sys.argv[2] + "/adapter_model.safetensors"
b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = b[8:8 + n].replace(b"layers.0.self_attn.q_proj", b"layers.9.self_attn.q_proj")
open(p, "wb").write(b[:8] + h + b[8 + n:])
PY
run 1 "$tmp/lora_bad.jsonl" --lora "$tmp/peft_bad"
[ $? -eq 1 ] || fail "an adapter for a missing module was not refused"
grep -q "adapts module 'model.layers.9.self_attn.q_proj', but $model has no weight" "$tmp/lora_bad.jsonl.log" ||
  { cat "$tmp/lora_bad.jsonl.log"; fail "no error naming the module"; }
# chat: two turns around a /reset on the demo model (byte-level tokenizer, plain format, EOS ends a
# reply); each reply is streamed and ends with a blank line; greedy, so the same turn gets the same reply.
printf 'The license\n/reset\nThe license\n' | "$bin" chat --model "$src/tests/data/eval/demo-model" --device cpu \
  --max-new-tokens 24 > "$tmp/chat.out" 2> "$tmp/chat.err" || { cat "$tmp/chat.err"; fail "chat"; }
/usr/bin/python3 - "$tmp/chat.out" <<'PY' || fail "chat output"
import sys
text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
first, rest = text.split("(conversation reset)\n\n")
assert first.endswith("\n\n") and len(first.strip()) > 0, repr(first)
assert rest == first, (first, rest)
PY
echo "PASS"
