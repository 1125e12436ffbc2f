#!/usr/bin/env bash
# A language model through `pipetrain fit` on one GPU: tokens/s, MFU and peak GPU memory, on
# uniform random tokens (throughput only), as ../shared/bench/peer/gpt2_peer.py and llama_peer.py
# measure the same models in PyTorch.
#   bench/lm_fit.sh MODEL [size] [B=16] [T=1024] [precision=bf16-mixed] [extra fit flags...]
# MODEL is gpt2 (size 124M by default; tokens below 50257, nanoGPT's uint16 file), llama or qwen3
# (size llama-150m / qwen3-0.6b; tokens below the preset's vocabulary, an llm.c Llama 3 shard of
# uint32).
# CLI (default build-gpu/apps/pipetrain/pipetrain) is the pipetrain to run, STEPS (default 60)
# the optimizer steps. Tokens/s is the median of ThroughputMonitor's windows of 10 steps
# (train/items_per_sec in metrics.csv; the device synchronised at each window's ends, the first
# 10 steps left out); MFU is its model FLOPs per second over PEAK_FLOPS (989e12, an H100/H200's
# dense bf16); peak_gib is nvidia-smi's largest memory.used during the run (the CUDA context and
# the caching allocator's reserve included), peak_allocated_gib the caching allocator's peak of
# allocated bytes as fit logs it (peak_memory_mib/rank_0): what the peers' max_memory_allocated
# reports. Under --plan the plan's lines follow the JSON.
set -euo pipefail
model=$1
shift
case $model in
  gpt2) default_size=124M ;;
  llama) default_size=llama-150m ;;
  qwen3) default_size=qwen3-0.6b ;;
  *) echo "lm_fit.sh: MODEL is gpt2, llama or qwen3, not '$model'" >&2; exit 2 ;;
esac
size=${1:-$default_size} B=${2:-16} T=${3:-1024} precision=${4:-bf16-mixed}
shift $(($# < 4 ? $# : 4))
CLI=${CLI:-build-gpu/apps/pipetrain/pipetrain} STEPS=${STEPS:-60} PEAK_FLOPS=${PEAK_FLOPS:-989e12}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$model" "$size" "$dir/train.bin" $((B * (T + 1) * (STEPS + 2))) <<'PY'
import sys, numpy as np
model, size, path, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
vocab = {"gpt2": 50257, "llama-150m": 32000, "qwen3": 151936}.get(model if model != "llama" else size, 128256)
tokens = np.random.default_rng(0).integers(0, vocab, count)
if model == "gpt2":
    tokens.astype(np.uint16).tofile(path)
else:  # llm.c's Llama 3 shard: 256 int32 of header (magic, version 7, count), uint32 tokens
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240801, 7, count)
    with open(path, "wb") as f:
        f.write(header.tobytes()); f.write(tokens.astype(np.uint32).tobytes())
PY
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$dir/memory.txt" &
monitor=$!
"$CLI" fit --model "$model" --model-size "$size" --train-data "$dir/train.bin" --batch-size "$B" \
  --block-size "$T" --precision "$precision" --accelerator cuda --max-steps "$STEPS" --lr 6e-4 \
  --gradient-clip-val 1.0 --logger csv --log-every-n-steps 10 --enable-progress-bar false \
  --enable-checkpointing false --num-sanity-val-steps 0 --default-root-dir "$dir/runs" "$@" \
  >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; kill "$monitor"; exit 1; }
kill "$monitor"
peak=$(sort -n "$dir/memory.txt" | tail -1)
python3 - "$dir/runs/lightning_logs/version_0/metrics.csv" <<PY
import csv, statistics, sys
metrics = list(csv.DictReader(open(sys.argv[1])))
rows = [r for r in metrics if r.get("train/items_per_sec")]
tokens = statistics.median(float(r["train/items_per_sec"]) for r in rows)
flops = statistics.median(float(r["train/flops_per_sec"]) for r in rows)
allocated = max(float(r["peak_memory_mib/rank_0"]) for r in metrics if r.get("peak_memory_mib/rank_0"))
print('{"model": "$model", "model_size": "$size", "B": $B, "T": $T, "precision": "$precision", "windows": %d, '
      '"step_ms": %.1f, "tokens_per_s": %.0f, "mfu": %.3f, "peak_gib": %.2f, "peak_allocated_gib": %.2f}'
      % (len(rows), 1e3 * $B * $T / tokens, tokens, flops / $PEAK_FLOPS, $peak / 1024, allocated / 1024))
PY
# Under --plan: the plan chosen and its predictions beside what the run measured.
grep -E "^plan:|^predicted step|the plan predicted" "$dir/out.txt" || true
