// The ends of a language model: token ids to vectors, and vectors back to logits over the
// vocabulary, the head optionally sharing the embedding's tensor (tied weights, which a pipe keeps
// equal when the two sit on different stages).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace pipetrain::nn {

struct EmbeddingOptions {
  EmbeddingOptions(int64_t vocab_size, int64_t n_embd) : vocab_size_(vocab_size), n_embd_(n_embd) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, n_embd);
};

// Token ids [B, T] (an integer dtype) -> weight[ids], [B, T, n_embd]. Its parameter is "weight",
// [vocab_size, n_embd], drawn N(0, 1) as torch::nn::Embedding's: redraw it smaller (decoder() uses
// N(0, 0.02)) where an LMHead is tied to it, or the first logits are large. Anything but integer
// ids is an std::invalid_argument saying that the embedding is a model's first layer.
class EmbeddingImpl : public torch::nn::Module {
 public:
  explicit EmbeddingImpl(const EmbeddingOptions& options);
  at::Tensor forward(const at::Tensor& ids);

  EmbeddingOptions options;
  at::Tensor weight;
};
TORCH_MODULE(Embedding);

// x [B, T, n_embd] -> logits x weight^T, [B, T, vocab_size], no bias. Its parameter is "weight",
// [vocab_size, n_embd]: its own, or, built from an Embedding, that embedding's tensor itself.
class LMHeadImpl : public torch::nn::Module {
 public:
  LMHeadImpl(int64_t n_embd, int64_t vocab_size);
  explicit LMHeadImpl(const Embedding& tied);
  at::Tensor forward(const at::Tensor& x);

  bool tied() const { return tied_; }
  at::Tensor weight;

 private:
  bool tied_;
};
TORCH_MODULE(LMHead);

}  // namespace pipetrain::nn
