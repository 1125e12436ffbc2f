# What one Llama block written the torchtitan way in PyTorch (the block of the Llama peer
# benchmark: nn.RMSNorm, rotate-half RoPE, SDPA with GQA, SwiGLU, bf16 autocast) keeps for its
# backward, eager and under torch.compile: the allocator's live bytes after its forward less its
# input and output. bench/block_memory_bench prints pipetrain's block's figure.
#   PRESET=llama-150m B=16 T=1024 python3 bench/peer_block_memory.py
import json, os
import torch, torch.nn as nn, torch.nn.functional as F

PRESETS = {"llama-150m": (768, 12, 4, 2048), "llama3.2-1b": (2048, 32, 8, 8192),
           "llama3.2-3b": (3072, 24, 8, 8192)}  # dim, heads, kv heads, ffn
name = os.environ.get("PRESET", "llama-150m")
C, H, KV, FF = PRESETS[name]
B = int(os.environ.get("B", 16)); T = int(os.environ.get("T", 1024))
D = C // H if name != "llama3.2-3b" else 128
dev = torch.device("cuda", 0)

inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=dev).float() / D))
f = torch.outer(torch.arange(T, device=dev).float(), inv); e = torch.cat([f, f], -1)
cos, sin = e.cos(), e.sin()
def rotate_half(x): a, b = x.chunk(2, -1); return torch.cat([-b, a], -1)

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.RMSNorm(C, eps=1e-5); s.n2 = nn.RMSNorm(C, eps=1e-5)
        s.q = nn.Linear(C, H * D, bias=False); s.k = nn.Linear(C, KV * D, bias=False)
        s.v = nn.Linear(C, KV * D, bias=False); s.o = nn.Linear(H * D, C, bias=False)
        s.w1 = nn.Linear(C, FF, bias=False); s.w3 = nn.Linear(C, FF, bias=False)
        s.w2 = nn.Linear(FF, C, bias=False)
    def attn(s, x):
        b, t, _ = x.shape
        q = s.q(x).view(b, t, H, D).transpose(1, 2); k = s.k(x).view(b, t, KV, D).transpose(1, 2)
        v = s.v(x).view(b, t, KV, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin; k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return s.o(y.transpose(1, 2).reshape(b, t, H * D))
    def forward(s, x):
        x = x + s.attn(s.n1(x)); h = s.n2(x)
        return x + s.w2(F.silu(s.w1(h)) * s.w3(h))

def kept_mib(block):
    x = torch.randn(B, T, C, device=dev, requires_grad=True)
    for round in range(2):  # the first also compiles and makes autocast's weight copies
        torch.cuda.synchronize(); start = torch.cuda.memory_allocated()
        with torch.autocast("cuda", torch.bfloat16):
            out = block(x)
        torch.cuda.synchronize(); kept = torch.cuda.memory_allocated() - start - out.nbytes
        out.float().sum().backward()
        del out
    return kept / 2**20

block = Block().to(dev)
row = {"preset": name, "B": B, "T": T, "input_mib": B * T * C * 4 / 2**20,
       "eager_kept_mib": round(kept_mib(block), 1),
       "compiled_kept_mib": round(kept_mib(torch.compile(block)), 1)}
print(json.dumps(row))
