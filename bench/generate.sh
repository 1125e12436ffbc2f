#!/usr/bin/env bash
# Generation speed, pipetrain against transformers' generate, in one command on one GPU (Llama 3.2
# 1B's shape, bf16, greedy, prompts of 128 tokens, 256 new tokens, batches 1, 8 and 32). Builds
# generate_bench against the Python's PyTorch in build-gpu/ (as scripts/gpu-bench does). JSON lines
# go to $RESULTS/generate.jsonl (default build-gpu/results).
#   bench/generate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-build-gpu/results}
mkdir -p "$RESULTS"
if [ ! -f build-gpu/build.ninja ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
fi
ninja -C build-gpu generate_bench >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/{"card": "/; s/$/"}/' |
  tee "$RESULTS/generate.jsonl"
build-gpu/bench/generate_bench llama3.2-1b 1,8,32 128 256 | tee -a "$RESULTS/generate.jsonl"
BATCHES=1,8,32 PROMPT=128 NEW=256 python3 bench/generate_peer.py | tee -a "$RESULTS/generate.jsonl"
