#include "pipetrain/nn/embedding.h"

#include <torch/torch.h>

#include <stdexcept>

namespace pipetrain::nn {

EmbeddingImpl::EmbeddingImpl(const EmbeddingOptions& options_)
    : options(options_),
      weight(
          register_parameter("weight", torch::empty({options_.vocab_size(), options_.n_embd()}))) {
  torch::NoGradGuard no_grad;
  weight.normal_(0, 1);  // torch::nn::Embedding's default
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  if (at::isFloatingType(ids.scalar_type()) || at::isComplexType(ids.scalar_type()) ||
      ids.scalar_type() == torch::kBool) {
    throw std::invalid_argument(
        std::string("Embedding takes token ids (an integer tensor) and got ") +
        c10::toString(ids.scalar_type()) +
        ": it is a model's first layer, so the stage holding it must be the first");
  }
  return torch::embedding(weight, ids);
}

LMHeadImpl::LMHeadImpl(int64_t n_embd, int64_t vocab_size)
    : weight(register_parameter("weight", torch::empty({vocab_size, n_embd}))), tied_(false) {
  torch::NoGradGuard no_grad;
  weight.normal_(0, 0.02);
}

LMHeadImpl::LMHeadImpl(const Embedding& tied)
    // The embedding's own requires_grad: a frozen embedding stays frozen.
    : weight(register_parameter("weight", tied->weight, tied->weight.requires_grad())),
      tied_(true) {}

// at::linear, not pipetrain::linear: a tied weight's gradient has two sources on possibly two
// stages, which the pipe sums through autograd's gradient hooks, and fused accumulation fires none.
at::Tensor LMHeadImpl::forward(const at::Tensor& x) { return at::linear(x, weight); }

}  // namespace pipetrain::nn
