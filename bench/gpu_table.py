#!/usr/bin/env python3
"""Joins gpu_bench's RESULT lines with the peer benchmark's JSON (same machine, same command) into
the table of bench/RESULTS.md and the list of bench/results/gpu.json.

usage: gpu_table.py RESULTS_DIR OUTPUT_JSON
RESULTS_DIR holds single.txt and pipe.txt (gpu_bench output) and peer_1024.txt, peer_8192.txt
(torch_pipelining_bench.py output)."""
import json
import os
import sys


def results(path):
    with open(path) as f:
        return [json.loads(line[len("RESULT "):]) for line in f if line.startswith("RESULT ")]


def peer(path):
    text = open(path).read()
    start = text.index("{")
    end = text.index("\n}", start) + 2
    return json.loads(text[start:end])


def main():
    folder, output = sys.argv[1], sys.argv[2]
    rows = [r for name in ("single.txt", "pipe.txt", "ddp.txt")
            if os.path.exists(os.path.join(folder, name))
            for r in results(os.path.join(folder, name))]
    peers = {}
    for b in (1024, 8192):
        path = os.path.join(folder, f"peer_{b}.txt")
        if os.path.exists(path):
            peers[b] = peer(path)
    out = []
    notes = []
    print("| B | M | schedule | checkpoint | CUDA graphs | pipetrain ms | peer ms | speed-up vs peer | bound ms | step / bound | activations GiB (stage 0 / 1) | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = peers.get(r["B"], {})
        if r["schedule"] == "single":
            peer_s = p.get("single_s") if r["kind"] == "pipetrain" else None
        else:
            peer_s = p.get(f'{r["schedule"]}_m{r["M"]}_s_rank0') if r["checkpoint"] == "never" else None
        peer_ms = peer_s * 1e3 if peer_s else None
        stages = r.get("stages", [])
        peak = max([s["peak_gib"] for s in stages], default=r.get("peak_gib"))
        label = {"pipetrain": r["schedule"], "ddp": "ddp (2 replicas)"}.get(r["kind"],
                                                                        "plain libtorch loop")
        cells = [
            r["B"], r["M"], label, r["checkpoint"],
            ("yes" if r["cuda_graphs"] else "no") + (", fused acc." if r.get("fused") else ""),
            f'{r["step_ms"]:.2f}',
            f"{peer_ms:.2f}" if peer_ms else "",
            f'{peer_ms / r["step_ms"]:.2f}x' if peer_ms else "",
            f'{r["bound_ms"]:.2f}' if "bound_ms" in r else "",
            f'{r["step_ms"] / r["bound_ms"]:.2f}' if "bound_ms" in r else "",
            " / ".join(f'{s["activation_gib"]:.2f}' for s in stages),
            f"{peak:.2f}" if peak is not None else "",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
        entry = {"B": r["B"], "M": r["M"], "schedule": label, "checkpoint": r["checkpoint"],
                 "cuda_graphs": r["cuda_graphs"], "fused_accumulation": r.get("fused", False),
                 "step_ms": r["step_ms"],
                 "peer_step_ms": peer_ms, "peak_gib": peak}
        if r["kind"] == "ddp":
            notes.append(f'ddp: {r["step_ms"]:.2f} ms a step, {r["no_sync_step_ms"]:.2f} ms without '
                  f'averaging gradients: {r["step_ms"] - r["no_sync_step_ms"]:.2f} ms of all-reduce '
                  f'not hidden by backward ({r["buckets"]} buckets)')
        for key in ("bound_ms", "stages", "no_sync_step_ms", "buckets"):
            if key in r:
                entry[key] = r[key]
        out.append(entry)
    for note in notes:
        print(note)
    with open(output, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
