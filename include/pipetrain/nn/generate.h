// Text out: tokens generated from a decoder (nn::decoder()'s Sequential, a Hugging Face Llama's or
// Qwen3's, or nn::gpt2()'s) with a key/value cache, for a batch of prompts of different lengths at
// once.
//
//   auto model = pipetrain::nn::decoder(config);   // its weights trained, or read
//   auto new_ids = pipetrain::nn::generate(model, {tokenizer.encode("Once upon")},
//                                          pipetrain::nn::GenerationOptions().max_new_tokens(32));
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace pipetrain {
class World;
}

namespace pipetrain::nn {

struct GenerationOptions {
  // Tokens made per prompt at the most.
  TORCH_ARG(int64_t, max_new_tokens) = 64;
  // 0: greedy (the most likely token, Hugging Face's do_sample=False); else sampling from the
  // softmax of logits / temperature, limited by top_k and top_p as Hugging Face's warpers limit it.
  TORCH_ARG(double, temperature) = 0.0;
  // The k most likely tokens alone; 0: all.
  TORCH_ARG(int64_t, top_k) = 0;
  // The fewest most likely tokens whose probabilities reach top_p; 1: all.
  TORCH_ARG(double, top_p) = 1.0;
  // Seeds the sampling (drawn on the CPU, so a seed gives the same tokens on any device).
  TORCH_ARG(uint64_t, seed) = 0;
  // A row stops after making one of these (generation_config.json's eos_token_id).
  TORCH_ARG(std::vector<int64_t>, eos_token_ids) = {};
  // Fills the left padding of shorter prompts (any id: padding is never attended to).
  TORCH_ARG(int64_t, pad_token_id) = 0;
  // Tokens are chosen among ids below vocab_limit alone; 0: every id of the head. A head padded
  // past its tokenizer's ids (GPT-2's 50304 rows for 50257 tokens) then never makes an id the
  // tokenizer lacks.
  TORCH_ARG(int64_t, vocab_limit) = 0;
};

// The next token of each row from its logits [B, V], as generate() chooses it: argmax where
// options.temperature() is 0, else drawn with `generator` (a CPU one) from the softmax of logits /
// temperature over the top_k most likely and the fewest most likely reaching top_p.
at::Tensor next_tokens(const at::Tensor& logits, const GenerationOptions& options,
                       at::Generator& generator);

// Called as each token is made: the prompt's index and the token.
using TokenCallback = std::function<void(size_t prompt, int64_t token)>;

// The tokens made after each of `prompts` (token ids, none empty), an EOS that stopped a row
// included. The prompts run as one batch, left-padded to the longest, each row with its own
// positions and its padding masked, so a row makes what it would make alone; a cache of
// longest prompt + max_new_tokens per row is allocated once. Runs on the model's device in its
// parameters' dtype, in eval mode (restored after), without gradients. `model`: nn::decoder()'s
// layers (Embedding, DecoderBlocks, RMSNorm, LMHead) or nn::gpt2()'s (Gpt2Embedding, Gpt2Blocks,
// LayerNorm, LMHead). Throws std::invalid_argument for another Sequential (naming the layer), an
// empty prompt, an id outside the vocabulary, more positions than GPT-2's block size, or options
// out of range.
std::vector<std::vector<int64_t>> generate(const torch::nn::Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options = {},
                                           const TokenCallback& on_token = nullptr);

// The same by a model whose layers are spread over the processes of `world` (a pipeline, as
// `pipe` places them: so that a model too big for one device can still be asked): each process
// passes `stage`, its run of consecutive layers, in rank order (rank 0's begins with the
// embedding, the last rank's ends with the final norm and the LM head), on its own device. Each
// decode step's activations pass from stage to stage and the last stage's choice comes back to
// all, so every process returns (and calls `on_token` with) the tokens one process would make.
// Every process calls it with the same prompts and options. A stage whose layers do not fit its
// place is refused on every process, naming the rank.
std::vector<std::vector<int64_t>> generate(const torch::nn::Sequential& stage, const World& world,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options = {},
                                           const TokenCallback& on_token = nullptr);

}  // namespace pipetrain::nn
