#!/usr/bin/env bash
# Peak resident memory of the largest process when a Llama-style model trains on the CPU under
# `single` and under `pipe` over 2 and 4 processes, each process building only its own stages'
# layers (per-rank construction), against the ideal share (single's / stages); then under `ddp`
# over 2 replicas with the optimizer state whole on each and shared out (--zero-stage 1).
#   bench/rank_memory.sh [extra fit flags...]
# CLI (default build/apps/pipetrain/pipetrain) is the pipetrain to run. The model: 8 blocks of 768
# (12 / 4 heads, FFN 2048), vocabulary 32000, tied: 75.5 M parameters, fp32, AdamW; batch 4 x 128
# tokens, 4 micro-batches, 3 optimizer steps on uniform random tokens. Peak memory is GNU time's
# maximum resident set size, which over the launcher and the ranks it waits for is the largest
# process's.
set -euo pipefail
CLI=${CLI:-build/apps/pipetrain/pipetrain}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/train.bin" <<'PY'
import random, struct, sys
count = 4 * 129 * 8
random.seed(0)
with open(sys.argv[1], "wb") as f:  # llm.c's Llama 3 shard: 256 int32 (magic, version 7, count)
    f.write(struct.pack("<256i", 20240801, 7, count, *([0] * 253)))
    f.write(struct.pack("<%dI" % count, *(random.randrange(32000) for _ in range(count))))
PY
peak_mib() {  # peak_mib NAME fit-flags...
  local name=$1
  shift
  /usr/bin/time -f "%M" -o "$dir/$name.rss" "$CLI" fit --model llama --n-layer 8 --n-embd 768 \
    --n-head 12 --n-kv-head 4 --intermediate-size 2048 --vocab-size 32000 --block-size 128 \
    --train-data "$dir/train.bin" --batch-size 4 --max-steps 3 --accelerator cpu --logger csv \
    --enable-progress-bar false --enable-checkpointing false --num-sanity-val-steps 0 \
    --default-root-dir "$dir/$name" "$@" >"$dir/$name.out" 2>&1 || {
    cat "$dir/$name.out"
    exit 1
  }
  echo $(($(tail -1 "$dir/$name.rss") / 1024))
}
single=$(peak_mib single --strategy single "$@")
echo "{\"layout\": \"single\", \"peak_mib\": $single}"
for stages in 2 4; do
  pipe=$(peak_mib "pipe$stages" --strategy pipe --devices "$stages" --chunks 4 "$@")
  python3 -c "print('{\"layout\": \"pipe $stages\", \"peak_mib\": $pipe, \"of_single\": %.3f, \"ideal\": %.3f}' % ($pipe / $single, 1 / $stages))"
done
ddp=$(peak_mib ddp2 --strategy ddp --devices 2 "$@")
echo "{\"layout\": \"ddp 2\", \"peak_mib\": $ddp}"
zero=$(peak_mib ddp2_zero1 --strategy ddp --devices 2 --zero-stage 1 "$@")
python3 -c "print('{\"layout\": \"ddp 2, zero-stage 1\", \"peak_mib\": $zero, \"of_ddp\": %.3f}' % ($zero / $ddp))"
