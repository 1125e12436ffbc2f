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

}  // namespace pipetrain::cli
