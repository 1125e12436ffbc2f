#!/usr/bin/env bash
# The planner on one GPU, where a plan has one stage and chooses its chunks, schedule (on one rank
# gpipe holds every micro-batch, 1f1b one) and recompute mode: every schedule x chunks x checkpoint
# configuration trained under the same --max-memory (bench/lm_fit.sh,
# bf16-mixed; one over the limit is refused by fit before its first update), then --plan auto's
# choice. One JSON line per configuration, then the planner's: its plan and step against the best
# configuration that fits, and the ratio.
#   bench/plan_gpu.sh MODEL SIZE B T LIMIT     e.g. bench/plan_gpu.sh gpt2 124M 16 1024 16GiB
# STEPS (default 30) steps per run; CHUNKS (default "1 2 4 8"), SCHEDULES (default "gpipe 1f1b").
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1 size=$2 B=$3 T=$4 limit=$5
export STEPS=${STEPS:-30}
step_ms() {  # fit flags... -> the run's step in ms, or null where it did not fit
  local out
  out=$(bench/lm_fit.sh "$model" "$size" "$B" "$T" bf16-mixed --strategy pipe --devices 1 \
    --max-memory "$limit" "$@" 2>&1) || { echo null; return; }
  echo "$out" | head -1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["step_ms"])'
  echo "$out" | tail -n +2 >&2  # a plan's lines
}
source bench/grid_best.sh
for schedule in ${SCHEDULES:-gpipe 1f1b}; do
  for chunks in ${CHUNKS:-1 2 4 8}; do
    for checkpoint in never always; do
      [ "$schedule" = 1f1b ] && [ "$chunks" = 1 ] && continue  # gpipe's, on one rank
      ms=$(step_ms --schedule "$schedule" --chunks "$chunks" --checkpoint "$checkpoint")
      record_config "schedule $schedule chunks $chunks checkpoint $checkpoint" "$ms"
    done
  done
done
planned=$(step_ms --plan auto 2>"${TMPDIR:-/tmp}/plan_gpu_plan.txt")
plan=$(grep '^plan: ' "${TMPDIR:-/tmp}/plan_gpu_plan.txt" | sed 's/^plan: //' || true)
grep -E "^predicted step|the plan predicted" "${TMPDIR:-/tmp}/plan_gpu_plan.txt" || true
ratio=$(python3 -c "print('%.3f' % ($planned / $best) if '$planned' != 'null' and '$best' != 'null' else 'null')")
echo "{\"planner\": \"$plan\", \"step_ms\": $planned, \"best_in_grid\": \"$best_config\", \"best_step_ms\": $best, \"ratio\": $ratio, \"model\": \"$model $size\", \"B\": $B, \"T\": $T, \"max_memory\": \"$limit\"}"
