#!/usr/bin/env bash
# Memory per rank of a real model under `single` and `pipe` over 2 and 4 CPU processes, as fit
# itself reports it (DESIGN decision 43): each rank's parameters, gradients and optimizer state,
# the first step's measured peak above them (activations, gradients, workspace, in exact tensor
# bytes), their total, and the process's peak resident set at the end; beside the ideal share,
# single's total / stages. One optimizer step on uniform random tokens; every process builds only
# its own stages' layers. One JSON line per rank.
#   bench/stage_memory.sh MODEL SIZE PRECISION [extra fit flags...]
#   e.g. bench/stage_memory.sh gpt2 350M 32-true; bench/stage_memory.sh llama llama3.2-1b bf16-true
# CLI (default build/apps/pipetrain/pipetrain) is the pipetrain to run; B x T (default 1 x 256)
# the batch, in 1 micro-batch (--chunks 1: the activations of one). DDP=1 adds `ddp` over 2
# replicas (B x T each) without and with --zero-stage 1 (layouts "ddp2", "ddp2-zero1"; of_single
# is then against plain ddp's).
set -euo pipefail
CLI=${CLI:-build/apps/pipetrain/pipetrain}
model=$1 size=$2 precision=$3
shift 3
B=${B:-1} T=${T:-256}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/train.bin" "$model" "$((B * (T + 1) * 4))" <<'PY'
import random, struct, sys
path, model, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
random.seed(0)
with open(path, "wb") as f:
    if model == "gpt2":  # nanoGPT's uint16 tokens
        f.write(struct.pack("<%dH" % count, *(random.randrange(50257) for _ in range(count))))
    else:  # llm.c's Llama 3 shard: 256 int32 (magic, version 7, count), uint32 tokens
        f.write(struct.pack("<256i", 20240801, 7, count, *([0] * 253)))
        f.write(struct.pack("<%dI" % count, *(random.randrange(32000) for _ in range(count))))
PY
run() {  # run NAME fit-flags...
  local name=$1
  shift
  "$CLI" fit --model "$model" --model-size "$size" --precision "$precision" \
    --train-data "$dir/train.bin" --batch-size "$B" --block-size "$T" --max-steps 1 \
    --accelerator cpu --logger csv --enable-progress-bar false --enable-checkpointing false \
    --num-sanity-val-steps 0 --default-root-dir "$dir/run.$name" "$@" >"$dir/out.$name" 2>&1 || {
    cat "$dir/out.$name"
    exit 1
  }
}
layouts="1 2 4"
run 1 --strategy single "$@"
run 2 --strategy pipe --devices 2 "$@"
run 4 --strategy pipe --devices 4 "$@"
if [ "${DDP:-0}" = 1 ]; then
  run ddp2 --strategy ddp --devices 2 "$@"
  run ddp2-zero1 --strategy ddp --devices 2 --zero-stage 1 "$@"
  layouts="$layouts ddp2 ddp2-zero1"
fi
python3 - "$dir" "$model" "$size" "$precision" $layouts <<'PY'
import json, re, sys
dir, model, size, precision = sys.argv[1:5]
reference = {}
for layout in sys.argv[5:]:
    stages = 2 if layout.startswith("ddp") else int(layout)
    text = open(f"{dir}/out.{layout}").read()
    table = text.split("memory per rank after the first step, MiB\n")[1].splitlines()[1:stages + 1]
    peak_line = text.split("peak memory per rank, MiB:")[1].splitlines()[0]
    peaks = [int(mib) for rank, mib in re.findall(r"(\d+): (\d+)", peak_line)]
    rows = [[float(x) for x in line.split()[1:]] for line in table]
    # Against single's, or for ddp against plain ddp's (whose replicas each hold everything).
    kind = "ddp" if layout.startswith("ddp") else "pipe"
    reference.setdefault(kind, rows[0][4])
    for rank, (params, grads, state, first_step, total) in enumerate(rows):
        print(json.dumps({"model": model, "size": size, "precision": precision, "layout": layout,
                          "rank": rank, "parameters_mib": params, "gradients_mib": grads,
                          "optimizer_state_mib": state, "first_step_peak_mib": first_step,
                          "total_mib": total, "of_single": round(total / reference[kind], 3),
                          "ideal": round(1 / stages, 3) if kind == "pipe" else None,
                          "peak_rss_mib": peaks[rank]}))
PY
