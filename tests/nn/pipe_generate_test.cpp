// nn::generate over a pipeline of processes: each rank holds its run of a model's layers (as
// `pipe` places them) and the ranks make, token for token, what one process holding the whole
// model makes: a small Llama on 2 ranks and a Qwen3 on 3, greedy; GPT-2 on 2 ranks, sampled with a
// seed, top_k and top_p, and an EOS that stops one row. A stage that cannot be one (a last rank
// without the final norm, a dtype other than rank 0's) is refused on every rank, naming the rank,
// and none waits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/pipetrain.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::testing::pipe_generate_test {
namespace {

using Ids = std::vector<int64_t>;
const std::vector<Ids> kPrompts = {{5, 9, 2, 33, 7, 1}, {12}, {30, 30, 4}};

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

// The model a worker's environment names, the same weights on every rank (decided logits: no ties
// for rounding to flip).
torch::nn::Sequential model_named(const std::string& name) {
  torch::manual_seed(3);
  torch::nn::Sequential model;
  if (name == "gpt2") {
    model = nn::gpt2(tiny_gpt2_config(/*vocab_size=*/40, /*n_layer=*/3, /*block_size=*/32));
  } else {
    auto config = name == "qwen3" ? tiny_qwen3_config(/*vocab_size=*/40, /*n_layer=*/3, 32)
                                  : tiny_llama3_config(/*vocab_size=*/40, /*n_layer=*/3, 32);
    config.init_std = 0.3;
    model = nn::decoder(config);
  }
  torch::NoGradGuard no_grad;
  if (name == "gpt2") {
    for (auto& parameter : model->parameters()) parameter.normal_(0, 0.3);
  }
  model->to(torch::kDouble);
  return model;
}

// Rank `rank`'s run of `model`'s layers under `balance` ("2,3": layers per rank).
torch::nn::Sequential stage_of(const torch::nn::Sequential& model, const std::string& balance,
                               int64_t rank) {
  std::vector<int64_t> counts;
  std::stringstream in(balance);
  for (std::string count; std::getline(in, count, ',');) counts.push_back(std::stoll(count));
  int64_t first = 0;
  for (int64_t r = 0; r < rank; ++r) first += counts[static_cast<size_t>(r)];
  torch::nn::Sequential stage;
  int64_t index = 0;
  for (const auto& layer : *model) {
    if (index >= first && index < first + counts[static_cast<size_t>(rank)]) {
      stage->push_back(layer);
    }
    ++index;
  }
  return stage;
}

nn::GenerationOptions options_named(const std::string& name) {
  auto options = nn::GenerationOptions().max_new_tokens(12);
  if (name == "sampled") options.temperature(0.8).top_k(20).top_p(0.9).seed(7).eos_token_ids({3});
  return options;
}

PIPETRAIN_WORKER(pipe_generate_worker) {
  const auto world = World::connect(*select_cluster_environment());
  const auto model = model_named(env_or("GENERATE_MODEL", ""));
  const auto options = options_named(env_or("GENERATE_OPTIONS", ""));
  const auto stage = stage_of(model, env_or("GENERATE_BALANCE", ""), world->rank());
  std::vector<Ids> streamed(kPrompts.size());
  const auto made = nn::generate(stage, *world, kPrompts, options,
                                 [&](size_t row, int64_t id) { streamed[row].push_back(id); });
  const auto alone = nn::generate(model, kPrompts, options);
  require(made == alone, "rank " + std::to_string(world->rank()) +
                             ": the pipeline made other tokens than one process");
  require(streamed == alone, "rank " + std::to_string(world->rank()) + ": streamed other tokens");
  if (env_or("GENERATE_OPTIONS", "") == "sampled") {
    bool stopped = false;
    for (const auto& row : made) stopped |= row.size() < 12;
    require(stopped, "no row met the EOS: choose another EOS for this check");
  }
}

TEST(PipeGenerate, LlamaOnTwoRanksMakesWhatOneProcessMakes) {
  EXPECT_EQ(run_ranks(2, "pipe_generate_worker",
                      {{"GENERATE_MODEL", "llama"}, {"GENERATE_BALANCE", "2,4"}}),
            0);
}

TEST(PipeGenerate, Qwen3OnThreeRanksMakesWhatOneProcessMakes) {
  EXPECT_EQ(run_ranks(3, "pipe_generate_worker",
                      {{"GENERATE_MODEL", "qwen3"}, {"GENERATE_BALANCE", "1,2,3"}}),
            0);
}

TEST(PipeGenerate, Gpt2SampledOnTwoRanksMakesWhatOneProcessMakes) {
  EXPECT_EQ(run_ranks(2, "pipe_generate_worker",
                      {{"GENERATE_MODEL", "gpt2"},
                       {"GENERATE_BALANCE", "3,3"},
                       {"GENERATE_OPTIONS", "sampled"}}),
            0);
}

// Rank 1's stage out of place: its last blocks and the head without the final norm between them
// (GENERATE_FAULT=no-norm), or in fp32 beside rank 0's fp64, which the activations passed on would
// not fit (dtype). Rank 1 says why, rank 0 that another rank refused; neither waits.
PIPETRAIN_WORKER(refused_stage_worker) {
  const auto world = World::connect(*select_cluster_environment());
  const bool no_norm = env_or("GENERATE_FAULT", "") == "no-norm";
  auto stage = stage_of(model_named("llama"), "2,4", world->rank());
  if (world->rank() == 1 && no_norm) {
    const std::vector<torch::nn::AnyModule> layers(stage->begin(), stage->end());
    stage = torch::nn::Sequential();
    for (size_t i : {0, 1, 3}) stage->push_back(layers[i]);
  }
  if (world->rank() == 1 && !no_norm) stage->to(torch::kFloat);
  const std::string expected = world->rank() == 0 ? "another rank"
                               : no_norm ? "layer 1 of the stage of rank 1 is not a final norm"
                                         : "holds Float parameters, rank 0's Double";
  try {
    nn::generate(stage, *world, kPrompts);
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    require(message.find(expected) != std::string::npos,
            "rank " + std::to_string(world->rank()) + " said: " + message);
    return;
  }
  throw std::runtime_error("a stage out of place generated");
}

TEST(PipeGenerate, AStageOutOfPlaceIsRefusedOnEveryRank) {
  EXPECT_EQ(run_ranks(2, "refused_stage_worker", {{"GENERATE_FAULT", "no-norm"}}), 0);
}

TEST(PipeGenerate, StagesOfTwoDtypesAreRefusedOnEveryRank) {
  EXPECT_EQ(run_ranks(2, "refused_stage_worker", {{"GENERATE_FAULT", "dtype"}}), 0);
}

}  // namespace
}  // namespace pipetrain::testing::pipe_generate_test
