#include "pipetrain/nn/attention.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include <pipetrain/linear.h>
#include <pipetrain/nn/documents.h>

#include "ops/fused_linear.h"
#include "util/compat.h"

namespace pipetrain::nn {
namespace {

// k or v [B, Hkv, T, D] with each head repeated for the `groups` query heads that read it.
at::Tensor repeat_heads(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  return x.repeat_interleave(groups, /*dim=*/1);
}

// `allowed`: [B, 1, T, T], true where a query may attend to a key; undefined: causal.
at::Tensor explicit_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              double dropout, const at::Tensor& allowed) {
  const int64_t time = q.size(-2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const auto steps = torch::arange(time, q.options().dtype(torch::kInt64));
  const auto masked = allowed.defined() ? allowed.logical_not()
                                        : steps.unsqueeze(0) > steps.unsqueeze(1);  // the future
  scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
  auto weights = torch::softmax(scores, -1);
  if (dropout > 0) weights = torch::dropout(weights, dropout, /*train=*/true);
  return torch::matmul(weights, v);
}

// masked_attention without dropout, with each key/value head read once by the `groups` query heads
// that share it: they attend as one head over groups x T query rows (row g T + t is head g's query
// t, under mask row t), where repeating the keys and values per query head would copy a whole
// cache per layer and step while generating.
at::Tensor grouped_masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& allowed, AttentionKernel kernel) {
  const int64_t batch = q.size(0), heads = q.size(1), time = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), groups = heads / kv_heads;
  if (groups == 1) return masked_attention(q, k, v, allowed, /*dropout=*/0.0, kernel);
  const auto rows = q.reshape({batch, kv_heads, groups * time, width});
  const auto mask = allowed.expand({batch, 1, time, k.size(2)}).repeat({1, 1, groups, 1});
  return masked_attention(rows, k, v, mask, /*dropout=*/0.0, kernel)
      .reshape({batch, heads, time, width});
}

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return pipetrain::linear(x, layer->weight, layer->bias);
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout, AttentionKernel kernel, const at::Tensor& documents) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.size(1) % k.size(1) != 0) {
    throw std::invalid_argument(
        "causal_attention: q [B, H, T, D] and k, v [B, Hkv, T, D] with H a multiple of Hkv; got " +
        std::to_string(q.dim()) + "-D q with " + std::to_string(q.dim() == 4 ? q.size(1) : 0) +
        " heads and " + std::to_string(k.dim() == 4 ? k.size(1) : 0) + " key heads");
  }
  const int64_t groups = q.size(1) / k.size(1);
  if (documents.defined()) {
    if (documents.dim() != 2 || documents.size(0) != q.size(0) || documents.size(1) != q.size(2)) {
      throw std::invalid_argument(
          "causal_attention: documents [B, T] of q's B " + std::to_string(q.size(0)) + " and T " +
          std::to_string(q.size(2)) + ", got " + std::to_string(documents.dim()) + "-D");
    }
    return masked_attention(q, k, v, document_attention_mask(documents), dropout, kernel);
  }
  (void)kernel;  // a Torch without scaled_dot_product_attention has the written-out path alone
#if TORCH_VERSION_MAJOR >= 2
  if (kernel == AttentionKernel::kSdpa) {
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout,
                                            /*is_causal=*/true, /*scale=*/std::nullopt,
                                            /*enable_gqa=*/groups > 1);
#else
    return at::scaled_dot_product_attention(q, repeat_heads(k, groups), repeat_heads(v, groups),
                                            /*attn_mask=*/{}, dropout, /*is_causal=*/true);
#endif
  }
#endif
  return explicit_attention(q, repeat_heads(k, groups), repeat_heads(v, groups), dropout, {});
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed, double dropout, AttentionKernel kernel) {
  const int64_t groups = q.size(1) / k.size(1);
  (void)kernel;
#if TORCH_VERSION_MAJOR >= 2
  // Keys and values repeated per query head: the memory-efficient kernel, which takes a mask, has
  // no grouped-query form.
  if (kernel == AttentionKernel::kSdpa) {
    return at::scaled_dot_product_attention(q, repeat_heads(k, groups), repeat_heads(v, groups),
                                            allowed, dropout, /*is_causal=*/false);
  }
#endif
  return explicit_attention(q, repeat_heads(k, groups), repeat_heads(v, groups), dropout, allowed);
}

