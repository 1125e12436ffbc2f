// nn::generate: a small Llama's, Qwen3's and GPT-2's greedy tokens with the key/value cache are
// those of re-running the whole sequence through the model for every token (no cache), in fp64 on
// the CPU; prompts of different lengths generated as one left-padded batch make what each makes
// alone; an EOS stops its row; a vocab_limit keeps to the ids below it; GPT-2 refuses more
// positions than its block size; sampling is seeded, top_k 1 and a tiny top_p are greedy, and top_k
// and top_p keep the tokens Hugging Face's warpers keep; every module's mode is put back; bad
// prompts, options and models are refused.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "pipetrain/pipetrain.h"
#include "support/small_models.h"

namespace pipetrain::testing::generate_test {
namespace {

using Ids = std::vector<int64_t>;

// Decided logits: greedy choices far from ties.
constexpr double kInitStd = 0.3;

nn::DecoderConfig llama() {
  nn::DecoderConfig config =
      tiny_llama3_config(/*vocab_size=*/40, /*n_layer=*/2, /*block_size=*/32);
  config.init_std = kInitStd;
  return config;
}

nn::DecoderConfig qwen3() {
  nn::DecoderConfig config = tiny_qwen3_config(/*vocab_size=*/40, /*n_layer=*/2, /*block_size=*/32);
  config.init_std = kInitStd;
  return config;
}

torch::nn::Sequential model_of(const nn::DecoderConfig& config) {
  torch::manual_seed(3);
  auto model = nn::decoder(config);
  model->to(torch::kDouble);
  return model;
}

// Greedy tokens without a cache: the whole sequence through the decoder for every new token.
Ids greedy_without_cache(torch::nn::Sequential& model, Ids sequence, int64_t new_tokens) {
  torch::NoGradGuard no_grad;
  Ids made;
  for (int64_t n = 0; n < new_tokens; ++n) {
    const auto logits = model->forward(torch::tensor(sequence, torch::kInt64).unsqueeze(0));
    made.push_back(logits[0][-1].argmax().item<int64_t>());
    sequence.push_back(made.back());
  }
  return made;
}

const std::vector<Ids> kPrompts = {{5, 9, 2, 33, 7, 1}, {12}, {30, 30, 4}};

// A small GPT-2 whose every parameter (biases and LayerNorms too, so the cached path meets them)
// is drawn N(0, kInitStd).
torch::nn::Sequential gpt2() {
  torch::manual_seed(3);
  auto model = nn::gpt2(tiny_gpt2_config(/*vocab_size=*/40, /*n_layer=*/2, /*block_size=*/32));
  torch::NoGradGuard no_grad;
  for (auto& parameter : model->parameters()) parameter.normal_(0, kInitStd);
  model->to(torch::kDouble);
  return model;
}

void expect_cache_gives_the_uncached_tokens(torch::nn::Sequential model) {
  const auto options = nn::GenerationOptions().max_new_tokens(16);
  const auto batched = nn::generate(model, kPrompts, options);
  ASSERT_EQ(batched.size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(batched[i], greedy_without_cache(model, kPrompts[i], 16)) << "prompt " << i;
    EXPECT_EQ(nn::generate(model, {kPrompts[i]}, options).front(), batched[i]) << "prompt " << i;
  }
}

TEST(Generate, LlamaWithTheCacheMakesTheTokensOfTheWholeSequenceRerun) {
  expect_cache_gives_the_uncached_tokens(model_of(llama()));
}

TEST(Generate, Qwen3WithTheCacheMakesTheTokensOfTheWholeSequenceRerun) {
  expect_cache_gives_the_uncached_tokens(model_of(qwen3()));
}

TEST(Generate, Gpt2WithTheCacheMakesTheTokensOfTheWholeSequenceRerun) {
  expect_cache_gives_the_uncached_tokens(gpt2());
}

TEST(Generate, Gpt2RefusesMorePositionsThanItsBlockSize) {
  auto model = gpt2();
  // 6 + 27 new: the last token made is never fed, so 32 positions serve.
  EXPECT_EQ(nn::generate(model, kPrompts, nn::GenerationOptions().max_new_tokens(27))[0].size(),
            27u);
  try {
    nn::generate(model, kPrompts, nn::GenerationOptions().max_new_tokens(28));
    FAIL() << "33 positions of a block size of 32 were generated";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("block size"), std::string::npos) << e.what();
  }
}

TEST(Generate, AVocabLimitKeepsToTheIdsBelowIt) {
  for (auto model : {gpt2(), model_of(llama())}) {
    const auto free = nn::generate(model, kPrompts, nn::GenerationOptions().max_new_tokens(16));
    EXPECT_EQ(
        nn::generate(model, kPrompts, nn::GenerationOptions().max_new_tokens(16).vocab_limit(40)),
        free);
    // The most made id barred: the rows go elsewhere, below the limit.
    int64_t most = 0;
    for (const auto& row : free) most = std::max(most, *std::max_element(row.begin(), row.end()));
    for (const auto& options :
         {nn::GenerationOptions().max_new_tokens(16).vocab_limit(most),
          nn::GenerationOptions().max_new_tokens(16).vocab_limit(most).temperature(1.0).seed(1)}) {
      for (const auto& row : nn::generate(model, kPrompts, options)) {
        for (const int64_t id : row) EXPECT_LT(id, most);
      }
    }
    EXPECT_THROW(nn::generate(model, kPrompts, nn::GenerationOptions().vocab_limit(41)),
                 std::invalid_argument);
  }
}

TEST(Generate, AnEosStopsItsRowAlone) {
  auto model = model_of(llama());
  const auto options = nn::GenerationOptions().max_new_tokens(8);
  const auto free = nn::generate(model, kPrompts, options);
  // The first prompt's third token ends it; the others run on as before.
  auto stopping = options;
  stopping.eos_token_ids({free[0][2]});
  std::vector<std::pair<size_t, int64_t>> streamed;
  const auto stopped = nn::generate(model, kPrompts, stopping, [&](size_t prompt, int64_t token) {
    streamed.emplace_back(prompt, token);
  });
  const auto first_eos = std::find(free[0].begin(), free[0].end(), free[0][2]) - free[0].begin();
  EXPECT_EQ(stopped[0], Ids(free[0].begin(), free[0].begin() + first_eos + 1));
  size_t made = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    made += stopped[i].size();
    const auto eos = std::find(free[i].begin(), free[i].end(), free[0][2]);
    EXPECT_EQ(stopped[i], Ids(free[i].begin(), eos == free[i].end() ? eos : eos + 1));
  }
  EXPECT_EQ(streamed.size(), made);  // every token made, streamed once
}

