// Tied parameters: a user's model whose first layer (an Embedding) and last layer (the output
// projection) share one weight, as GPT-2 does, trained through the Trainer under `pipe` over 2 and
// 3 stages and `ddp_pipe` 2 x 2 must equal `single`; the stages' copies stay bit-identical; a
// checkpoint stores the weight once and resumes across layouts; saving one changes no live tensor.
// Tolerance: fp32 on CPU, relative 1e-5 on losses and absolute 1e-5 on parameters (only the order
// of the gradient sums differs).
#include "pipeline/tied_parameters.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/module.h"
#include "pipetrain/safetensors.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::tied_parameters_test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocabulary = 11;
constexpr int64_t kWidth = 8;
constexpr int64_t kTokens = 5;

// The embedding's weight used again as the output projection (GPT-2's tied LM head): the same
// tensor registered in a second layer.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const torch::nn::Embedding& embedding)
      : weight(register_parameter("weight", embedding->weight)) {}
  at::Tensor forward(const at::Tensor& x) { return torch::matmul(x, weight.t()); }
  at::Tensor weight;
};
TORCH_MODULE(TiedHead);

torch::nn::Sequential tied_sequential() {
  torch::nn::Embedding embedding(kVocabulary, kWidth);
  return torch::nn::Sequential(embedding, torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh(),
                               torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh(),
                               TiedHead(embedding));
}

// SGD with momentum, which has per-parameter state: a checkpoint must carry it across layouts.
class TiedLanguageModel : public SgdModule {
 public:
  TiedLanguageModel() : SgdModule(tied_sequential(), 0.2, 0.9) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto logits = forward(batch.data);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kVocabulary}),
                                                     batch.target.reshape(-1));
    log("train_loss", loss);
    return loss;
  }
};

TensorDataset token_data() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  auto tokens = torch::randint(kVocabulary, {32, kTokens + 1}, generator);
  return {tokens.slice(1, 0, kTokens).clone(), tokens.slice(1, 1).clone()};
}

// How one run trains, from the environment in workers.
struct TiedRun : FitRun {
  int64_t stages = 0;  // under ddp_pipe
  int64_t max_epochs = 2;
  double clip = 0;  // gradient_clip_val

  template <typename Visit>
  void fields(Visit&& visit) {
    FitRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, stages, max_epochs, clip);
  }
  int64_t replicas() const {
    if (strategy == "ddp") return devices;
    return strategy == "ddp_pipe" ? devices / stages : 1;
  }
};

// Trains the tied model (4 batches of 8 an epoch) and writes each rank's parameters, named in the
// whole model, to <root>/rank-<r>.safetensors. Rank 0 also checks that writing a checkpoint
// changes none of its tensors.
void train(const TiedRun& run) {
  Trainer trainer(run.trainer_options()
                      .stages(run.stages)
                      .max_epochs(run.max_epochs)
                      .gradient_clip_val(run.clip));
  TiedLanguageModel model;
  DataLoader loader(token_data(), DataLoaderOptions().batch_size(8 / run.replicas()));
  trainer.fit(model, loader, nullptr, run.resume);

  std::vector<at::Tensor> before;
  for (const auto& t : model.layers()->parameters()) before.push_back(t.detach().clone());
  trainer.save_checkpoint(run.root + "/again.ckpt");
  const auto after = model.layers()->parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    if (!torch::equal(before[i], after[i])) {
      throw std::runtime_error("saving a checkpoint changed parameter " + std::to_string(i));
    }
  }
  save_local_tensors(model, run.rank_tensors(worker_rank()));
}

PIPETRAIN_WORKER(tied_worker) { train(from_env<TiedRun>()); }

void train_in_ranks(const TiedRun& run, int ranks) {
  ASSERT_EQ(run_ranks(ranks, "tied_worker", to_env(run)), 0);
}

// `actual` logged the losses `expected` did, step by step, and saved the same weights.
void expect_same_training(const TiedRun& expected, const TiedRun& actual) {
  expect_same_train_losses(expected.root, actual.root);
  EXPECT_EQ(read_csv_column(metrics_csv(actual.root), "train_loss").size(),
            4u * static_cast<size_t>(actual.max_epochs));
  expect_same_weights(expected.final_weights(), actual.final_weights(), 1e-5);
}

class TiedParameters : public FitRunsTest<TiedRun> {
 protected:
  TiedRun run(const std::string& name) const { return named_run(name); }
  TiedRun pipe_run(const std::string& name, int64_t stages, int64_t chunks) const {
    TiedRun r = run(name);
    r.strategy = "pipe";
    r.devices = stages;
    r.chunks = chunks;
    return r;
  }
};

