#!/usr/bin/env python3
"""Llama 3 and Qwen3 read from a Hugging Face folder and run forward, written out in PyTorch after
transformers' modeling_llama.py and modeling_qwen3.py (eager attention): RMSNorm in fp32 and cast
back before the weight, rotate-half RoPE of kind default or llama3 (modeling_rope_utils.py), grouped
key/value heads by repeat_kv, SwiGLU, Qwen3's per-head q/k RMSNorm before the rotation, a tied or
separate head. It shares no code with pipetrain and needs only torch and the standard library (no
transformers, no safetensors package), so pipetrain's reading and writing of these folders is
checked against a second reading of the layout.

  llama_reference.py logits DIR [--dtype float32|bfloat16] (TOKEN... | --tokens-file FILE)
      prints the logits as JSON (the last line): rows [T][vocab] for one sequence, [B][T][vocab]
      for a file holding several
  llama_reference.py loss DIR [--dtype ...] (TOKEN... | --tokens-file FILE)
      prints {"loss": ...}: the mean cross-entropy of each token's logits against the next token
      (transformers' labels = input_ids)
  llama_reference.py write DIR [--model-type llama|qwen3] [--rope-spelling v4|v4-type|v5]
                           [--rope-type default|llama3] [--tied] [--attention-bias]
                           [--max-shard-bytes N] [--dtype float32|bfloat16] [--seed N]
                           [--layers N] [--hidden N] [--heads N] [--kv-heads N] [--head-dim N]
                           [--intermediate N] [--vocab N]
      writes a small model of random weights: config.json in transformers 4's RoPE spelling (v4:
      top-level rope_theta and rope_scaling with rope_type; v4-type: the older "type" key) or 5's
      (v5: rope_parameters), and its safetensors, in shards named by model.safetensors.index.json
      when they exceed --max-shard-bytes

A token file is JSON: a list of ids, or a list of such lists (a batch).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
COMPUTE = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# --- reading ---------------------------------------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + length])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + length + begin:8 + length + end])
        dtype = DTYPES[info["dtype"]]
        if raw:
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(info["shape"])
        else:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
    return tensors


def read_weights(folder):
    """Every tensor of the folder: model.safetensors, else the shards its index names."""
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(folder, shard)))
    missing = set(weight_map) - set(tensors)
    if missing:
        sys.exit("llama_reference.py: the shards lack %s" % sorted(missing))
    return tensors


class Config:
    """What the forward needs of config.json, with transformers' defaults (LlamaConfig,
    Qwen3Config) for keys left out."""

    def __init__(self, raw):
        self.model_type = raw["model_type"]
        if self.model_type not in ("llama", "qwen3"):
            sys.exit("llama_reference.py: model_type %s is not llama or qwen3" % self.model_type)
        qwen3 = self.model_type == "qwen3"
        self.hidden = raw["hidden_size"]
        self.layers = raw["num_hidden_layers"]
        self.heads = raw["num_attention_heads"]
        self.kv_heads = raw.get("num_key_value_heads") or (32 if qwen3 else self.heads)
        self.head_dim = raw.get("head_dim") or (128 if qwen3 else self.hidden // self.heads)
        self.eps = raw.get("rms_norm_eps", 1e-6)
        self.tied = raw.get("tie_word_embeddings", False)
        self.attention_bias = raw.get("attention_bias", False)
        self.qk_norm = qwen3
        # transformers 5: rope_parameters (rope_theta inside); 4: rope_theta and rope_scaling.
        if raw.get("rope_parameters") is not None:
            rope = dict(raw["rope_parameters"])
            self.rope_theta = rope.get("rope_theta") or raw.get("rope_theta", 10000.0)
        else:
            rope = dict(raw.get("rope_scaling") or {})
            self.rope_theta = raw.get("rope_theta", 10000.0)
        self.rope_type = rope.get("rope_type", rope.get("type", "default"))
        if self.rope_type not in ("default", "llama3"):
            sys.exit("llama_reference.py: rope_type %s is not default or llama3" % self.rope_type)
        self.rope = rope


def inverse_frequencies(config):
    """modeling_rope_utils: _compute_default_rope_parameters, _compute_llama3_parameters."""
    dim, base = config.head_dim, config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if config.rope_type == "default":
        return inv_freq
    factor = config.rope["factor"]
    low_freq_factor = config.rope["low_freq_factor"]
    high_freq_factor = config.rope["high_freq_factor"]
    old_context_len = config.rope["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rms_norm(x, weight, eps):
    """LlamaRMSNorm / Qwen3RMSNorm: normalised in fp32, rounded back, then scaled."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    batch, kv_heads, length, head_dim = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, head_dim)
    return x.reshape(batch, kv_heads * n_rep, length, head_dim)