TEST(Generate, SamplingIsSeededAndItsLimitsOfOneAreGreedy) {
  auto model = model_of(qwen3());
  const auto greedy = nn::generate(model, kPrompts, nn::GenerationOptions().max_new_tokens(10));
  const auto sampling = nn::GenerationOptions().max_new_tokens(10).temperature(1.5).seed(7);
  const auto first = nn::generate(model, kPrompts, sampling);
  EXPECT_EQ(nn::generate(model, kPrompts, sampling), first);
  auto reseeded = sampling;
  EXPECT_NE(nn::generate(model, kPrompts, reseeded.seed(8)), first);
  EXPECT_NE(first, greedy);
  auto top_k = sampling;
  EXPECT_EQ(nn::generate(model, kPrompts, top_k.top_k(1)), greedy);
  auto top_p = sampling;
  EXPECT_EQ(nn::generate(model, kPrompts, top_p.top_p(1e-9)), greedy);
}

TEST(Generate, RefusesWhatItCannotRun) {
  auto model = model_of(llama());
  EXPECT_THROW(nn::generate(model, {{1, 2}, {}}), std::invalid_argument);
  EXPECT_THROW(nn::generate(model, {{1, 40}}), std::invalid_argument);  // a vocabulary of 40
  EXPECT_THROW(nn::generate(model, {{1}}, nn::GenerationOptions().max_new_tokens(0)),
               std::invalid_argument);
  EXPECT_THROW(nn::generate(model, {{1}}, nn::GenerationOptions().top_p(0)), std::invalid_argument);
  torch::nn::Sequential other(torch::nn::Embedding(40, 8), torch::nn::Linear(8, 8),
                              torch::nn::Linear(8, 8), torch::nn::Linear(8, 40));
  try {
    nn::generate(other, {{1}});
    FAIL() << "a Sequential of torch::nn layers was generated from";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nn::generate(model, {{1}, {1, 2}}, nn::GenerationOptions().pad_token_id(40)),
               std::invalid_argument);
  EXPECT_TRUE(model->is_training());  // put back
}

TEST(Generate, PutsBackEveryModulesModeAndSamplesWithinTopKAndTopP) {
  auto model = model_of(llama());
  model->ptr(1)->eval();  // one block in eval mode, the rest training
  nn::generate(model, kPrompts, nn::GenerationOptions().max_new_tokens(2));
  EXPECT_TRUE(model->is_training());
  EXPECT_FALSE(model->ptr(1)->is_training());
  EXPECT_TRUE(model->ptr(2)->is_training());

  // Probabilities 0.5, 0.3, 0.2 in every one of 4000 rows: top_p 0.75 keeps the first two (the
  // third's predecessors already reach it), 0.85 all three; top_k 2 the first two.
  const auto logits = torch::tensor({0.5, 0.3, 0.2}).log().expand({4000, 3});
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto drawn = [&](const nn::GenerationOptions& options) {
    return torch::bincount(nn::next_tokens(logits, options, generator), {}, 3);
  };
  const auto sampling = nn::GenerationOptions().temperature(1.0);
  auto top_p = sampling, wide_top_p = sampling, top_k = sampling;
  const auto kept_two = drawn(top_p.top_p(0.75));
  EXPECT_EQ(kept_two[2].item<int64_t>(), 0);
  EXPECT_GT(kept_two[1].item<int64_t>(), 1000);  // 0.3 / 0.8 of the draws
  EXPECT_GT(drawn(wide_top_p.top_p(0.85))[2].item<int64_t>(), 500);
  const auto top_two = drawn(top_k.top_k(2));
  EXPECT_EQ(top_two[2].item<int64_t>(), 0);
  EXPECT_GT(top_two[1].item<int64_t>(), 1000);
}

}  // namespace
}  // namespace pipetrain::testing::generate_test
