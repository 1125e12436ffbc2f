// Pipelined training must equal single-process training on the same initial weights and data:
// every stage count, chunk count (with uneven micro-batches), checkpoint mode and schedule, and
// two stages per rank (interleaved1f1b in loop placement, zbv in V placement; on one rank, stages
// handing over within the process).
// Tolerance: fp32, relative 1e-5 and absolute 1e-6 on every loss and parameter element (the only
// difference allowed is the summation order of per-micro-batch gradients).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"
#include "support/multiprocess.h"
#include "support/reference.h"

namespace pipetrain::testing::pipe_equivalence_test {
namespace {

constexpr uint64_t kSeed = 7;
const std::vector<int64_t> kChunks = {1, 2, 3, 4, 8};
const std::vector<std::string> kModes = {"always", "except_last", "never"};
// "auto" times two steps of zbh1, then may try its finalists in turn before its pick runs.
const std::vector<std::string> kSchedules = {"gpipe",           "1f1b", "zbh1", "zbh2",
                                             "interleaved1f1b", "zbv",  "auto"};

// interleaved1f1b and zbv run 2 stages per rank.
int64_t virtual_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "zbv" ? 2 : 1;
}

// The reference model, with Identity layers after its last where the stages outnumber its
// layers (8 stages of 2 x 4 ranks): the same parameters and outputs.
torch::nn::Sequential model_for(const std::string& schedule, int64_t ranks, double dropout) {
  auto model = make_reference_model(kSeed, dropout);
  while (static_cast<int64_t>(model->size()) < virtual_stages(schedule) * ranks) {
    model->push_back(torch::nn::Identity());
  }
  return model;
}

std::string result_path(const std::string& dir, const std::string& run, int64_t rank) {
  return dir + "/" + run + "_rank" + std::to_string(rank) + ".pt";
}

std::string run_name(int64_t stages, int64_t chunks, const std::string& mode,
                     const std::string& schedule, double dropout) {
  return "s" + std::to_string(stages) + "_c" + std::to_string(chunks) + "_" + mode + "_" +
         schedule + (dropout > 0 ? "_dropout" : "");
}

// Trains kSteps through a Pipe and saves [losses (empty but on the last stage's rank), the layer
// of each of this rank's parameters, the parameters...].
void train_pipe(const std::shared_ptr<World>& world, const std::string& dir, int64_t chunks,
                const std::string& mode, const std::string& schedule, double dropout) {
  Pipe pipe(model_for(schedule, world->size(), dropout),
            PipeOptions().chunks(chunks).checkpoint(mode).schedule(schedule).virtual_stages(
                virtual_stages(schedule)),
            world);
  torch::manual_seed(99 + world->rank());  // dropout masks: the same for every mode
  std::vector<at::Tensor> saved{train_reference_pipe(pipe)};
  const auto named = pipe.stage_module()->named_parameters();
  saved.push_back(torch::empty({static_cast<int64_t>(named.size())}, torch::kInt64));
  for (size_t i = 0; i < named.size(); ++i) {
    saved[1][i] =
        static_cast<int64_t>(std::stoll(named[i].key().substr(0, named[i].key().find('.'))));
    saved.push_back(named[i].value().detach());
  }
  torch::save(saved, result_path(dir, run_name(world->size(), chunks, mode, schedule, dropout),
                                 world->rank()));
}

PIPETRAIN_WORKER(equivalence_worker) {
  auto world = World::connect(*select_cluster_environment());
  const std::string dir = env_or("RESULT_DIR", ".");
  for (int64_t chunks : kChunks) {
    for (const auto& mode : kModes) {
      for (const auto& schedule : kSchedules) train_pipe(world, dir, chunks, mode, schedule, 0.0);
    }
  }
  if (world->size() > 1) {
    for (const auto& mode : kModes) {
      for (const auto& schedule : kSchedules) train_pipe(world, dir, 3, mode, schedule, 0.5);
    }
  }
}

// Losses (from the last stage) and all parameters, in Sequential order, of one pipelined run.
TrainingResult load_run(const std::string& dir, const std::string& run, int64_t stages) {
  TrainingResult result;
  std::vector<std::pair<int64_t, at::Tensor>> by_layer;
  for (int64_t rank = 0; rank < stages; ++rank) {
    std::vector<at::Tensor> saved;
    torch::load(saved, result_path(dir, run, rank));
    if (saved[0].numel() > 0) {  // the rank of the last stage
      for (int64_t step = 0; step < kSteps; ++step) {
        result.losses.push_back(saved[0][step].item<double>());
      }
    }
    for (size_t i = 2; i < saved.size(); ++i) {
      by_layer.emplace_back(saved[1][static_cast<int64_t>(i) - 2].item<int64_t>(), saved[i]);
    }
  }
  // A rank of several stages holds layers that are not consecutive.
  std::stable_sort(by_layer.begin(), by_layer.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [layer, tensor] : by_layer) result.parameters.push_back(tensor);
  return result;
}

class PipeEquivalence : public ::testing::TestWithParam<int64_t> {};

TEST_P(PipeEquivalence, MatchesSingleProcessForEveryChunkCountModeAndSchedule) {
  const int64_t stages = GetParam();
  const auto dir = make_temp_dir("pipe-equivalence");
  ASSERT_EQ(run_ranks(static_cast<int>(stages), "equivalence_worker", {{"RESULT_DIR", dir}}), 0);

  const auto expected = train_single_process(make_reference_model(kSeed));
  for (int64_t chunks : kChunks) {
    for (const auto& mode : kModes) {
      for (const auto& schedule : kSchedules) {
        const auto run = run_name(stages, chunks, mode, schedule, 0.0);
        SCOPED_TRACE(run);
        const auto actual = load_run(dir, run, stages);
        ASSERT_EQ(actual.losses.size(), expected.losses.size());
        for (size_t step = 0; step < expected.losses.size(); ++step) {
          EXPECT_NEAR(actual.losses[step], expected.losses[step],
                      1e-5 * std::abs(expected.losses[step]))
              << "step " << step;
        }
        ASSERT_EQ(actual.parameters.size(), expected.parameters.size());
        for (size_t i = 0; i < expected.parameters.size(); ++i) {
          EXPECT_TRUE(torch::allclose(actual.parameters[i], expected.parameters[i], 1e-5, 1e-6))
              << "parameter " << i << " differs by "
              << (actual.parameters[i] - expected.parameters[i]).abs().max().item<double>();
        }
      }
    }
  }

  if (stages > 1) {
    // With dropout, recomputation replays the same masks: the modes agree exactly.
    for (const auto& schedule : kSchedules) {
      const auto never = load_run(dir, run_name(stages, 3, "never", schedule, 0.5), stages);
      for (const auto& mode : {"always", "except_last"}) {
        SCOPED_TRACE(std::string(mode) + " " + schedule);
        const auto other = load_run(dir, run_name(stages, 3, mode, schedule, 0.5), stages);
        EXPECT_EQ(other.losses, never.losses);
        for (size_t i = 0; i < never.parameters.size(); ++i) {
          EXPECT_TRUE(torch::equal(other.parameters[i], never.parameters[i])) << "parameter " << i;
        }
      }
    }
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, PipeEquivalence, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "_stages"; });

}  // namespace
}  // namespace pipetrain::testing::pipe_equivalence_test
