#!/usr/bin/env bash
# The two LoRA presets at their real sizes (issue 14), on a GPU host: configs/llama-8b-lora.json (Llama
# 3 8B, 4 ranks) and configs/sdxl-unet-lora.json (the SDXL UNet, as many ranks as there are GPUs, up
# to 5), each for a few steps from random base weights (make_inputs.py; the hosts cannot download the
# real ones). Prints each run's banner, steps, the engine's peak per rank and nvidia-smi's per GPU,
# then converts each checkpoint's adapter and loads the Llama one into transformers + PEFT
# (peft_load_check.py). Writes models/, data/, checkpoints and adapters under the repository root,
# where the presets' relative paths point, and logs under OUT_DIR.
# Usage: bench/lora_presets/run.sh BIN_DIR OUT_DIR
set -u
mkdir -p "$2"
B=$(realpath "$1") out=$(realpath "$2")
here=$(dirname "$(realpath "$0")")
cd "$here/../.."
gpus=$(nvidia-smi -L | grep -c '^GPU')
watch_mem() {  # NAME: samples every GPU's memory in use until peak_mem NAME
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 > "$out/smi_$1.csv" &
  SMI=$!
}
peak_mem() {
  kill "$SMI"
  awk -F', ' '{if ($2 > m[$1]) m[$1] = $2}
              END {for (g in m) printf "GPU %s peak %.2f GiB (nvidia-smi)\n", g, m[g] / 1024}' "$out/smi_$1.csv" | sort
}
summary() {  # LOG: the banner, plan, steps and per-rank peaks of one run
  grep -a "model llama\|model unet\|memory plan\|^step\|run done\|rror" "$1" | cut -c1-400
  for r in $(seq 0 $(($2 - 1))); do
    tail -1 "metrics-$r.jsonl" 2>/dev/null | grep -o '"peak_mem_gib":[0-9.]*' | sed "s/^/rank $r engine /"
  done
  rm -f metrics-*.jsonl
}
python3 "$here/make_inputs.py" . "$out/sdxl-unet-lora-random.json" | tail -1

ranks=4
watch_mem llama
mpirun -np $ranks --bind-to none "$B/zeropipe" train --config configs/llama-8b-lora.json --set training.max_steps=6 \
  --set checkpoint.dir=ck-llama-lora --set checkpoint.save_every=6 > "$out/llama.log" 2>&1
echo "llama-8b-lora, $ranks ranks: exit $?"
peak_mem llama
summary "$out/llama.log" $ranks
"$B/zeropipe" convert --from ck-llama-lora/step-00000006.h5 --to adapter-llama-lora | tail -1
python3 "$here/peft_load_check.py" models/Meta-Llama-3-8B-Instruct adapter-llama-lora 2>&1 | tail -1

ranks=$((gpus < 5 ? gpus : 5))
"$B/zeropipe" make-latents --out data/sdxl-latents.h5 --model "$out/sdxl-unet-lora-random.json" --samples 64 | tail -1
watch_mem sdxl
mpirun -np $ranks --bind-to none "$B/zeropipe" train --config "$out/sdxl-unet-lora-random.json" \
  --set training.max_steps=8 --set checkpoint.dir=ck-sdxl-lora --set checkpoint.save_every=8 > "$out/sdxl.log" 2>&1
echo "sdxl-unet-lora, $ranks ranks: exit $?"
peak_mem sdxl
summary "$out/sdxl.log" $ranks
"$B/zeropipe" convert --from ck-sdxl-lora/step-00000008.h5 --to adapter-sdxl-lora | tail -1
ls -l adapter-sdxl-lora
