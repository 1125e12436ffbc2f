// The feed-forward halves of transformer blocks: SwiGLU (Llama, Qwen) and GPT-2's GELU MLP.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace pipetrain::nn {

struct SwiGLUOptions {
  SwiGLUOptions(int64_t n_embd, int64_t hidden) : n_embd_(n_embd), hidden_(hidden) {}
  TORCH_ARG(int64_t, n_embd);
  TORCH_ARG(int64_t, hidden);  // Hugging Face's intermediate_size
  TORCH_ARG(bool, bias) = false;
};

// down_proj(silu(gate_proj(x)) * up_proj(x)) (Shazeer 2020), Hugging Face's names.
class SwiGLUImpl : public torch::nn::Module {
 public:
  explicit SwiGLUImpl(const SwiGLUOptions& options);
  at::Tensor forward(const at::Tensor& x);

  SwiGLUOptions options;
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGLU);

struct GeluMlpOptions {
  GeluMlpOptions(int64_t n_embd, int64_t hidden) : n_embd_(n_embd), hidden_(hidden) {}
  TORCH_ARG(int64_t, n_embd);
  TORCH_ARG(int64_t, hidden);  // GPT-2: 4 n_embd
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(double, dropout) = 0.0;  // after c_proj, while training
};

// dropout(c_proj(gelu_tanh(c_fc(x)))), GPT-2's names.
class GeluMlpImpl : public torch::nn::Module {
 public:
  explicit GeluMlpImpl(const GeluMlpOptions& options);
  at::Tensor forward(const at::Tensor& x);

  GeluMlpOptions options;
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(GeluMlp);

}  // namespace pipetrain::nn
