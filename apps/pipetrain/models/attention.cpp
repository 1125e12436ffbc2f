#include "models/attention.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace pipetrain::cli {

at::Tensor causal_attention_explicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     double dropout) {
  const int64_t time = q.size(-2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const auto steps = torch::arange(time, q.options().dtype(torch::kInt64));
  const auto future = steps.unsqueeze(0) > steps.unsqueeze(1);  // [T, T], true above diagonal
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  auto weights = torch::softmax(scores, -1);
  if (dropout > 0) weights = torch::dropout(weights, dropout, /*train=*/true);
  return torch::matmul(weights, v);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, /*is_causal=*/true);
#else
  return causal_attention_explicit(q, k, v, dropout);
#endif
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options)
    : options_(options),
      qkv_(register_module(options.names.qkv,
                           torch::nn::Linear(options.n_embd, 3 * options.n_embd))),
      proj_(register_module(options.names.proj, torch::nn::Linear(options.n_embd, options.n_embd))),
      resid_dropout_(
          register_module(options.names.resid_dropout, torch::nn::Dropout(options.dropout))) {}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), channels = x.size(2);
  const int64_t n_head = options_.n_head;
  // [B, T, 3C] -> q, k, v of [B, H, T, hs]. Split, not indexed: the backward of a split is one
  // concatenation, where each index's would zero-fill and add a whole [B, T, 3C] gradient.
  auto heads = [&](const at::Tensor& t) {
    return t.view({batch, time, n_head, channels / n_head}).transpose(1, 2);
  };
  const auto qkv = options_.linear(x, qkv_->weight, qkv_->bias).split(channels, 2);
  const auto y = options_.attend(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                 is_training() ? options_.dropout : 0.0);
  const auto merged = y.transpose(1, 2).reshape({batch, time, channels});
  return resid_dropout_(options_.linear(merged, proj_->weight, proj_->bias));
}

}  // namespace pipetrain::cli
