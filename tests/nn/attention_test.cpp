// pipetrain::nn's attention: the fused kernel (scaled_dot_product_attention, with GQA where the
// Torch has it) against the written-out one, causality, grouped-query attention against the same
// heads repeated, and the layer's options.
// Tolerance: fp32 on CPU, 1e-5 (the two kernels sum in different orders).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "pipetrain/nn/attention.h"

namespace pipetrain::testing::attention_test {
namespace {

using nn::AttentionKernel;

TEST(Attention, FusedKernelGivesTheWrittenOutOne) {
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "this Torch (" << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR
               << ") has no scaled_dot_product_attention: both paths are the written-out one";
#endif
  torch::manual_seed(3);
  const auto q = torch::randn({2, 3, 10, 8}), k = torch::randn({2, 3, 10, 8}),
             v = torch::randn({2, 3, 10, 8});
  EXPECT_TRUE(torch::allclose(nn::causal_attention(q, k, v, 0, AttentionKernel::kSdpa),
                              nn::causal_attention(q, k, v, 0, AttentionKernel::kExplicit), 1e-5,
                              1e-5));
}

TEST(Attention, IsCausal) {
  torch::manual_seed(4);
  for (const auto kernel : {AttentionKernel::kSdpa, AttentionKernel::kExplicit}) {
    auto q = torch::randn({1, 1, 6, 4}), k = torch::randn({1, 1, 6, 4}),
         v = torch::randn({1, 1, 6, 4});
    const auto before = nn::causal_attention(q, k, v, 0, kernel);
    k.select(2, 5).fill_(9), v.select(2, 5).fill_(9);  // the last position alone changes
    const auto after = nn::causal_attention(q, k, v, 0, kernel);
    EXPECT_TRUE(torch::allclose(before.slice(2, 0, 5), after.slice(2, 0, 5)));
    EXPECT_FALSE(torch::allclose(before.select(2, 5), after.select(2, 5)));
  }
}

// Each group of H / Hkv query heads reads one key/value head: the same as multi-head attention
// over the key/value heads repeated (repeat_interleave, Hugging Face's repeat_kv), in both kernels.
TEST(Attention, GroupedQueryAttentionIsMultiHeadOverRepeatedKeysAndValues) {
  torch::manual_seed(5);
  const auto q = torch::randn({2, 6, 7, 4}), k = torch::randn({2, 2, 7, 4}),
             v = torch::randn({2, 2, 7, 4});
  const auto repeated_k = k.repeat_interleave(3, 1), repeated_v = v.repeat_interleave(3, 1);
  for (const auto kernel : {AttentionKernel::kSdpa, AttentionKernel::kExplicit}) {
    EXPECT_TRUE(torch::allclose(
        nn::causal_attention(q, k, v, 0, kernel),
        nn::causal_attention(q, repeated_k, repeated_v, 0, AttentionKernel::kExplicit), 1e-5,
        1e-5));
  }
  EXPECT_THROW(nn::causal_attention(q, torch::randn({2, 4, 7, 4}), torch::randn({2, 4, 7, 4})),
               std::invalid_argument);
}

TEST(Attention, LayerHasTheNamesAndShapesOfItsOptions) {
  nn::CausalSelfAttention llama(
      nn::CausalSelfAttentionOptions(32, 4).n_kv_head(2).head_dim(16).qk_norm(true).rotary(
          nn::RotaryEmbeddingOptions()));
  const auto parameters = llama->named_parameters();
  EXPECT_EQ(parameters["q_proj.weight"].sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(parameters["k_proj.weight"].sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(parameters["v_proj.weight"].sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(parameters["o_proj.weight"].sizes(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(parameters["q_norm.weight"].sizes(), (std::vector<int64_t>{16}));
  EXPECT_EQ(parameters.size(), 6u);  // no biases
  EXPECT_EQ(llama(torch::randn({2, 5, 32})).sizes(), (std::vector<int64_t>{2, 5, 32}));

  nn::CausalSelfAttention gpt2(nn::CausalSelfAttentionOptions(32, 4).bias(true).fused_qkv(true));
  EXPECT_EQ(gpt2->named_parameters()["c_attn.weight"].sizes(), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(gpt2->named_parameters().size(), 4u);

  EXPECT_THROW(nn::CausalSelfAttention(nn::CausalSelfAttentionOptions(32, 4).n_kv_head(3)),
               std::invalid_argument);
  EXPECT_THROW(nn::CausalSelfAttention(nn::CausalSelfAttentionOptions(30, 4)),
               std::invalid_argument);
}

}  // namespace
}  // namespace pipetrain::testing::attention_test
