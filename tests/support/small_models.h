// The small models tests train through the Trainer: a tanh MLP, a Module stepped by SGD at a fixed
// learning rate, a regression by mean squared error, and a decoder's and GPT-2's shapes.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "pipetrain/module.h"
#include "pipetrain/nn/decoder.h"
#include "pipetrain/nn/gpt2.h"

namespace pipetrain::testing {

// Linear layers of the given widths (inputs, hidden..., outputs), a Tanh between each two.
torch::nn::Sequential tanh_mlp(const std::vector<int64_t>& widths);

// A Module whose optimizer is SGD over its parameters() at `learning_rate`, with `momentum`.
class SgdModule : public Module {
 public:
  SgdModule(torch::nn::Sequential layers, double learning_rate, double momentum = 0);
  OptimizerConfig configure_optimizers() override;

 private:
  double learning_rate_;
  double momentum_;
};

// Regression onto batch.target: the mean squared error of forward(batch.data), logged as
// train_loss.
class MseRegression : public SgdModule {
 public:
  using SgdModule::SgdModule;
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override;
};

// A decoder of Llama's shape small enough for any test: width 32, 4 query and 2 key-value heads,
// an MLP of 48; the caller sets what it varies (RoPE, ties, norms).
nn::DecoderConfig tiny_decoder_config(int64_t vocab_size, int64_t n_layer, int64_t block_size);

// tiny_decoder_config as Llama 3 makes it: a tied head, Llama 3.1's RoPE scaling (theta 500000,
// factor 32 over an original context of 4, so that short tests reach the scaled frequencies).
nn::DecoderConfig tiny_llama3_config(int64_t vocab_size, int64_t n_layer, int64_t block_size);
// tiny_decoder_config as Qwen3 makes it: multi-query, head_dim 16 (not n_embd / n_head), q/k
// norms, an untied head, theta 1e6, eps 1e-6.
nn::DecoderConfig tiny_qwen3_config(int64_t vocab_size, int64_t n_layer, int64_t block_size);

// A GPT-2 small enough for any test: width 16, 2 heads.
nn::Gpt2Config tiny_gpt2_config(int64_t vocab_size, int64_t n_layer, int64_t block_size);

}  // namespace pipetrain::testing
