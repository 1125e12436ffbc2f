#!/usr/bin/env bash
# GPT-2 through `pipetrain fit` on one GPU: tokens/s and peak GPU memory, on uniform random tokens
# (throughput only), as ../shared/bench/peer/gpt2_peer.py measures the same model in PyTorch.
#   bench/gpt2_fit.sh [size=124M] [B=16] [T=1024] [precision=bf16-mixed] [extra fit flags...]
# CLI (default build-gpu/apps/pipetrain/pipetrain) is the pipetrain to run. The step time is the
# difference between a run of 5 + STEPS steps and one of 5 (start-up and warm-up cancel out);
# peak memory is nvidia-smi's memory.used during the longer run (the CUDA context included).
set -euo pipefail
size=${1:-124M} B=${2:-16} T=${3:-1024} precision=${4:-bf16-mixed}
shift $(($# < 4 ? $# : 4))
CLI=${CLI:-build-gpu/apps/pipetrain/pipetrain} STEPS=${STEPS:-20}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, $((B * T * 64)), dtype=np.uint16).tofile('$dir/train.bin')"
fit() {
  local steps=$1
  shift
  "$CLI" fit --model gpt2 --model-size "$size" --train-data "$dir/train.bin" --batch-size "$B" \
    --block-size "$T" --precision "$precision" --accelerator cuda --max-steps "$steps" --lr 6e-4 \
    --gradient-clip-val 1.0 --logger none --enable-progress-bar false --enable-checkpointing false \
    --num-sanity-val-steps 0 --default-root-dir "$dir/runs" "$@" >"$dir/out.txt" 2>&1 ||
    { cat "$dir/out.txt"; exit 1; }
}
now() { date +%s.%N; }
start=$(now); fit 5 "$@"; short=$(python3 -c "print($(now) - $start)")
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$dir/memory.txt" &
monitor=$!
start=$(now); fit $((5 + STEPS)) "$@"; long=$(python3 -c "print($(now) - $start)")
kill "$monitor"
peak=$(sort -n "$dir/memory.txt" | tail -1)
python3 -c "
step = ($long - $short) / $STEPS
print('{\"model_size\": \"$size\", \"B\": $B, \"T\": $T, \"precision\": \"$precision\", '
      '\"step_ms\": %.1f, \"tokens_per_s\": %.0f, \"peak_gib\": %.2f}' % (1e3 * step, $B * $T / step, $peak / 1024))"
