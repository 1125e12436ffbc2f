// A decoder-only transformer of the Llama family (Llama 3, Qwen3 and any shape of one's own) as a
// Sequential a pipeline cuts between any two of its n_layer + 3 layers:
//   0          Embedding: token ids [B, T] -> [B, T, n_embd]                     ("weight")
//   1..n_layer DecoderBlock: h = x + self_attn(input_layernorm(x)),
//              then h + mlp(post_attention_layernorm(h))
//   n_layer+1  the final RMSNorm                                                 ("weight")
//   n_layer+2  LMHead -> logits [B, T, vocab_size], tied to layer 0 or its own   ("weight")
// Parameter names are Hugging Face's below the layer index ("3.self_attn.q_proj.weight",
// "3.mlp.gate_proj.weight", "3.input_layernorm.weight"), so a Hugging Face folder maps onto it
// name by name.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pipetrain/layer_spec.h>
#include <pipetrain/nn/attention.h>
#include <pipetrain/nn/mlp.h>
#include <pipetrain/nn/rms_norm.h>
#include <pipetrain/nn/rotary_embedding.h>

namespace pipetrain::nn {

struct DecoderBlockOptions {
  DecoderBlockOptions(CausalSelfAttentionOptions attention, SwiGLUOptions mlp)
      : attention_(std::move(attention)), mlp_(std::move(mlp)) {}
  TORCH_ARG(CausalSelfAttentionOptions, attention);
  TORCH_ARG(SwiGLUOptions, mlp);
  // Of the block's two RMSNorms (the attention's q/k norms take the attention options' own).
  TORCH_ARG(double, norm_eps) = 1e-6;
};

// Pre-norm, residual: one tensor in, one out, so a stage boundary between blocks carries a single
// [B, T, n_embd] activation.
class DecoderBlockImpl : public torch::nn::Module {
 public:
  explicit DecoderBlockImpl(const DecoderBlockOptions& options);
  at::Tensor forward(const at::Tensor& x);
  // The block over packed documents (pipetrain/nn/documents.h): `documents` [B, T] the document
  // index of each token; undefined: one document a row, as forward().
  at::Tensor forward_in_documents(const at::Tensor& x, const at::Tensor& documents);
  // The block over new tokens after those its attention's `cache` holds (pipetrain/nn/kv_cache.h).
  at::Tensor forward_cached(const at::Tensor& x, KVCache::Layer& cache, const CachedStep& step);

  DecoderBlockOptions options;
  RMSNorm input_layernorm{nullptr};
  CausalSelfAttention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  SwiGLU mlp{nullptr};

 private:
  // The block around `attend`, which takes input_layernorm's output to self_attn's.
  template <typename Attend>
  at::Tensor forward_with(const at::Tensor& x, const Attend& attend);
};
TORCH_MODULE(DecoderBlock);

// The shape of a decoder, with Hugging Face's config.json names in the comments.
struct DecoderConfig {
  int64_t vocab_size = 32000;           // vocab_size
  int64_t n_layer = 12;                 // num_hidden_layers
  int64_t n_embd = 768;                 // hidden_size
  int64_t n_head = 12;                  // num_attention_heads
  int64_t n_kv_head = 0;                // num_key_value_heads; 0: n_head
  int64_t head_dim = 0;                 // head_dim; 0: n_embd / n_head
  int64_t intermediate_size = 2048;     // intermediate_size
  int64_t block_size = 2048;            // the sequence length trained on
  int64_t max_position_embeddings = 0;  // the model's longest (config.json); 0: block_size
  double rms_norm_eps = 1e-5;           // rms_norm_eps
  bool tie_word_embeddings = false;     // tie_word_embeddings
  bool qk_norm = false;                 // Qwen3 (model_type "qwen3")
  bool attention_bias = false;          // attention_bias
  RotaryEmbeddingOptions rope;          // rope_theta, rope_scaling (head_dim is filled in)
  AttentionKernel attention_kernel = AttentionKernel::kSdpa;
  double init_std = 0.02;  // initializer_range
  // Document masking (pipetrain/nn/documents.h): the token id that ends each document packed in a
  // row (the data's EOS); unset: a row is one sequence.
  std::optional<int64_t> document_separator;

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
};

// Throws std::invalid_argument naming the field (and the command's flag) that does not fit.
void check_decoder_config(const DecoderConfig& config);

// The published shapes: "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "qwen3-0.6b", "qwen3-1.7b",
// "qwen3-4b", "qwen3-8b", and "llama-150m" (a small Llama 3 for benchmarks: 12 layers, 768, 12/4
// heads, FFN 2048, vocabulary 32000, tied). Throws std::invalid_argument naming them.
DecoderConfig decoder_preset(const std::string& name);
std::vector<std::string> decoder_preset_names();

// The Sequential above, its weights drawn from the default generator: every matrix and embedding
// N(0, init_std) (Hugging Face's initializer_range), except that block l's projections into the
// residual stream (o_proj, and the MLP's up_proj and down_proj) are N(0, init_std / sqrt(2 (l +
// 1))) (l from 0), torchtitan's depth scaling (torchtitan itself truncates its normals and draws
// the embedding at 1 and its untied head at n_embd^-1/2); RMSNorm weights 1, biases 0. With a
// document_separator, its first n_layer + 2 layers are the Document kinds of documents.h (the same
// parameters under the same names).
torch::nn::Sequential decoder(const DecoderConfig& config);

// The same layers described one by one, for a model built per rank (pipetrain/layer_spec.h): each
// process builds only its stages' layers, each drawn as above from its own seed. A tied head is a
// matrix of its own tied by name to the embedding ("0.weight"), whose values it starts from; where
// the process holds the embedding too, the embedding's tensor itself.
std::vector<LayerSpec> decoder_layers(const DecoderConfig& config);

// Model FLOPs of one token's forward and backward at block_size: 6 N + 12 n_layer n_head head_dim
// block_size, N the parameters that multiply (an untied embedding is a lookup and not counted; a
// tied one is the head's matrix), as torchtitan counts.
double decoder_flops_per_token(const DecoderConfig& config);

}  // namespace pipetrain::nn