TEST(FindTiedParameters, FindsTheSameTensorUnderTwoNamesAndTheStagesHoldingIt) {
  const auto ties = find_tied_parameters(tied_sequential(), {2, 2, 2});
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].names, (std::vector<std::string>{"0.weight", "5.weight"}));
  EXPECT_EQ(ties[0].stages, (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(find_tied_parameters(tied_sequential(), {6})[0].stages == std::vector<int64_t>{0});
  EXPECT_TRUE(find_tied_parameters(torch::nn::Sequential(torch::nn::Linear(2, 2)), {1}).empty());
}

TEST(FindTiedParameters, DeclaredTiesJoinTensorsOfTheirOwnAndBadNamesAreRefused) {
  torch::nn::Sequential twins(torch::nn::Linear(4, 4), torch::nn::Tanh(), torch::nn::Linear(4, 4));
  const auto ties = find_tied_parameters(twins, {1, 2}, {{"0.weight", "2.weight"}});
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].names, (std::vector<std::string>{"0.weight", "2.weight"}));
  EXPECT_EQ(ties[0].stages, (std::vector<int64_t>{0, 1}));
  EXPECT_THROW(find_tied_parameters(twins, {1, 2}, {{"0.weight", "9.weight"}}),
               std::invalid_argument);
  EXPECT_THROW(find_tied_parameters(twins, {1, 2}, {{"0.weight", "2.bias"}}),
               std::invalid_argument);
  // A misspelt name, from a LayerSpec::tie as from the options: the message names the tie's
  // sources and what the layer does have.
  try {
    find_tied_parameters(twins, {3}, {{"0.weigth", "2.weight"}});
    ADD_FAILURE() << "a misspelt tie was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("a tie (LayerSpec::tie, PipeOptions::tied_parameters) names '0.weigth'"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("whose layer 0 has weight, bias"), std::string::npos) << message;
  }
}

TEST(FindTiedParameters, SingleStepsATiedWeightOnce) {
  TiedLanguageModel model;
  EXPECT_EQ(model.layers()->parameters().size(), 6u);  // the tied weight twice
  EXPECT_EQ(model.parameters().size(), 5u);
}

TEST_F(TiedParameters, PipeOverTwoAndThreeStagesTrainsAsSingleWithBitIdenticalCopies) {
  auto single = run("single");
  train(single);
  for (const int64_t stages : {2, 3}) {
    SCOPED_TRACE(std::to_string(stages) + " stages");
    auto pipe = pipe_run("pipe" + std::to_string(stages), stages, 4);
    train_in_ranks(pipe, static_cast<int>(stages));
    expect_same_training(single, pipe);
    // Stored once, under its first name.
    EXPECT_EQ(pipe.final_weights().count("5.weight"), 0u);
    const auto first = load_safetensors(pipe.rank_tensors(0));
    const auto last = load_safetensors(pipe.rank_tensors(stages - 1));
    ASSERT_TRUE(first.count("0.weight") && last.count("5.weight"));
    EXPECT_TRUE(torch::equal(first.at("0.weight"), last.at("5.weight")));
  }
}

TEST_F(TiedParameters, GradientClippingCountsATiedWeightOnce) {
  auto single = run("single");
  single.clip = 0.05;  // below every step's norm: each step is clipped
  train(single);
  auto pipe = pipe_run("pipe", 3, 2);
  pipe.clip = single.clip;
  train_in_ranks(pipe, 3);
  expect_same_training(single, pipe);
}

TEST_F(TiedParameters, DdpPipeTwoByTwoTrainsAsSingle) {
  auto single = run("single");
  train(single);
  auto parallel = run("ddp_pipe");
  parallel.strategy = "ddp_pipe";
  parallel.devices = 4;
  parallel.stages = 2;
  parallel.chunks = 2;
  train_in_ranks(parallel, 4);
  expect_same_training(single, parallel);
  const auto replica0_last = load_safetensors(parallel.rank_tensors(1));
  const auto replica1_first = load_safetensors(parallel.rank_tensors(2));
  EXPECT_TRUE(torch::equal(replica0_last.at("5.weight"), replica1_first.at("0.weight")));
}

TEST_F(TiedParameters, CheckpointsResumeAcrossLayouts) {
  auto straight = run("straight");
  straight.max_epochs = 4;
  train(straight);

  // Two epochs under pipe, two more under single.
  auto pipe_first = pipe_run("pipe_first", 2, 2);
  train_in_ranks(pipe_first, 2);
  auto then_single = run("then_single");
  then_single.max_epochs = 4;
  then_single.resume = pipe_first.last_checkpoint();
  train(then_single);

  // Two epochs under single, two more under pipe.
  auto single_first = run("single_first");
  train(single_first);
  auto then_pipe = pipe_run("then_pipe", 2, 2);
  then_pipe.max_epochs = 4;
  then_pipe.resume = single_first.last_checkpoint();
  train_in_ranks(then_pipe, 2);

  const auto expected = read_csv_column(metrics_csv(straight.root), "train_loss");
  ASSERT_EQ(expected.size(), 16u);
  for (const auto* resumed : {&then_single, &then_pipe}) {
    SCOPED_TRACE(resumed->root);
    const auto losses = read_csv_column(metrics_csv(resumed->root), "train_loss");
    ASSERT_EQ(losses.size(), 8u);
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], expected[8 + i], 1e-5 * std::abs(expected[8 + i])) << "step " << 8 + i;
    }
    expect_same_weights(straight.final_weights(), resumed->final_weights(), 1e-5);
  }
}

}  // namespace
}  // namespace pipetrain::testing::tied_parameters_test
