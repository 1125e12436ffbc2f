"""transformers' generate on the shapes bench/generate_bench.cpp times: Llama 3.2 1B's config
(weights drawn at random), bf16 on one GPU, greedy, `batch` random prompts of PROMPT tokens, NEW
tokens each (no EOS). One JSON line per batch size, as generate_bench prints them.
  BATCHES=1,8,32 PROMPT=128 NEW=256 python3 bench/generate_peer.py
"""
import json
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCHES = [int(b) for b in os.environ.get("BATCHES", "1,8,32").split(",")]
PROMPT, NEW = int(os.environ.get("PROMPT", 128)), int(os.environ.get("NEW", 256))

config = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192},
                     max_position_embeddings=131072, tie_word_embeddings=True)
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()


def timed(ids, new):
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                   max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


for batch in BATCHES:
    ids = torch.randint(config.vocab_size, (batch, PROMPT), device="cuda")
    timed(ids, 8)
    first = timed(ids, 1)
    total = timed(ids, NEW)
    step_ms = 1e3 * (total - first) / (NEW - 1)
    print(json.dumps({"bench": "generate", "impl": "transformers", "preset": "llama3.2-1b",
                      "batch": batch, "prompt": PROMPT, "new": NEW,
                      "ttft_ms": round(1e3 * first, 2), "decode_ms_per_step": round(step_ms, 3),
                      "tokens_per_s": round(1e3 * batch / step_ms, 1)}), flush=True)
