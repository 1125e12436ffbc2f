#!/usr/bin/env bash
# The planner's choice (--plan auto) against a grid of hand-written pipelines on CPU processes:
# balance by parameter count (the default) or the planner's own, chunks 2, 4, 8, each schedule
# (interleaved1f1b and zbv with 2 stages per process; the planner's balance only where its stage
# count is the schedule's), checkpoint never or always; every configuration trained with the same --max-memory,
# those that do not fit it refused by fit before their first update. One JSON line per
# configuration (median step of the steps after the second, from ThroughputMonitor's
# train/steps_per_sec), then the planner's line: its plan, the best configuration that fits, each
# one's median step over REPEATS (default 3) more runs taken by turns, the ratio, and how long
# `pipetrain plan` took.
#   bench/plan_grid.sh DEVICES MAX_MEMORY model flags...
# e.g. bench/plan_grid.sh 2 64MiB --model llama --n-layer 4 --n-embd 256 --n-head 4 \
#        --n-kv-head 2 --intermediate-size 512 --block-size 128 --batch-size 8
# CLI (default build/apps/pipetrain/pipetrain) is the pipetrain to run; STEPS (default 8) steps.
# Tokens are bytes of a license text (vocabulary 256).
set -euo pipefail
CLI=${CLI:-build/apps/pipetrain/pipetrain} STEPS=${STEPS:-8}
devices=$1 limit=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$CLI" prepare-data --input /usr/share/common-licenses/GPL-3 --output "$dir" >/dev/null
common=(--train-data "$dir/train.bin" --vocab-size 256 --accelerator cpu --devices "$devices"
  --max-memory "$limit" --max-steps "$STEPS" --log-every-n-steps 1 --logger csv
  --enable-progress-bar false --enable-checkpointing false --num-sanity-val-steps 0 "$@")
step_ms() {  # name, fit flags... -> median ms per step, or "null" where the run did not fit
  local name=$1
  shift
  "$CLI" fit "${common[@]}" --strategy pipe --default-root-dir "$dir/$name" "$@" \
    >"$dir/$name.out" 2>&1 || { echo null; return; }
  python3 - "$dir/$name/lightning_logs/version_0/metrics.csv" <<'PY'
import csv, statistics, sys
rates = [float(r["train/steps_per_sec"]) for r in csv.DictReader(open(sys.argv[1]))
         if r.get("train/steps_per_sec")]
print("%.1f" % (1e3 / statistics.median(rates[2:] or rates)))
PY
}
start=$(date +%s.%N)
"$CLI" plan "${common[@]}" --stages "$devices" >"$dir/plan.out" 2>&1
planning_s=$(python3 -c "import time; print('%.1f' % (time.time() - $start))")
plan=$(grep '^plan: ' "$dir/plan.out" | sed 's/^plan: //')
planned_balance=$(echo "$plan" | awk '{print $2}')
planned=$(step_ms planned --plan auto)
source "$(dirname "$0")/grid_best.sh"
for balance in params "$planned_balance"; do
  for chunks in 2 4 8; do
    for schedule in gpipe 1f1b zbh1 zbh2 interleaved1f1b zbv; do
      virtual=1
      case $schedule in interleaved1f1b | zbv) virtual=2 ;; esac
      if [ "$balance" != params ] && [ "$(echo "$balance" | tr ',' '\n' | wc -l)" != $((devices * virtual)) ]; then
        continue
      fi
      for checkpoint in never always; do
        flags=(--chunks "$chunks" --schedule "$schedule" --checkpoint "$checkpoint"
          --virtual-stages "$virtual")
        [ "$balance" = params ] || flags+=(--balance "$balance")
        ms=$(step_ms "grid_${balance//,/-}_${chunks}_${schedule}_$checkpoint" "${flags[@]}")
        record_config "balance $balance chunks $chunks schedule $schedule checkpoint $checkpoint" "$ms"
      done
    done
  done
done
# The smallest of many noisy steps is lower than its configuration's typical step: the best of the
# grid and the planner's plan run again, by turns, REPEATS times each, and compare by their medians.
best_flags=()
read -r -a words <<<"$best_config"
[ "${words[1]:-params}" = params ] || best_flags+=(--balance "${words[1]}")
best_flags+=(--chunks "${words[3]:-1}" --schedule "${words[5]:-gpipe}" --checkpoint "${words[7]:-never}")
case ${words[5]:-gpipe} in interleaved1f1b | zbv) best_flags+=(--virtual-stages 2) ;; esac
again_best=() again_planned=()
for ((i = 0; i < ${REPEATS:-3}; ++i)); do
  [ "$best" = null ] || again_best+=("$(step_ms "again_best_$i" "${best_flags[@]}")")
  again_planned+=("$(step_ms "again_planned_$i" --plan auto)")
done
median() { printf '%s\n' "$@" | grep -v null | sort -n | awk '{a[NR]=$1} END {print NR ? a[int((NR + 1) / 2)] : "null"}'; }
best=$(median "${again_best[@]}" null) planned=$(median "${again_planned[@]}")
ratio=$(python3 -c "print('%.3f' % ($planned / $best) if '$planned' != 'null' and '$best' != 'null' else 'null')")
echo "{\"planner\": \"$plan\", \"step_ms\": $planned, \"best_in_grid\": \"$best_config\", \"best_step_ms\": $best, \"ratio\": $ratio, \"planning_s\": $planning_s, \"devices\": $devices, \"max_memory\": \"$limit\"}"
