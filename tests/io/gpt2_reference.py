#!/usr/bin/env python3
"""GPT-2's forward written out in PyTorch from a Hugging Face folder (config.json and
model.safetensors in GPT2LMHeadModel's layout: Conv1D weights [in, out], lm_head tied to wte), so
that an export is checked against a reading of the layout that shares no code with pipetrain.

  gpt2_reference.py DIR TOKEN...   prints the logits of the token sequence as a JSON list of rows
"""
import json
import math
import sys

import torch

# The same reading of safetensors as the Llama reference's (this folder's llama_reference.py).
from llama_reference import read_safetensors


def main():
    folder, ids = sys.argv[1], [int(t) for t in sys.argv[2:]]
    config = json.load(open(folder + "/config.json"))
    w = {k.removeprefix("transformer."): v.float() for k, v in
         read_safetensors(folder + "/model.safetensors").items()}
    layers, heads, width = config["n_layer"], config["n_head"], config["n_embd"]
    eps = config["layer_norm_epsilon"]
    tokens = torch.tensor(ids)
    time = len(ids)
    x = w["wte.weight"][tokens] + w["wpe.weight"][torch.arange(time)]

    def norm(v, name):
        return torch.nn.functional.layer_norm(v, (width,), w[name + ".weight"], w[name + ".bias"], eps)

    def conv1d(v, name):  # Hugging Face's Conv1D: v @ W + b, W of [in, out]
        return v @ w[name + ".weight"] + w[name + ".bias"]

    causal = torch.tril(torch.ones(time, time, dtype=torch.bool))
    for i in range(layers):
        p = "h.%d." % i
        q, k, v = conv1d(norm(x, p + "ln_1"), p + "attn.c_attn").split(width, dim=-1)
        q, k, v = (z.view(time, heads, width // heads).transpose(0, 1) for z in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(width // heads)
        attention = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        x = x + conv1d(attention.transpose(0, 1).reshape(time, width), p + "attn.c_proj")
        hidden = conv1d(norm(x, p + "ln_2"), p + "mlp.c_fc")
        x = x + conv1d(torch.nn.functional.gelu(hidden, approximate="tanh"), p + "mlp.c_proj")
    logits = norm(x, "ln_f") @ w["wte.weight"].t()
    print(json.dumps(logits.tolist()))


main()
