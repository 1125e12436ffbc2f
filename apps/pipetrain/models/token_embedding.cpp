#include "models/token_embedding.h"

#include <sstream>
#include <stdexcept>

namespace pipetrain::cli {

TokenPositionEmbeddingImpl::TokenPositionEmbeddingImpl(const TokenPositionEmbeddingOptions& options)
    : model_(options.model),
      block_size_(options.block_size),
      token_(register_module(options.token_name,
                             torch::nn::Embedding(options.vocab_size, options.n_embd))),
      position_(register_module(options.position_name,
                                torch::nn::Embedding(options.block_size, options.n_embd))),
      dropout_(register_module(options.dropout_name, torch::nn::Dropout(options.dropout))) {}

at::Tensor TokenPositionEmbeddingImpl::forward(const at::Tensor& ids) {
  if (ids.dim() != 2 || ids.scalar_type() != torch::kInt64) {
    std::ostringstream message;
    message << model_ << " takes token ids (int64) of shape [batch, time], got a "
            << ids.scalar_type() << " tensor of shape " << ids.sizes();
    throw std::invalid_argument(message.str());
  }
  const int64_t time = ids.size(1);
  if (time > block_size_) {
    throw std::invalid_argument("a sequence of " + std::to_string(time) +
                                " tokens is longer than " + model_ + "'s block size " +
                                std::to_string(block_size_) + " (--block-size)");
  }
  return dropout_(token_(ids) + position_(torch::arange(time, ids.options())));
}

}  // namespace pipetrain::cli
