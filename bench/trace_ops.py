#!/usr/bin/env python3
"""What launched a GPU kernel, and where the GPU waited: reads a Kineto Chrome trace (as
lm_profile_bench writes) and prints
  - for each kernel whose name contains PATTERN, the chains of CPU operators (outermost first)
    that launched it, by total GPU time;
  - the GPU's idle gaps longer than GAP_US microseconds, with the CPU operator begun last of those
    running on any host thread when the gap began (what the GPU waited for), by total time; where
    none was running, the operators that ended last before the gap and began first after it (the
    host's own code ran between them);
  - per host thread, its time in operators, and the operators by self time (their time less
    their children's).
  python3 bench/trace_ops.py TRACE.json [PATTERN=direct_copy] [GAP_US=20] [STEPS=5]
Times are per step (the trace's total over STEPS)."""
import bisect, collections, json, sys

path = sys.argv[1]
pattern = sys.argv[2] if len(sys.argv) > 2 else "direct_copy"
gap_us = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
runtime = {e["args"]["correlation"]: e for e in events
           if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
ops_by_thread = collections.defaultdict(list)
for e in events:
    if e.get("cat") == "cpu_op":
        ops_by_thread[e["tid"]].append(e)
for ops in ops_by_thread.values():
    ops.sort(key=lambda e: e["ts"])
starts = {tid: [e["ts"] for e in ops] for tid, ops in ops_by_thread.items()}


def enclosing(tid, ts):
    """The CPU operators running on thread tid at time ts, outermost first."""
    ops = ops_by_thread.get(tid, [])
    found = [e for e in ops[:bisect.bisect_right(starts.get(tid, []), ts)]
             if e["ts"] <= ts <= e["ts"] + e["dur"]]
    return [e["name"] for e in sorted(found, key=lambda e: (e["ts"], -e["dur"]))]


chains = collections.Counter()
for k in kernels:
    if pattern in k["name"]:
        launch = runtime.get(k.get("args", {}).get("correlation"))
        chain = enclosing(launch["tid"], launch["ts"]) if launch else ["(launch not found)"]
        chains[" > ".join(chain[-4:])] += k["dur"]
print(f"kernels containing '{pattern}', by the CPU operators that launched them (us per step):")
for chain, us in chains.most_common(25):
    print(f"{us / steps:9.1f}  {chain}")


def innermost(ts):
    """The operator begun last of those running at ts on any thread."""
    best = None
    for tid, ops in ops_by_thread.items():
        for e in reversed(ops[:bisect.bisect_right(starts[tid], ts)][-400:]):
            if e["ts"] + e["dur"] >= ts:
                if best is None or e["ts"] > best["ts"]:
                    best = e
                break
    return best["name"] if best else "(no operator)"


all_ops = sorted((e for ops in ops_by_thread.values() for e in ops), key=lambda e: e["ts"])
all_starts = [e["ts"] for e in all_ops]
ends = sorted(all_ops, key=lambda e: e["ts"] + e["dur"])
end_times = [e["ts"] + e["dur"] for e in ends]


def between(ts):
    """The operators that ended last before ts and began first after it, on any thread."""
    i = bisect.bisect_left(end_times, ts)
    j = bisect.bisect_right(all_starts, ts)
    before = ends[i - 1]["name"] if i > 0 else "(start)"
    after = all_ops[j]["name"] if j < len(all_ops) else "(end)"
    return f"between {before} and {after}"


gaps, waiting = collections.Counter(), 0.0
for before, after in zip(kernels, kernels[1:]):
    gap = after["ts"] - (before["ts"] + before["dur"])
    if gap > gap_us:
        name = innermost(before["ts"] + before["dur"])
        if name == "(no operator)":
            name = between(before["ts"] + before["dur"])
        gaps[name] += gap
        waiting += gap
print(f"\nGPU idle in gaps over {gap_us:g} us: {waiting / steps / 1e3:.2f} ms per step, by the "
      "CPU operator begun last of those running when each began (us per step):")
for name, us in gaps.most_common(25):
    print(f"{us / steps:9.1f}  {name}")

print("\nhost threads: time in top-level operators (ms per step), and operators by self time:")
self_time = collections.Counter()
for tid, ops in ops_by_thread.items():
    busy, open_ops = 0.0, []  # the stack of enclosing operators
    for e in ops:
        while open_ops and open_ops[-1]["ts"] + open_ops[-1]["dur"] <= e["ts"]:
            open_ops.pop()
        if open_ops:
            self_time[open_ops[-1]["name"]] -= e["dur"]
        else:
            busy += e["dur"]
        self_time[e["name"]] += e["dur"]
        open_ops.append(e)
    print(f"  thread {tid}: {busy / steps / 1e3:.2f} ms in {len(ops) // steps} operators")
for name, us in self_time.most_common(25):
    print(f"{us / steps:9.1f}  {name}")
