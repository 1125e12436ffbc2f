"""pipetrain against transformers itself, on a GPU machine (needs torch with CUDA and transformers).

  python3 tests/gpu/transformers_check.py CLI OUT

For a LlamaForCausalLM (llama3 RoPE scaling, GQA, tied head) and a Qwen3ForCausalLM (q/k norms,
head_dim apart from hidden / heads, untied), made here with random weights and saved sharded:
1. `pipetrain validate --init-from` gives transformers' own loss on the same token windows;
2. a few steps of `pipetrain fit` from that folder on the GPU, `pipetrain export --format hf`,
   and transformers loads the export and gives the loss pipetrain validates the checkpoint at;
3. `pipetrain generate --prompt-ids` (three prompts of different lengths, one left-padded batch,
   its key/value cache) makes transformers' greedy `generate(do_sample=False)` tokens, each
   prompt run alone there, 64 new tokens, the same EOS (a model of the same shapes drawn at
   initializer_range 0.3, whose decided logits leave no near-ties for rounding to flip); so too
   for a GPT2LMHeadModel (learned positions, fused c_attn with biases, LayerNorms, tied head).
Everything in fp32 (TF32 off on both sides); tolerance relative 1e-5, tokens equal. One JSON line per check
goes to OUT/transformers_check.jsonl as it is made; exits non-zero when a check fails.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

CLI, OUT = sys.argv[1], sys.argv[2]
T, B, WINDOWS, VOCAB = 64, 4, 8, 70000  # a vocabulary above 65535: 32-bit token files
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def write_tokens(path, count, seed):
    """An llm.c Llama 3 shard: 256 int32 of header (magic, version 7, count), uint32 tokens."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, count).astype(np.uint32)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240801, 7, count)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    return tokens


def hf_loss(model_dir, cls, tokens):
    """Mean cross-entropy over pipetrain's validation windows (window i: tokens i T .. i T + T)."""
    model = cls.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
    windows = np.stack([tokens[i * T:i * T + T + 1] for i in range(WINDOWS)]).astype(np.int64)
    x = torch.from_numpy(windows[:, :-1]).cuda()
    y = torch.from_numpy(windows[:, 1:]).cuda()
    with torch.no_grad():
        logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()


def run(*args):
    result = subprocess.run([CLI, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pipetrain {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def val_loss(root):
    import csv
    path = os.path.join(root, "lightning_logs", "version_0", "metrics.csv")
    rows = [r for r in csv.DictReader(open(path)) if r.get("val_loss")]
    return float(rows[-1]["val_loss"])


def common(model_type, data, root):
    return ["--model", model_type, "--train-data", data, "--val-data", data, "--block-size", str(T),
            "--batch-size", str(B), "--accelerator", "cuda", "--precision", "32-true",
            "--logger", "csv", "--enable-progress-bar", "false", "--default-root-dir", root]


def check(name, expected, actual, results):
    relative = abs(actual - expected) / abs(expected)
    ok = relative <= 1e-5
    results.append({"check": name, "transformers": expected, "pipetrain": actual,
                    "relative": relative, "ok": ok})
    print(json.dumps(results[-1]), flush=True)
    with open(os.path.join(OUT, "transformers_check.jsonl"), "a") as f:
        f.write(json.dumps(results[-1]) + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp()
    data = os.path.join(work, "tokens.bin")
    tokens = write_tokens(data, WINDOWS * T + 1, seed=0)
    common_shape = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                        max_position_embeddings=4096)
    models = {
        "llama": (LlamaForCausalLM, LlamaConfig(
            **common_shape, tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            **common_shape, head_dim=64, tie_word_embeddings=False, rope_theta=1e6,
            rms_norm_eps=1e-6)),
    }
    results = []
    for model_type, (cls, config) in models.items():
        torch.manual_seed(0)
        folder = os.path.join(work, model_type)
        cls(config).save_pretrained(folder, max_shard_size="50MB")  # sharded, with the index
        check(f"{model_type}: validate --init-from", hf_loss(folder, cls, tokens),
              val_loss_of_validate(model_type, folder, data, os.path.join(work, model_type + "_val")),
              results)
        # Trained on the GPU, exported, read back by transformers.
        root = os.path.join(work, model_type + "_fit")
        run("fit", *common(model_type, data, root), "--init-from", folder, "--max-steps", "4",
            "--lr", "1e-3", "--limit-val-batches", "0", "--num-sanity-val-steps", "0")
        exported = os.path.join(work, model_type + "_export")
        run("export", "--format", "hf", "--model", model_type, "--init-from", folder,
            "--ckpt-path", "last", "--default-root-dir", root, "--output", exported,
            "--dtype", "fp32", "--max-shard-size", "50MB")
        after = os.path.join(work, model_type + "_after")
        run("validate", *common(model_type, data, after), "--init-from", folder,
            "--ckpt-path", glob.glob(os.path.join(root, "**", "last.ckpt"), recursive=True)[0],
            "--limit-val-batches", str(WINDOWS // B))
        check(f"{model_type}: export after fit", hf_loss(exported, cls, tokens), val_loss(after),
              results)
        check_generation(model_type, cls, config, work, results)
    # Positions for the longest prompt (8) and 64 new tokens.
    check_generation("gpt2", GPT2LMHeadModel,
                     GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=256, n_layer=4, n_head=8),
                     work, results)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


def check_generation(model_type, cls, config, work, results):
    config.initializer_range = 0.3
    torch.manual_seed(1)
    folder = os.path.join(work, model_type + "_generate")
    cls(config).save_pretrained(folder)
    model = cls.from_pretrained(folder, torch_dtype=torch.float32).cuda().eval()
    prompts = [[5, 9, 2, 33, 7, 1, 40, 41], [12], [30000, 30, 4, 17, 69999]]
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt]).cuda()
        made = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=64, pad_token_id=0)
        expected.append(made[0, len(prompt):].tolist())
    flags = [flag for prompt in prompts for flag in ("--prompt-ids", ",".join(map(str, prompt)))]
    lines = run("generate", "--init-from", folder, *flags, "--max-new-tokens", "64",
                "--accelerator", "cuda", "--dtype", "fp32").split()
    actual = [[int(t) for t in line.split(",")] for line in lines]
    results.append({"check": f"{model_type}: generate --prompt-ids", "transformers": expected,
                    "pipetrain": actual, "ok": actual == expected})
    print(json.dumps(results[-1]), flush=True)
    with open(os.path.join(OUT, "transformers_check.jsonl"), "a") as f:
        f.write(json.dumps(results[-1]) + "\n")


def val_loss_of_validate(model_type, folder, data, root):
    run("validate", *common(model_type, data, root), "--init-from", folder,
        "--limit-val-batches", str(WINDOWS // B))
    return val_loss(root)


main()
