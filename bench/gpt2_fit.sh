#!/usr/bin/env bash
# GPT-2 through `pipetrain fit` on one GPU: tokens/s, MFU and peak GPU memory, on uniform random
# tokens (throughput only), as ../shared/bench/peer/gpt2_peer.py measures the same model in PyTorch.
#   bench/gpt2_fit.sh [size=124M] [B=16] [T=1024] [precision=bf16-mixed] [extra fit flags...]
# CLI (default build-gpu/apps/pipetrain/pipetrain) is the pipetrain to run, STEPS (default 60)
# the optimizer steps. Tokens/s is the median of ThroughputMonitor's windows of 10 steps
# (train/items_per_sec in metrics.csv; the device synchronised at each window's ends, the first
# 10 steps left out); MFU is its model FLOPs per second over PEAK_FLOPS (989e12, an H100/H200's
# dense bf16); peak memory is nvidia-smi's largest memory.used during the run (the CUDA context
# included, unlike a max_memory_allocated).
set -euo pipefail
size=${1:-124M} B=${2:-16} T=${3:-1024} precision=${4:-bf16-mixed}
shift $(($# < 4 ? $# : 4))
CLI=${CLI:-build-gpu/apps/pipetrain/pipetrain} STEPS=${STEPS:-60} PEAK_FLOPS=${PEAK_FLOPS:-989e12}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, $((B * (T + 1) * (STEPS + 2))), dtype=np.uint16).tofile('$dir/train.bin')"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$dir/memory.txt" &
monitor=$!
"$CLI" fit --model gpt2 --model-size "$size" --train-data "$dir/train.bin" --batch-size "$B" \
  --block-size "$T" --precision "$precision" --accelerator cuda --max-steps "$STEPS" --lr 6e-4 \
  --gradient-clip-val 1.0 --logger csv --log-every-n-steps 10 --enable-progress-bar false \
  --enable-checkpointing false --num-sanity-val-steps 0 --default-root-dir "$dir/runs" "$@" \
  >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; kill "$monitor"; exit 1; }
kill "$monitor"
peak=$(sort -n "$dir/memory.txt" | tail -1)
python3 - "$dir/runs/lightning_logs/version_0/metrics.csv" <<PY
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("train/items_per_sec")]
tokens = statistics.median(float(r["train/items_per_sec"]) for r in rows)
flops = statistics.median(float(r["train/flops_per_sec"]) for r in rows)
print('{"model_size": "$size", "B": $B, "T": $T, "precision": "$precision", "windows": %d, '
      '"step_ms": %.1f, "tokens_per_s": %.0f, "mfu": %.3f, "peak_gib": %.2f}'
      % (len(rows), 1e3 * $B * $T / tokens, tokens, flops / $PEAK_FLOPS, $peak / 1024))
PY