void check_attention_options(const CausalSelfAttentionOptions& options) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("CausalSelfAttention: " + message);
  };
  const int64_t n_kv_head = options.n_kv_head() > 0 ? options.n_kv_head() : options.n_head();
  require(options.n_embd() > 0 && options.n_head() > 0,
          "n_embd and n_head must be positive (got " + std::to_string(options.n_embd()) + ", " +
              std::to_string(options.n_head()) + ")");
  require(options.head_dim() > 0 || options.n_embd() % options.n_head() == 0,
          "n_embd " + std::to_string(options.n_embd()) + " is not a multiple of n_head " +
              std::to_string(options.n_head()) + ": give head_dim");
  require(options.n_head() % n_kv_head == 0, "n_head " + std::to_string(options.n_head()) +
                                                 " must be a multiple of n_kv_head " +
                                                 std::to_string(n_kv_head));
  require(!options.fused_qkv() ||
              (n_kv_head == options.n_head() && options.head_dim() <= 0 && !options.qk_norm()),
          "fused_qkv (GPT-2's one projection) has n_kv_head = n_head, head_dim = n_embd / "
          "n_head and no qk_norm");
  require(options.dropout() >= 0 && options.dropout() < 1, "dropout must be in [0, 1)");
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options_)
    : options(options_) {
  check_attention_options(options);
  if (options.n_kv_head() <= 0) options.n_kv_head(options.n_head());
  if (options.head_dim() <= 0) options.head_dim(options.n_embd() / options.n_head());
  const int64_t q_width = options.n_head() * options.head_dim();
  const int64_t kv_width = options.n_kv_head() * options.head_dim();
  const auto projection = [&](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(options.bias()));
  };
  if (options.fused_qkv()) {
    c_attn = register_module("c_attn", projection(options.n_embd(), 3 * options.n_embd()));
    output = register_module("c_proj", projection(options.n_embd(), options.n_embd()));
  } else {
    q_proj = register_module("q_proj", projection(options.n_embd(), q_width));
    k_proj = register_module("k_proj", projection(options.n_embd(), kv_width));
    v_proj = register_module("v_proj", projection(options.n_embd(), kv_width));
    output = register_module("o_proj", projection(q_width, options.n_embd()));
  }
  if (options.qk_norm()) {
    q_norm = register_module("q_norm",
                             RMSNorm(RMSNormOptions(options.head_dim()).eps(options.norm_eps())));
    k_norm = register_module("k_norm",
                             RMSNorm(RMSNormOptions(options.head_dim()).eps(options.norm_eps())));
  }
  if (options.rotary()) {
    auto rotary_options = *options.rotary();
    rotary_options.head_dim(options.head_dim());
    rotary = register_module("rotary_emb", RotaryEmbedding(rotary_options));
  }
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(options.dropout()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> CausalSelfAttentionImpl::project(
    const at::Tensor& x, const at::Tensor& positions, int64_t positions_below) {
  const int64_t batch = x.size(0), time = x.size(1);
  const int64_t head_dim = options.head_dim();
  // [B, T, H * D] -> [B, T, H, D]; the per-head norms apply there, then heads go first.
  const auto split_heads = [&](const at::Tensor& t, int64_t heads) {
    return t.view({batch, time, heads, head_dim});
  };
  at::Tensor q, k, v;
  if (options.fused_qkv()) {
    // Parts of one GEMM whose backward takes q's, k's and v's gradients as attention gives them,
    // apart: autograd's split would first copy them into one [B, T, 3C] gradient.
    const auto qkv = linear_parts(x, c_attn->weight, c_attn->bias, 3);
    q = split_heads(qkv[0], options.n_head());
    k = split_heads(qkv[1], options.n_head());
    v = split_heads(qkv[2], options.n_head());
  } else {
    const auto bias = [](const torch::nn::Linear& layer) { return layer->bias; };
    const auto qkv = pipetrain::linears(x, {q_proj->weight, k_proj->weight, v_proj->weight},
                                        {bias(q_proj), bias(k_proj), bias(v_proj)});
    q = split_heads(qkv[0], options.n_head());
    k = split_heads(qkv[1], options.n_kv_head());
    v = split_heads(qkv[2], options.n_kv_head());
  }
  if (options.qk_norm()) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  if (!rotary.is_empty()) {
    // Under autocast on a GPU the fp32 tables rotate q and k into fp32, which attention casts to
    // autocast's dtype at once (and its backward casts their gradients back): asked for in that
    // dtype, the rotation rounds once in its own pass, to the same values.
    std::optional<at::ScalarType> dtype;
    if (q.is_cuda() && autocast_enabled(c10::DeviceType::CUDA)) {
      dtype = autocast_dtype(c10::DeviceType::CUDA);
    }
    std::tie(q, k) = rotary->rotate(q, k, dtype, positions, positions_below);
  }
  return {q, k, v};
}

at::Tensor CausalSelfAttentionImpl::merge(const at::Tensor& y) {
  const auto merged =
      y.transpose(1, 2).reshape({y.size(0), y.size(2), options.n_head() * options.head_dim()});
  return resid_dropout_(linear(output, merged));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x, const at::Tensor& documents) {
  const auto positions = documents.defined() ? document_positions(documents) : at::Tensor();
  const auto [q, k, v] = project(x, positions, x.size(1));
  return merge(causal_attention(q, k, v, is_training() ? options.dropout() : 0.0, options.kernel(),
                                documents));
}

at::Tensor CausalSelfAttentionImpl::forward_cached(const at::Tensor& x, KVCache::Layer& cache,
                                                   const CachedStep& step) {
  const int64_t time = x.size(1), end = step.start + time;
  const auto [q, k, v] = project(x, step.positions, end);
  if (!cache.keys.defined()) {
    cache.keys = at::zeros({k.size(0), k.size(1), step.capacity, k.size(3)}, k.options());
    cache.values = at::zeros_like(cache.keys);
  }
  if (end > cache.keys.size(2)) {
    throw std::invalid_argument("CausalSelfAttention: a cache of " +
                                std::to_string(cache.keys.size(2)) + " tokens cannot hold " +
                                std::to_string(end));
  }
  cache.keys.narrow(2, step.start, time).copy_(k);
  cache.values.narrow(2, step.start, time).copy_(v);
  return merge(grouped_masked_attention(q, cache.keys.narrow(2, 0, end),
                                        cache.values.narrow(2, 0, end), step.allowed,
                                        options.kernel()));
}

}  // namespace pipetrain::nn