def linear(x, w, name):
    bias = w.get(name + ".bias")
    return torch.nn.functional.linear(x, w[name + ".weight"], bias)


def forward(config, w, ids, dtype):
    """Logits [B, T, vocab] of token ids [B, T], every tensor in `dtype` (as a model loaded with
    torch_dtype=dtype computes)."""
    batch, length = ids.shape
    x = w["model.embed_tokens.weight"][ids]
    # LlamaRotaryEmbedding.forward: fp32 angles inv_freq x positions, cos and sin cast to dtype.
    positions = torch.arange(length)[None, :]
    inv_freq = inverse_frequencies(config)[None, :, None].float().expand(batch, -1, 1)
    freqs = (inv_freq @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]
    causal = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype).triu(1)
    scaling = config.head_dim ** -0.5
    for layer in range(config.layers):
        p = "model.layers.%d." % layer
        residual = x
        h = rms_norm(x, w[p + "input_layernorm.weight"], config.eps)
        q = linear(h, w, p + "self_attn.q_proj").view(batch, length, -1, config.head_dim)
        k = linear(h, w, p + "self_attn.k_proj").view(batch, length, -1, config.head_dim)
        v = linear(h, w, p + "self_attn.v_proj").view(batch, length, -1, config.head_dim)
        if config.qk_norm:  # Qwen3Attention: per head, before the rotation
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], config.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], config.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = config.heads // config.kv_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling + causal
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        attention = torch.matmul(probs, v).transpose(1, 2).reshape(batch, length, -1)
        x = residual + linear(attention, w, p + "self_attn.o_proj")
        residual = x
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], config.eps)
        gate = torch.nn.functional.silu(linear(h, w, p + "mlp.gate_proj"))
        x = residual + linear(gate * linear(h, w, p + "mlp.up_proj"), w, p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], config.eps)
    head = w["model.embed_tokens.weight"] if config.tied else w["lm_head.weight"]
    return torch.nn.functional.linear(x, head)


def load(folder, dtype):
    with open(os.path.join(folder, "config.json")) as f:
        config = Config(json.load(f))
    weights = {name: t.to(dtype) for name, t in read_weights(folder).items()}
    return config, weights


def token_batch(args):
    if args.tokens_file:
        with open(args.tokens_file) as f:
            ids = json.load(f)
    else:
        ids = [int(t) for t in args.tokens]
    if not ids:
        sys.exit("llama_reference.py: no tokens given")
    single = not isinstance(ids[0], list)
    return torch.tensor([ids] if single else ids, dtype=torch.int64), single


def run(args):
    dtype = COMPUTE[args.dtype]
    config, weights = load(args.dir, dtype)
    ids, single = token_batch(args)
    with torch.no_grad():
        logits = forward(config, weights, ids, dtype).float()
    if args.command == "logits":
        print(json.dumps((logits[0] if single else logits).tolist()))
    else:
        vocab = logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                                                 ids[:, 1:].reshape(-1))
        print(json.dumps({"loss": loss.item()}))


# --- writing ---------------------------------------------------------------------------------

def tensor_bytes(tensor):
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes()


