// Several tensors across a stage boundary: a user's Sequential whose layers pass a tuple (and a
// std::vector) of tensors on, with a skip connection made on the first layer and used on the
// fourth, an int64 mask, and the raw input riding along, split at every boundary, under both
// schedules and every checkpoint mode, must train exactly as the same Sequential in one process.
// Tolerance: fp32, relative 1e-5 on losses and 1e-5 / 1e-6 (relative / absolute) on parameters,
// as for the plain equivalence test: only the order of the micro-batches' gradient sums differs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "pipetrain/balance.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"
#include "support/carrying_model.h"
#include "support/multiprocess.h"
#include "support/reference.h"

namespace pipetrain::testing::stage_boundary_test {
namespace {

namespace fs = std::filesystem;
using Tensor = at::Tensor;
constexpr int64_t kLayers = kCarryingLayers;

struct Config {
  std::vector<int64_t> balance;
  int64_t chunks;
  std::string checkpoint, schedule;
  bool fused = false;

  std::string name() const {
    std::string text = "b";
    for (auto b : balance) text += std::to_string(b);
    return text + "_c" + std::to_string(chunks) + "_" + checkpoint + "_" + schedule +
           (fused ? "_fused" : "");
  }
};

// Every two-stage cut, and one stage per layer, under every mode and schedule with uneven
// micro-batches (13 rows in 3); one micro-batch, and fused gradient accumulation, at one cut each.
std::vector<Config> configs(int64_t stages) {
  std::vector<std::vector<int64_t>> balances;
  if (stages == 2) {
    for (int64_t cut = 1; cut < kLayers; ++cut) balances.push_back({cut, kLayers - cut});
  } else {
    balances.push_back(std::vector<int64_t>(kLayers, 1));
  }
  std::vector<Config> all;
  for (const auto& balance : balances) {
    for (const std::string mode : {"always", "except_last", "never"}) {
      for (const std::string schedule : {"gpipe", "1f1b", "zbh1", "zbh2"}) {
        all.push_back({balance, 3, mode, schedule});
      }
    }
  }
  all.push_back({balances.back(), 1, "never", "gpipe"});
  all.push_back({balances.front(), 3, "never", "gpipe", true});
  all.push_back({balances.front(), 3, "except_last", "1f1b", true});
  return all;
}

std::string result_path(const std::string& dir, const Config& config, int64_t rank) {
  return dir + "/" + config.name() + "_rank" + std::to_string(rank) + ".pt";
}

// Trains kSteps through a Pipe; saves [losses, evaluation output, this stage's parameters...]
// (losses and output on the last stage only).
void train_pipe(const std::shared_ptr<World>& world, const std::string& dir, const Config& config) {
  Pipe pipe(carrying_model(),
            PipeOptions()
                .balance(config.balance)
                .chunks(config.chunks)
                .checkpoint(config.checkpoint)
                .schedule(config.schedule)
                .fuse_gradient_accumulation(config.fused),
            world);
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(kLearningRate));
  std::vector<Tensor> saved{torch::zeros({kSteps}, torch::kFloat64), torch::zeros({0})};
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [inputs, targets] = reference_batch(step);
    optimizer.zero_grad();
    auto loss =
        pipe.forward_backward(inputs, kBatchSize, [&](const Tensor& out, const MicroBatch& mb) {
          return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
        });
    optimizer.step();
    if (loss.defined()) saved[0][step] = loss.item<double>();
  }
  std::vector<Tensor> outputs;
  pipe.forward(reference_batch(0).first, kBatchSize,
               [&](const Tensor& out, const MicroBatch&) { outputs.push_back(out); });
  if (!outputs.empty()) saved[1] = torch::cat(outputs);
  for (const auto& p : pipe.parameters()) saved.push_back(p.detach());
  torch::save(saved, result_path(dir, config, world->rank()));
}

PIPETRAIN_WORKER(stage_boundary_worker) {
  auto world = World::connect(*select_cluster_environment());
  for (const auto& config : configs(world->size())) {
    train_pipe(world, env_or("RESULT_DIR", "."), config);
  }
}

class StageBoundary : public ::testing::TestWithParam<int64_t> {};

