# Weight-gradient GEMMs of one Linear over the 8192 rows of a batch: one addmm_ per micro-batch, per
# pair, per four, or one over all micro-batches joined (torch.cat included), and the bias gradient
# as a column sum plus an add or as one addmv_.
#   python3 bench/weight_gradient_join.py   (one GPU; results/gpu-raw/weight_gradient_join.txt)
import torch, time
dev = torch.device("cuda", 0); bf = torch.bfloat16
def t(fn, n=20):
    for _ in range(3): fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); e0.record()
    for _ in range(n): fn()
    e1.record(); torch.cuda.synchronize(); return e0.elapsed_time(e1) / n * 1000
for (i, o) in ((2048, 8192), (8192, 2048)):
    gw = torch.zeros(o, i, device=dev, dtype=bf); gb = torch.zeros(o, device=dev, dtype=bf)
    for rows in (256, 512, 1024):
        M = 8192 // rows
        xs = [torch.randn(rows, i, device=dev, dtype=bf) for _ in range(M)]
        gs = [torch.randn(rows, o, device=dev, dtype=bf) for _ in range(M)]
        ones = torch.ones(rows, device=dev, dtype=bf)
        per = t(lambda: [gw.addmm_(g.t(), x) for g, x in zip(gs, xs)])
        bias_sum = t(lambda: [gb.add_(g.sum(0)) for g in gs])
        bias_mv = t(lambda: [gb.addmv_(g.t(), ones) for g in gs])
        grouped = t(lambda: gw.addmm_(torch.cat(gs).t(), torch.cat(xs)))
        cat_only = t(lambda: (torch.cat(gs), torch.cat(xs)))
        pairs = t(lambda: [gw.addmm_(torch.cat(gs[k:k+2]).t(), torch.cat(xs[k:k+2])) for k in range(0, M, 2)])
        fours = t(lambda: [gw.addmm_(torch.cat(gs[k:k+4]).t(), torch.cat(xs[k:k+4])) for k in range(0, M, 4)])
        print(f"Linear({i},{o}) rows={rows} x{M}: wgrad per-mb {per:.0f} us, pairs {pairs:.0f}, fours {fours:.0f}, all grouped {grouped:.0f} (cat {cat_only:.0f}); "
              f"bias sum+add {bias_sum:.0f} us, addmv_ {bias_mv:.0f} us", flush=True)
