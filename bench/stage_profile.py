# Where a pipeline stage's GPU time goes per micro-batch: one stage of the reference model (8 blocks
# of Linear(2048,8192)-GELU-Linear(8192,2048)-LayerNorm, bf16) runs forward + backward over 8192
# rows as 8192/rows micro-batches, eagerly and as a replayed CUDA graph, with ordinary autograd
# gradient accumulation and with the fused kind (addmm_ into .grad; bias by a column sum). The
# torch profiler sums kernel time by kind. Then single GEMMs of each shape, timed alone.
#   python3 bench/stage_profile.py      (one GPU, PyTorch with CUDA; results/gpu-raw/stage_profile.txt)
import torch, torch.nn as nn, torch.nn.functional as F, sys, collections
from torch.profiler import profile, ProfilerActivity
D = 2048
dev = torch.device("cuda", 0)
torch.manual_seed(0)

class Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lin):
        ctx.save_for_backward(x); ctx.lin = lin
        return F.linear(x, lin.weight, lin.bias)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors; lin = ctx.lin
        g2 = g.reshape(-1, g.shape[-1]); x2 = x.reshape(-1, x.shape[-1])
        lin.weight.grad.addmm_(g2.t(), x2)
        lin.bias.grad.add_(g2.sum(0))
        return g @ lin.weight, None

class FL(nn.Module):
    def __init__(self, lin): super().__init__(); self.lin = lin
    def forward(self, x): return Fused.apply(x, self.lin)

def block(fused):
    a, b = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    if fused: a, b = FL(a), FL(b)
    return nn.Sequential(a, nn.GELU(), b, nn.LayerNorm(D))

def cat(name):
    n = name.lower()
    if "gemm" in n or "nvjet" in n or "cutlass" in n or "sm90" in n or "sm100" in n or "cublas" in n: return "gemm"
    if "gelu" in n: return "gelu"
    if "layer_norm" in n or "layernorm" in n: return "layernorm"
    if "reduce" in n: return "reduce"
    if "elementwise" in n or "vectorized" in n: return "elementwise"
    return "other:" + name[:60]

for fused in (False, True):
    stage = nn.Sequential(*[block(fused) for _ in range(8)]).to(dev, torch.bfloat16)
    for p in stage.parameters(): p.grad = torch.zeros_like(p)
    for rows in (256, 512, 1024, 2048, 8192):
        reps = 8192 // rows
        x = torch.randn(rows, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(rows, D, device=dev, dtype=torch.bfloat16)
        def one():
            stage(x).backward(g)
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): one()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph): one()
        def timed(fn, n=5):
            for _ in range(2): fn()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(); e0.record()
            for _ in range(n): fn()
            e1.record(); torch.cuda.synchronize(); return e0.elapsed_time(e1) / n
        eager = timed(lambda: [one() for _ in range(reps)])
        replay = timed(lambda: [graph.replay() for _ in range(reps)])
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps): graph.replay()
            torch.cuda.synchronize()
        tot = collections.Counter(); cnt = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot[cat(e.name)] += e.device_time; cnt[cat(e.name)] += 1
        kern = sum(tot.values()) / 1000
        print(f"fused={fused} rows={rows} x{reps}: eager {eager:.2f} ms, graph {replay:.2f} ms, kernels {kern:.2f} ms "
              f"({sum(cnt.values())//reps} kernels/mb)  per-mb graph {replay/reps:.3f} ms")
        for k, v in tot.most_common(8):
            print(f"    {k:40s} {v/1000:.2f} ms  n/mb={cnt[k]//reps}")
        del graph
        sys.stdout.flush()
    # GEMM shapes alone
    if not fused:
        for rows in (512, 8192):
            a = torch.randn(rows, D, device=dev, dtype=torch.bfloat16); w = torch.randn(4*D, D, device=dev, dtype=torch.bfloat16)
            h = torch.randn(rows, 4*D, device=dev, dtype=torch.bfloat16); gw = torch.zeros(4*D, D, device=dev, dtype=torch.bfloat16)
            gw32 = torch.zeros(4*D, D, device=dev, dtype=torch.float32)
            reps = 8192 // rows
            def t(fn):
                for _ in range(3): fn()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(); e0.record()
                for _ in range(20): fn()
                e1.record(); torch.cuda.synchronize(); return e0.elapsed_time(e1) / 20 * 1000
            def fp32(fn):
                try: return t(fn)
                except Exception as e: print("fp32 accumulate:", str(e)[:100]); return -1
            print(f"GEMM rows={rows}: fwd {t(lambda: a @ w.t()):.1f} us, dgrad {t(lambda: h @ w):.1f} us, "
                  f"wgrad addmm_ bf16 {t(lambda: gw.addmm_(h.t(), a)):.1f} us, wgrad mm {t(lambda: h.t() @ a):.1f} us, "
                  f"wgrad addmm_ fp32 {fp32(lambda: gw32.addmm_(h.t(), a)):.1f} us")