TEST_P(StageBoundary, TuplesAcrossEveryCutTrainAsOneProcess) {
  const int64_t stages = GetParam();
  const auto dir = make_temp_dir("stage-boundary");
  ASSERT_EQ(run_ranks(static_cast<int>(stages), "stage_boundary_worker", {{"RESULT_DIR", dir}}), 0);

  auto reference = carrying_model();
  const auto expected = train_single_process(reference);
  torch::NoGradGuard no_grad;
  const Tensor expected_output = reference->forward(reference_batch(0).first);

  for (const auto& config : configs(stages)) {
    SCOPED_TRACE(config.name());
    std::vector<double> losses;
    Tensor output;
    std::vector<Tensor> parameters;
    for (int64_t rank = 0; rank < stages; ++rank) {
      std::vector<Tensor> saved;
      torch::load(saved, result_path(dir, config, rank));
      if (rank == stages - 1) {
        for (int64_t step = 0; step < kSteps; ++step)
          losses.push_back(saved[0][step].item<double>());
        output = saved[1];
      }
      parameters.insert(parameters.end(), saved.begin() + 2, saved.end());
    }
    for (int64_t step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(losses[step], expected.losses[step], 1e-5 * std::abs(expected.losses[step]))
          << "step " << step;
    }
    EXPECT_TRUE(torch::allclose(output, expected_output, 1e-5, 1e-6));
    ASSERT_EQ(parameters.size(), expected.parameters.size());
    for (size_t i = 0; i < parameters.size(); ++i) {
      EXPECT_TRUE(torch::allclose(parameters[i], expected.parameters[i], 1e-5, 1e-6))
          << "parameter " << i << " differs by "
          << (parameters[i] - expected.parameters[i]).abs().max().item<double>();
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, StageBoundary, ::testing::Values(2, kLayers),
                         [](const auto& info) { return std::to_string(info.param) + "_stages"; });

TEST(StageBoundary, BalanceByTimeRunsTupleLayers) {
  auto model = carrying_model();
  const auto balance = balance_by_time(model, reference_batch(0).first, 2, /*repeats=*/1);
  validate_balance(balance, kLayers);
}

// A layer whose result cannot be sent (a std::pair), and a Sequential ending in a tuple.
struct PairImpl : torch::nn::Module {
  std::pair<Tensor, Tensor> forward(const Tensor& x) { return {x, x}; }
};
TORCH_MODULE(Pair);
struct FirstImpl : torch::nn::Module {
  Tensor forward(const std::pair<Tensor, Tensor>& in) { return in.first; }
};
TORCH_MODULE(First);

PIPETRAIN_WORKER(bad_boundary_worker) {
  auto world = World::connect(*select_cluster_environment());
  const bool pair = env_or("CASE", "") == "pair";
  torch::nn::Sequential model =
      pair ? torch::nn::Sequential(torch::nn::Linear(6, 3), Pair(), First())
           : torch::nn::Sequential(Split(), Block());
  const auto [inputs, targets] = reference_batch(0);
  try {
    Pipe pipe(model,
              PipeOptions().balance(pair ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 1}),
              world);
    pipe.forward_backward(inputs, kBatchSize, [&](const Tensor& out, const MicroBatch& mb) {
      return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
    });
  } catch (const std::exception& e) {
    std::ofstream(env_or("RESULT_DIR", ".") + "/error-" + std::to_string(world->rank()) + ".txt")
        << e.what();
    throw;
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(StageBoundary, UnsendableResultsAreRefusedByName) {
  const auto dir = make_temp_dir("stage-boundary-errors");
  EXPECT_NE(run_ranks(2, "bad_boundary_worker", {{"RESULT_DIR", dir}, {"CASE", "pair"}}), 0);
  const auto pair_error = read_text(dir + "/error-0.txt");
  EXPECT_NE(pair_error.find("layer 1 returns a std::pair"), std::string::npos) << pair_error;
  EXPECT_NE(pair_error.find("std::vector<at::Tensor>"), std::string::npos) << pair_error;

  EXPECT_NE(run_ranks(2, "bad_boundary_worker", {{"RESULT_DIR", dir}, {"CASE", "tuple"}}), 0);
  const auto tuple_error = read_text(dir + "/error-1.txt");
  EXPECT_NE(tuple_error.find("last layer (1) returns a std::tuple of"), std::string::npos)
      << tuple_error;
  EXPECT_NE(tuple_error.find("must be one at::Tensor"), std::string::npos) << tuple_error;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::testing::stage_boundary_test
