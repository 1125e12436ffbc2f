// The first layer of the demo `gpt` model: token ids to token plus learned position
// embeddings.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace pipetrain::cli {

// What a model chooses of its TokenPositionEmbedding: the shape, the names its saved weights go
// by, and its own name in error messages.
struct TokenPositionEmbeddingOptions {
  std::string model;  // "the GPT", "GPT-2"
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // the longest sequence: the number of positions
  int64_t n_embd = 0;
  double dropout = 0.0;
  std::string token_name;     // the token embedding, [vocab_size, n_embd]
  std::string position_name;  // the position embedding, [block_size, n_embd]
  std::string dropout_name;   // the dropout after their sum
};

// Token ids [B, T] (int64, T <= block_size) -> dropout(token(ids) + position(0..T-1)), [B, T, C].
// It takes the ids themselves, so it is a model's first layer; anything else, or a longer sequence,
// is an std::invalid_argument that names the model.
class TokenPositionEmbeddingImpl : public torch::nn::Module {
 public:
  explicit TokenPositionEmbeddingImpl(const TokenPositionEmbeddingOptions& options);

  at::Tensor forward(const at::Tensor& ids);

  int64_t block_size() const { return block_size_; }
  // The token embedding, whose weight a tied LM head shares.
  const torch::nn::Embedding& token() const { return token_; }

 private:
  std::string model_;
  int64_t block_size_;
  torch::nn::Embedding token_, position_;
  torch::nn::Dropout dropout_;
};
TORCH_MODULE(TokenPositionEmbedding);

}  // namespace pipetrain::cli