def write_safetensors(path, tensors):
    header = {"__metadata__": {"format": "pt"}}
    chunks, offset = [], 0
    for name, tensor in tensors.items():
        raw = tensor_bytes(tensor)
        header[name] = {"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def shards_of(tensors, max_bytes):
    """save_pretrained's split: in order, a new shard when the next tensor would go past
    max_bytes; a tensor larger than that alone."""
    shards, current, size = [], None, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > max_bytes:
            shards.append({name: tensor})
            current = None
            continue
        if current is None or size + nbytes > max_bytes:
            current, size = {}, 0
            shards.append(current)
        current[name] = tensor
        size += nbytes
    return shards


def random_weights(args, generator):
    """Weights of a size that keeps activations of order 1, norms away from 1, so that any tensor
    read into the wrong place changes the logits."""
    def normal(*shape, std):
        return torch.randn(*shape, generator=generator) * std

    def norm(dim):
        return 1.0 + normal(dim, std=0.3)

    hidden, head_dim = args.hidden, args.head_dim
    q_width, kv_width = args.heads * head_dim, args.kv_heads * head_dim
    w = {"model.embed_tokens.weight": normal(args.vocab, hidden, std=1.0)}
    for layer in range(args.layers):
        p = "model.layers.%d." % layer

        def add_linear(name, out, into, bias):
            w[p + name + ".weight"] = normal(out, into, std=into ** -0.5)
            if bias:
                w[p + name + ".bias"] = normal(out, std=0.1)

        add_linear("self_attn.q_proj", q_width, hidden, args.attention_bias)
        add_linear("self_attn.k_proj", kv_width, hidden, args.attention_bias)
        add_linear("self_attn.v_proj", kv_width, hidden, args.attention_bias)
        add_linear("self_attn.o_proj", hidden, q_width, args.attention_bias)
        if args.model_type == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        add_linear("mlp.gate_proj", args.intermediate, hidden, False)
        add_linear("mlp.up_proj", args.intermediate, hidden, False)
        add_linear("mlp.down_proj", hidden, args.intermediate, False)
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
    w["model.norm.weight"] = norm(hidden)
    if not args.tied:
        w["lm_head.weight"] = normal(args.vocab, hidden, std=hidden ** -0.5)
    return w


def config_of(args):
    qwen3 = args.model_type == "qwen3"
    config = {
        "architectures": ["Qwen3ForCausalLM" if qwen3 else "LlamaForCausalLM"],
        "model_type": args.model_type,
        "attention_bias": args.attention_bias,
        "hidden_act": "silu",
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "max_position_embeddings": 128,
        "num_attention_heads": args.heads,
        "num_hidden_layers": args.layers,
        "num_key_value_heads": args.kv_heads,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": args.tied,
        "vocab_size": args.vocab,
    }
    # Llama 3.0's configs leave head_dim out when it is hidden_size / heads; Qwen3's always have it.
    if qwen3 or args.head_dim != args.hidden // args.heads:
        config["head_dim"] = args.head_dim
    theta = 10000.0
    # original_max_position_embeddings 64 against head_dim 8 or 16 puts RoPE frequencies in all
    # three of llama3's bands (kept, smoothed, slowed by factor).
    scaling = None
    if args.rope_type == "llama3":
        scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
    dtype = "bfloat16" if args.dtype == "bfloat16" else "float32"
    if args.rope_spelling == "v5":
        config["rope_parameters"] = dict(scaling or {}, rope_type=args.rope_type, rope_theta=theta)
        config["dtype"] = dtype
    else:
        key = "type" if args.rope_spelling == "v4-type" else "rope_type"
        config["rope_theta"] = theta
        config["rope_scaling"] = dict(scaling, **{key: "llama3"}) if scaling else None
        config["torch_dtype"] = dtype
    return config


def write(args):
    os.makedirs(args.dir, exist_ok=True)
    generator = torch.Generator().manual_seed(args.seed)
    weights = {name: t.to(COMPUTE[args.dtype]) for name, t in random_weights(args, generator).items()}
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(config_of(args), f, indent=2, sort_keys=True)
    shards = shards_of(weights, args.max_shard_bytes)
    if len(shards) == 1:
        write_safetensors(os.path.join(args.dir, "model.safetensors"), shards[0])
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_safetensors(os.path.join(args.dir, name), shard)
        weight_map.update({tensor: name for tensor in shard})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("logits", "loss"):
        command = commands.add_parser(name)
        command.add_argument("dir")
        command.add_argument("tokens", nargs="*")
        command.add_argument("--tokens-file")
        command.add_argument("--dtype", choices=sorted(COMPUTE), default="float32")
    command = commands.add_parser("write")
    command.add_argument("dir")
    command.add_argument("--model-type", choices=["llama", "qwen3"], default="llama")
    command.add_argument("--rope-spelling", choices=["v4", "v4-type", "v5"], default="v4")
    command.add_argument("--rope-type", choices=["default", "llama3"], default="llama3")
    command.add_argument("--tied", action="store_true")
    command.add_argument("--attention-bias", action="store_true")
    command.add_argument("--max-shard-bytes", type=int, default=5 * 10 ** 9)
    command.add_argument("--dtype", choices=sorted(COMPUTE), default="float32")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--layers", type=int, default=2)
    command.add_argument("--hidden", type=int, default=32)
    command.add_argument("--heads", type=int, default=4)
    command.add_argument("--kv-heads", type=int, default=2)
    command.add_argument("--head-dim", type=int, default=16)
    command.add_argument("--intermediate", type=int, default=48)
    command.add_argument("--vocab", type=int, default=64)
    # Token ids may follow --dtype too, which argparse alone leaves over.
    args, rest = parser.parse_known_args()
    if rest:
        if args.command == "write" or not all(t.lstrip("-").isdigit() for t in rest):
            parser.error("unrecognized arguments: %s" % " ".join(rest))
        args.tokens += rest
    if args.command == "write":
        write(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
