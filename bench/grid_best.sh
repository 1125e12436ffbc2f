# Sourced by the benchmarks that run a grid of configurations (plan_gpu.sh, plan_grid.sh):
# record_config prints a configuration's JSON line and keeps the fastest that fitted in `best` (its
# ms per step; null while none has) and `best_config`.
best=null best_config=""
record_config() {  # config, ms per step (null: it did not fit)
  local config=$1 ms=$2
  echo "{\"config\": \"$config\", \"step_ms\": $ms}"
  if [ "$ms" != null ] && { [ "$best" = null ] || python3 -c "import sys; sys.exit(not $ms < $best)"; }; then
    best=$ms best_config=$config
  fi
}
