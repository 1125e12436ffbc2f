// Pipelined training on GPUs (one process per GPU, NCCL between them) against training on one GPU,
// the Trainer's precision on CUDA, and pipetrain::nn's fused rotary, SwiGLU and RMSNorm kernels
// against ATen's expressions. Skipped without two GPUs (or one, for the Trainer and kernel tests).
// Tolerances: fp32 as on CPU (relative 1e-5, absolute 1e-6: only the summation order of
// micro-batch gradients differs); bf16 relative 2e-2 on losses and 1e-2 + 2e-3 absolute on
// parameters (bf16 keeps 8 bits of mantissa, and each micro-batch's gradient is rounded to bf16
// before it is summed).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <tuple>

#include "ops/fused_linear.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/cross_entropy.h"
#include "pipetrain/linear.h"
#include "pipetrain/module.h"
#include "pipetrain/nn/mlp.h"
#include "pipetrain/nn/rms_norm.h"
#include "pipetrain/nn/rotary_embedding.h"
#include "pipetrain/pipe.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"
#include "support/carrying_model.h"
#include "support/multiprocess.h"
#include "support/reference.h"
#include "support/small_models.h"
#include "util/compat.h"

namespace pipetrain::testing::pipe_cuda_test {
namespace {

constexpr uint64_t kSeed = 7;
const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "zbh1", "zbh2"};
const std::vector<std::string> kModes = {"never", "always"};
const std::vector<c10::ScalarType> kDtypes = {torch::kFloat, torch::kBFloat16};

std::string run_name(const std::string& schedule, const std::string& mode, c10::ScalarType dtype,
                     bool graphs = false, bool fused = false) {
  return schedule + "_" + mode + "_" + c10::toString(dtype) + (graphs ? "_graphs" : "") +
         (fused ? "_fused" : "");
}

std::string result_path(const std::string& dir, const std::string& run, int64_t rank) {
  return dir + "/" + run + "_rank" + std::to_string(rank) + ".pt";
}

// What the optimizer does to the gradients before each step: resets them to none, zeroes them,
// or resets them before even steps only (an odd step adds to the gradients of the step before).
enum class Reset { kToNone, kToZeros, kEveryOtherStep };

// kSteps of SGD through `pipe` on the reference batches in `dtype`, MSE loss against the targets
// on `device`. With `bf16_autocast`, each step's forward and backward run under autocast to bf16
// (its cache cleared after, as the Trainer does) and the loss is taken in fp32. [losses,
// parameters...] of this rank; its losses where it runs the last stage, else zeros. With
// `weight_penalty` (one process) the loss also reads a parameter of the stage: 1e-3 times its first
// parameter's squared sum, a gradient given to it outside the stage's backward.
std::vector<at::Tensor> train_reference_steps(Pipe& pipe, c10::Device device,
                                              c10::ScalarType dtype = torch::kFloat,
                                              bool bf16_autocast = false,
                                              Reset reset = Reset::kToNone,
                                              bool weight_penalty = false) {
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(kLearningRate));
  std::vector<at::Tensor> saved{torch::zeros({kSteps}, torch::kFloat64)};
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [inputs, targets] = reference_batch(step);
    const auto on_gpu = targets.to(device, dtype);
    if (reset != Reset::kEveryOtherStep || step % 2 == 0) {
      torch::NoGradGuard no_grad;
      for (auto& p : pipe.parameters()) {
        if (reset != Reset::kToZeros) {
          p.mutable_grad() = at::Tensor();
        } else if (p.grad().defined()) {
          p.mutable_grad().zero_();
        }
      }
    }
    if (bf16_autocast) set_autocast_to_bf16(c10::DeviceType::CUDA, true);
    auto loss = pipe.forward_backward(
        inputs.to(dtype), kBatchSize, [&](const at::Tensor& out, const MicroBatch& mb) {
          auto loss = torch::mse_loss(bf16_autocast ? out.to(torch::kFloat) : out,
                                      on_gpu.slice(0, mb.begin, mb.end));
          if (weight_penalty) loss = loss + 1e-3 * pipe.parameters()[0].pow(2).sum();
          return loss;
        });
    if (bf16_autocast) {
      set_autocast_to_bf16(c10::DeviceType::CUDA, false);
      at::autocast::clear_cache();
    }
    optimizer.step();
    if (loss.defined()) saved[0][step] = loss.item<double>();
  }
  for (const auto& p : pipe.parameters()) saved.push_back(p.detach().cpu());
  return saved;
}

PIPETRAIN_WORKER(cuda_pipe_worker) {
  auto world =
      World::connect(*select_cluster_environment(), World::kDefaultTimeout, c10::DeviceType::CUDA);
  const std::string dir = env_or("RESULT_DIR", ".");
  for (const auto& schedule : kSchedules) {
    for (const auto& [mode, graphs, fused] :
         {std::tuple<std::string, bool, bool>{"never", false, false},
          {"always", false, false},
          {"never", true, false},
          {"never", false, true},
          {"never", true, true}}) {
      for (const auto dtype : kDtypes) {
        auto model = make_reference_model(kSeed);
        model->to(dtype);
        Pipe pipe(model,
                  PipeOptions()
                      .balance({3, 4})
                      .chunks(4)
                      .checkpoint(mode)
                      .schedule(schedule)
                      .cuda_graphs(graphs)
                      .fuse_gradient_accumulation(fused),
                  world);
        torch::save(
            train_reference_steps(pipe, world->device(), dtype),
            result_path(dir, run_name(schedule, mode, dtype, graphs, fused), world->rank()));
      }
    }
  }
}

// [losses, parameters...] of a two-stage run, parameters in Sequential order.
std::vector<at::Tensor> load_run(const std::string& dir, const std::string& run) {
  std::vector<at::Tensor> result, saved;
  for (int64_t rank = 1; rank >= 0; --rank) {
    saved.clear();  // torch::load appends
    torch::load(saved, result_path(dir, run, rank));
    if (rank == 1) result.push_back(saved[0]);
    result.insert(result.begin() + 1, saved.begin() + 1, saved.end());
  }
  return result;
}

TEST(CudaPipe, TwoGpusMatchOneGpuForEveryScheduleModeAndDtype) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const auto dir = make_temp_dir("cuda-pipe");
  ASSERT_EQ(run_ranks(2, "cuda_pipe_worker", {{"RESULT_DIR", dir}}), 0);
  for (const auto dtype : kDtypes) {
    const bool bf16 = dtype == torch::kBFloat16;
    const auto expected = train_single_process(make_reference_model(kSeed),
                                               c10::Device(c10::DeviceType::CUDA, 0), dtype);
    for (const auto& schedule : kSchedules) {
      for (const auto& mode : kModes) {
        const auto run = run_name(schedule, mode, dtype);
        SCOPED_TRACE(run);
        const auto run_result = load_run(dir, run);
        const at::Tensor losses = run_result[0];
        const std::vector<at::Tensor> parameters(run_result.begin() + 1, run_result.end());
        for (int64_t step = 0; step < kSteps; ++step) {
          const double loss = losses[step].item<double>();
          EXPECT_NEAR(loss, expected.losses[step],
                      (bf16 ? 2e-2 : 1e-5) * std::abs(expected.losses[step]))
              << "step " << step;
        }
        ASSERT_EQ(parameters.size(), expected.parameters.size());
        for (size_t i = 0; i < parameters.size(); ++i) {
          EXPECT_TRUE(torch::allclose(parameters[i].to(torch::kFloat),
                                      expected.parameters[i].to(torch::kFloat), bf16 ? 1e-2 : 1e-5,
                                      bf16 ? 2e-3 : 1e-6))
              << "parameter " << i;
        }
      }
    }
  }
}

// The carrying model (several tensors between its layers) under cuda_graphs: one stage captures
// the tuples inside its graph; two stages pass them across the boundary, which graphs do not
// capture, so each stage falls back to eager and says so. [losses, parameters...] per rank.
PIPETRAIN_WORKER(cuda_carrying_worker) {
  auto world =
      World::connect(*select_cluster_environment(), World::kDefaultTimeout, c10::DeviceType::CUDA);
  const auto balance = world->size() == 1 ? std::vector<int64_t>{kCarryingLayers}
                                          : std::vector<int64_t>{2, kCarryingLayers - 2};
  Pipe pipe(carrying_model(),
            PipeOptions().balance(balance).chunks(4).checkpoint("never").cuda_graphs(true), world);
  torch::save(train_reference_steps(pipe, world->device()),
              result_path(env_or("RESULT_DIR", "."), "carrying", world->rank()));
}

// fp32 on one GPU: relative 1e-5 on losses, 1e-5 / 1e-6 on parameters (summation order only).
void expect_carrying_run_matches_one_gpu(const std::string& dir, int64_t ranks) {
  const auto expected =
      train_single_process(carrying_model(), c10::Device(c10::DeviceType::CUDA, 0));
  std::vector<at::Tensor> parameters, saved;
  at::Tensor losses;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    saved.clear();  // torch::load appends
    torch::load(saved, result_path(dir, "carrying", rank));
    if (rank == ranks - 1) losses = saved[0];
    parameters.insert(parameters.end(), saved.begin() + 1, saved.end());
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(losses[step].item<double>(), expected.losses[step],
                1e-5 * std::abs(expected.losses[step]))
        << "step " << step;
  }
  ASSERT_EQ(parameters.size(), expected.parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(torch::allclose(parameters[i], expected.parameters[i], 1e-5, 1e-6))
        << "parameter " << i;
  }
}

TEST(CudaPipe, CudaGraphsCaptureTuplesInsideAStage) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = make_temp_dir("cuda-carrying-1");
  ASSERT_EQ(run_ranks(1, "cuda_carrying_worker", {{"RESULT_DIR", dir}}), 0);
  expect_carrying_run_matches_one_gpu(dir, 1);
}

TEST(CudaPipe, TuplesAcrossAStageBoundaryRunEagerlyUnderCudaGraphs) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const auto dir = make_temp_dir("cuda-carrying-2");
  ASSERT_EQ(run_ranks(2, "cuda_carrying_worker", {{"RESULT_DIR", dir}}), 0);
  expect_carrying_run_matches_one_gpu(dir, 2);
}

// bf16-mixed (autocast to bf16 around each step, its cache cleared after, as the Trainer does)
// on one GPU, 4 micro-batches, eager and under CUDA graphs, which must capture autocast's casts
// of the weights: a replay reading the copies an earlier step's cache freed would train on
// garbage. [losses, parameters...] per run, and the run fails if graphs stepped aside.
PIPETRAIN_WORKER(cuda_autocast_graphs_worker) {
  auto world =
      World::connect(*select_cluster_environment(), World::kDefaultTimeout, c10::DeviceType::CUDA);
  for (const bool graphs : {false, true}) {
    Pipe pipe(make_reference_model(kSeed),
              PipeOptions().chunks(4).checkpoint("never").schedule("1f1b").cuda_graphs(graphs),
              world);
    const auto saved = train_reference_steps(pipe, world->device(), torch::kFloat, true);
    if (graphs && pipe.execution() != "CUDA graphs") {
      throw std::runtime_error("expected CUDA graphs, ran " + pipe.execution());
    }
    torch::save(saved, result_path(env_or("RESULT_DIR", "."), graphs ? "graphs" : "eager", 0));
  }
}

// The [losses, parameters...] a worker saved in `dir` as PREFIX"graphs" equal PREFIX"eager", the
// losses positive, within relative `rtol` and absolute `atol`.
void expect_graphs_match_eager(const std::string& dir, const std::string& prefix, double rtol,
                               double atol) {
  std::vector<at::Tensor> eager, graphs;
  torch::load(eager, result_path(dir, prefix + "eager", 0));
  torch::load(graphs, result_path(dir, prefix + "graphs", 0));
  ASSERT_EQ(eager.size(), graphs.size());
  EXPECT_GT(eager[0][0].item<double>(), 0.0);
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(torch::allclose(graphs[i], eager[i], rtol, atol))
        << (i == 0 ? "losses" : "parameter " + std::to_string(i - 1)) << ": off by "
        << (graphs[i] - eager[i]).abs().max().item<double>();
  }
}

// Graphs replay the eager step's kernels: relative 1e-5, absolute 1e-6 (fp32 master weights).
TEST(CudaPipe, CudaGraphsUnderBf16MixedTrainAsEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = make_temp_dir("cuda-autocast-graphs");
  ASSERT_EQ(run_ranks(1, "cuda_autocast_graphs_worker", {{"RESULT_DIR", dir}}), 0);
  expect_graphs_match_eager(dir, "", 1e-5, 1e-6);
}

// The runs of cuda_graphs_reset_worker: schedule x reset x weight penalty.
std::vector<std::string> reset_runs() {
  std::vector<std::string> runs;
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    for (const int reset : {0, 1, 2}) {
      for (const std::string penalty : {"", "_penalty"}) {
        runs.push_back(schedule + "_reset" + std::to_string(reset) + penalty);
      }
    }
  }
  return runs;
}

// One GPU, graphs and eager, GPipe and 1F1B over micro-batches of 4, 3, 3 and 3 rows, under each
// way of resetting gradients, with and without a loss that reads a parameter: a step's first
// backward writes the gradients where they were reset to none (from the graphs that have a
// backward for it, or from zeros) and nothing else gave them one, and adds to them otherwise.
// [losses, parameters...] per run.
PIPETRAIN_WORKER(cuda_graphs_reset_worker) {
  auto world =
      World::connect(*select_cluster_environment(), World::kDefaultTimeout, c10::DeviceType::CUDA);
  for (const auto& run : reset_runs()) {
    const std::string schedule = run.substr(0, run.find('_'));
    const auto reset = static_cast<Reset>(run[run.find("reset") + 5] - '0');
    const bool penalty = run.find("penalty") != std::string::npos;
    for (const bool graphs : {false, true}) {
      Pipe pipe(make_reference_model(kSeed),
                PipeOptions().chunks(4).checkpoint("never").schedule(schedule).cuda_graphs(graphs),
                world);
      const auto saved =
          train_reference_steps(pipe, world->device(), torch::kFloat, false, reset, penalty);
      if (graphs && pipe.execution() != "CUDA graphs") {
        throw std::runtime_error("expected CUDA graphs, ran " + pipe.execution());
      }
      torch::save(saved,
                  result_path(env_or("RESULT_DIR", "."), run + (graphs ? "_graphs" : "_eager"), 0));
    }
  }
}

// Graphs replay the eager step's kernels: relative 1e-6, absolute 1e-7 (fp32).
TEST(CudaPipe, CudaGraphsWriteOrAddGradientsAsEagerDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = make_temp_dir("cuda-graphs-reset");
  ASSERT_EQ(run_ranks(1, "cuda_graphs_reset_worker", {{"RESULT_DIR", dir}}), 0);
  for (const auto& run : reset_runs()) {
    SCOPED_TRACE(run);
    expect_graphs_match_eager(dir, run + "_", 1e-6, 1e-7);
  }
}

// An in-place loss over the last stage's output (chunked_cross_entropy_ writes its gradient over
// the logits), one GPU, 3 SGD steps of 2 micro-batches, eager then CUDA graphs: with a Linear last
// (whose backward does not read its output) the runs save [losses, parameters...] as
// in_place_linear_{eager,graphs}; with a Tanh last (whose backward reads its output) each run's
// error goes to in_place_tanh_{eager,graphs}.txt ("none" if it trained).
PIPETRAIN_WORKER(cuda_graphs_in_place_loss_worker) {
  auto world =
      World::connect(*select_cluster_environment(), World::kDefaultTimeout, c10::DeviceType::CUDA);
  const std::string dir = env_or("RESULT_DIR", ".");
  torch::manual_seed(4);
  const auto inputs = torch::randn({8, 6});
  const auto targets = torch::randint(0, 5, {8}, torch::kLong).to(world->device());
  for (const bool tanh_last : {false, true}) {
    for (const bool graphs : {false, true}) {
      torch::manual_seed(3);
      torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                                  torch::nn::Linear(16, 5));
      if (tanh_last) model->push_back(torch::nn::Tanh());
      Pipe pipe(model, PipeOptions().chunks(2).checkpoint("never").cuda_graphs(graphs), world);
      if (graphs && pipe.execution() != "CUDA graphs") {
        throw std::runtime_error("expected CUDA graphs, ran " + pipe.execution());
      }
      torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(0.1));
      std::vector<at::Tensor> saved{torch::zeros({3}, torch::kFloat64)};
      std::string error = "none";
      try {
        for (int64_t step = 0; step < 3; ++step) {
          optimizer.zero_grad();
          const auto loss =
              pipe.forward_backward(inputs, 8, [&](const at::Tensor& out, const MicroBatch& mb) {
                return chunked_cross_entropy_(out, targets.slice(0, mb.begin, mb.end));
              });
          optimizer.step();
          saved[0][step] = loss.item<double>();
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      const std::string run = std::string("in_place_") + (tanh_last ? "tanh_" : "linear_") +
                              (graphs ? "graphs" : "eager");
      if (tanh_last) {
        std::ofstream(dir + "/" + run + ".txt") << error;
        continue;
      }
      if (error != "none") throw std::runtime_error(run + ": " + error);
      for (const auto& p : pipe.parameters()) saved.push_back(p.detach().cpu());
      torch::save(saved, result_path(dir, run, 0));
    }
  }
}

// Under CUDA graphs an in-place loss trains as eager where the stage's backward does not read its
// output (relative 1e-6, absolute 1e-7: fp32), and is refused, as eager refuses it, where it does:
// a replay would read the gradient written over the output as the output.
TEST(CudaPipe, CudaGraphsTakeAnInPlaceLossAsEagerDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = make_temp_dir("cuda-graphs-in-place");
  ASSERT_EQ(run_ranks(1, "cuda_graphs_in_place_loss_worker", {{"RESULT_DIR", dir}}), 0);
  expect_graphs_match_eager(dir, "in_place_linear_", 1e-6, 1e-7);
  const auto read = [&](const std::string& run) {
    std::ifstream file(dir + "/in_place_tanh_" + run + ".txt");
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  EXPECT_NE(read("eager").find("modified by an inplace operation"), std::string::npos)
      << read("eager");
  EXPECT_NE(read("graphs").find("changed in place after its forward"), std::string::npos)
      << read("graphs");
}

class Regression : public SgdModule {
 public:
  Regression() : SgdModule(tanh_mlp({3, 32, 1}), 0.05) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data).to(torch::kFloat), batch.target);
    log("train_loss", loss);
    return loss;
  }
};

// Micro-batches of 4, 3, 3 and 3 rows: two shapes, so two sets of graphs per slot. And the Linear
// layers accumulating gradients inside their GEMMs, eager and captured.
TEST(CudaPipe, CudaGraphsAndFusedAccumulationGiveWhatEagerGives) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const auto dir = make_temp_dir("cuda-graphs");
  ASSERT_EQ(run_ranks(2, "cuda_pipe_worker", {{"RESULT_DIR", dir}}), 0);
  for (const auto& schedule : kSchedules) {
    for (const auto dtype : kDtypes) {
      SCOPED_TRACE(run_name(schedule, "never", dtype));
      const auto eager = load_run(dir, run_name(schedule, "never", dtype));
      const auto graphs = load_run(dir, run_name(schedule, "never", dtype, true));
      ASSERT_EQ(graphs.size(), eager.size());
      for (size_t i = 0; i < eager.size(); ++i) {
        EXPECT_TRUE(
            torch::allclose(graphs[i].to(torch::kFloat), eager[i].to(torch::kFloat), 1e-6, 1e-7))
            << (i == 0 ? "losses" : "parameter " + std::to_string(i - 1));
      }
      // Fused accumulation rounds once where eager rounds twice: fp32 1e-5, bf16 as 2 GPUs vs 1.
      const bool bf16 = dtype == torch::kBFloat16;
      const auto fused = load_run(dir, run_name(schedule, "never", dtype, false, true));
      ASSERT_EQ(fused.size(), eager.size());
      for (size_t i = 0; i < eager.size(); ++i) {
        EXPECT_TRUE(torch::allclose(fused[i].to(torch::kFloat), eager[i].to(torch::kFloat),
                                    bf16 ? 2e-2 : 1e-5, bf16 ? 2e-3 : 1e-6))
            << "fused accumulation, " << (i == 0 ? "losses" : "parameter " + std::to_string(i - 1));
      }
      // Captured, fused accumulation does what it does eagerly.
      const auto fused_graphs = load_run(dir, run_name(schedule, "never", dtype, true, true));
      ASSERT_EQ(fused_graphs.size(), fused.size());
      for (size_t i = 0; i < fused.size(); ++i) {
        EXPECT_TRUE(torch::allclose(fused_graphs[i].to(torch::kFloat), fused[i].to(torch::kFloat),
                                    1e-6, 1e-7))
            << "fused accumulation under CUDA graphs, "
            << (i == 0 ? "losses" : "parameter " + std::to_string(i - 1));
      }
    }
  }
}

// One GPU, the reference model with a dropout of 0.5, 4 micro-batches a step, 3 SGD steps under
// checkpoint `never` and `always` from the same seed: [losses, parameters...] of each as
// dropout_<mode>.pt.
PIPETRAIN_WORKER(cuda_dropout_recompute_worker) {
  auto world =
      World::connect(*select_cluster_environment(), World::kDefaultTimeout, c10::DeviceType::CUDA);
  for (const std::string mode : {"never", "always"}) {
    Pipe pipe(make_reference_model(kSeed, 0.5),
              PipeOptions().chunks(4).checkpoint(mode).schedule("gpipe"), world);
    torch::manual_seed(11);  // the CUDA generator's masks: the same for both modes
    const auto saved =
        train_reference_steps(pipe, world->device(), torch::kFloat, false, Reset::kToNone, false);
    torch::save(saved, result_path(env_or("RESULT_DIR", "."), "dropout_" + mode, 0));
  }
}

// Dropout on a GPU draws from the CUDA generator: a recomputed forward must draw the masks its
// first forward drew, or the backward differentiates through other masks than the loss saw (the
// recompute once put back the CPU generator alone). The modes run the same kernels on the same
// masks: relative 1e-6, absolute 1e-7 (fp32).
TEST(CudaPipe, RecomputedDropoutOnTheGpuDrawsTheMasksOfItsForward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = make_temp_dir("cuda-dropout-recompute");
  ASSERT_EQ(run_ranks(1, "cuda_dropout_recompute_worker", {{"RESULT_DIR", dir}}), 0);
  std::vector<at::Tensor> never, always;
  torch::load(never, result_path(dir, "dropout_never", 0));
  torch::load(always, result_path(dir, "dropout_always", 0));
  ASSERT_EQ(never.size(), always.size());
  for (size_t i = 0; i < never.size(); ++i) {
    EXPECT_TRUE(torch::allclose(always[i], never[i], 1e-6, 1e-7))
        << (i == 0 ? "losses" : "parameter " + std::to_string(i - 1)) << " differ by "
        << (always[i] - never[i]).abs().max().item<double>();
  }
  std::filesystem::remove_all(dir);
}

TEST(CudaTrainer, Bf16MixedKeepsFp32MasterWeightsOnTheGpuAndLearns) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto root = make_temp_dir("cuda-trainer");
  Trainer trainer(TrainerOptions()
                      .accelerator("cuda")
                      .precision("bf16-mixed")
                      .max_epochs(20)
                      .log_every_n_steps(1)
                      .default_root_dir(root)
                      .enable_progress_bar(false));
  Regression model;
  torch::manual_seed(1);
  auto x = torch::randn({64, 3});
  trainer.fit(model, DataLoader({x, x.sum(1, true)}, DataLoaderOptions().batch_size(16)));
  for (const auto& p : model.parameters()) {
    EXPECT_TRUE(p.is_cuda());
    EXPECT_EQ(p.scalar_type(), torch::kFloat);
  }
  EXPECT_LT(trainer.callback_metrics().at("train_loss"), 0.5);
}

// The regression with a dropout between its layers, which on a GPU draws from the CUDA generator.
class DropoutRegression : public SgdModule {
 public:
  DropoutRegression()
      : SgdModule(torch::nn::Sequential(torch::nn::Linear(3, 32), torch::nn::Dropout(0.5),
                                        torch::nn::Linear(32, 1)),
                  0.05) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::mse_loss(forward(batch.data), batch.target);
  }
};

// A checkpoint kept the CPU generator alone: a fit resumed on a GPU drew its dropout masks from a
// freshly seeded CUDA generator, other masks than the uninterrupted fit's. Resumed at step 3 of 6,
// it ends with the uninterrupted fit's weights exactly.
TEST(CudaTrainer, AResumedFitDrawsTheDropoutMasksOfAnUninterruptedOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto root = make_temp_dir("cuda-dropout-resume");
  torch::manual_seed(1);
  const auto x = torch::randn({64, 3});
  const DataLoader loader({x, x.sum(1, true)}, DataLoaderOptions().batch_size(16));
  auto fit = [&](int64_t steps, const std::string& resume, const std::string& save) {
    Trainer trainer(TrainerOptions()
                        .accelerator("cuda")
                        .max_steps(steps)
                        .loggers({})
                        .enable_checkpointing(false)
                        .enable_progress_bar(false));
    DropoutRegression model;
    trainer.fit(model, loader, nullptr, resume);
    if (!save.empty()) trainer.save_checkpoint(save);
    std::vector<at::Tensor> weights;
    for (const auto& p : model.parameters()) weights.push_back(p.detach().cpu());
    return weights;
  };
  const auto uninterrupted = fit(6, "", "");
  fit(3, "", root + "/step-3.ckpt");
  const auto resumed = fit(6, root + "/step-3.ckpt", "");
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed[i], uninterrupted[i]))
        << "parameter " << i << " differs by "
        << (resumed[i] - uninterrupted[i]).abs().max().item<double>();
  }
  std::filesystem::remove_all(root);
}

// Batches prepared ahead (pinned, copied on a side stream) train exactly as batches read when the
// step asks for them, also with extra fields and a dataset already on the GPU.
TEST(CudaTrainer, PrefetchedBatchesTrainAsBatchesReadInTheStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(1);
  const auto x = torch::randn({96, 3});
  auto fit = [&](int64_t workers, bool on_gpu) {
    Trainer trainer(TrainerOptions()
                        .accelerator("cuda")
                        .max_epochs(3)
                        .loggers({})
                        .enable_checkpointing(false)
                        .enable_progress_bar(false));
    torch::manual_seed(2);
    Regression model;
    const auto device = on_gpu ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
    trainer.fit(model,
                DataLoader(TensorDataset(x.to(device), x.sum(1, true).to(device),
                                         {{"weight", torch::ones({96}).to(device)}}),
                           DataLoaderOptions().batch_size(8).shuffle(true).num_workers(workers)));
    std::vector<at::Tensor> weights;
    for (const auto& p : model.parameters()) weights.push_back(p.detach().cpu());
    return weights;
  };
  const auto expected = fit(0, false);
  for (const auto& [workers, on_gpu] :
       std::vector<std::pair<int64_t, bool>>{{2, false}, {1, true}}) {
    const auto actual = fit(workers, on_gpu);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::equal(actual[i], expected[i]))
          << "workers " << workers << ", parameter " << i;
    }
  }
}

// `actual` is `expected` (what ATen's expression gives) in dtype and shape, and within `tolerance`
// relative of each value or, where values cancel, of the largest.
void expect_as_aten(const at::Tensor& actual, const at::Tensor& expected, double tolerance,
                    const std::string& what) {
  ASSERT_TRUE(actual.defined() && expected.defined()) << what;
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const auto a = actual.to(torch::kFloat), e = expected.to(torch::kFloat);
  const double largest = e.abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(a, e, tolerance, tolerance * largest))
      << what << ": largest difference " << (a - e).abs().max().item<double>() << ", largest value "
      << largest;
}

// The fused kernels (in a build with nvcc; ATen's expressions otherwise) compute in fp32 and round
// once: fp32 results within relative 1e-6, those computed from bf16 within bf16's rounding
// (relative 1e-2), where ATen rounds each intermediate product to bf16.
constexpr double kFp32Tolerance = 1e-6;
constexpr double kBf16Tolerance = 1e-2;
// A norm's fp32 results: sums over thousands of elements, added in another order than ATen's.
constexpr double kNormFp32Tolerance = 1e-5;

at::Tensor aten_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto halves = x.chunk(2, -1);
  return x * cos + torch::cat({-halves[1], halves[0]}, -1) * sin;
}

// q and k [B, H, T, D] as attention makes them (transposed views of projections [B, T, H * D], k
// with fewer heads), rotated together, and a contiguous x [B, H, T, D] rotated alone, by
// pipetrain's RotaryEmbedding (`ours`) or by ATen's expression on its tables, then given random
// gradients. {rotated q, k and x, the gradients of the q and k projections and of x}.
std::vector<at::Tensor> rotate_heads(bool ours, at::ScalarType dtype, bool autocast,
                                     int64_t head_dim) {
  torch::manual_seed(11);
  const int64_t batch = 2, time = 40, heads = 4, kv_heads = 2;
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  const auto q_proj = torch::randn({batch, time, heads * head_dim}, options).requires_grad_(true);
  const auto k_proj =
      torch::randn({batch, time, kv_heads * head_dim}, options).requires_grad_(true);
  const auto x = torch::randn({batch, heads, time, head_dim}, options).requires_grad_(true);
  const auto q = q_proj.view({batch, time, heads, head_dim}).transpose(1, 2);
  const auto k = k_proj.view({batch, time, kv_heads, head_dim}).transpose(1, 2);
  nn::RotaryEmbedding rotary{nn::RotaryEmbeddingOptions(head_dim)};
  if (autocast) set_autocast_to_bf16(c10::DeviceType::CUDA, true);
  at::Tensor q_out, k_out, x_out;
  if (ours) {
    std::tie(q_out, k_out) = rotary->rotate(q, k);
    x_out = rotary->forward(x);
  } else {
    // Under autocast the tables are fp32 and a bf16 q comes out fp32.
    const auto [cos, sin] = rotary->tables(time, q.device(), autocast ? torch::kFloat : dtype);
    q_out = aten_rotary(q, cos, sin);
    k_out = aten_rotary(k, cos, sin);
    x_out = aten_rotary(x, cos, sin);
  }
  if (autocast) {
    set_autocast_to_bf16(c10::DeviceType::CUDA, false);
    at::autocast::clear_cache();
  }
  const std::vector<at::Tensor> outputs{q_out, k_out, x_out};
  std::vector<at::Tensor> grads;
  for (const auto& output : outputs) {
    grads.push_back(torch::randn(output.sizes(), output.options()));
  }
  torch::autograd::backward(outputs, grads);
  return {q_out.detach(), k_out.detach(), x_out.detach(), q_proj.grad(), k_proj.grad(), x.grad()};
}

// fp32, bf16, and bf16 q and k under autocast (fp32 tables, fp32 results, bf16 gradients), for
// head_dims of Llama (64, 128) and one whose half the kernels cannot read 8 bf16 at a time (24).
TEST(CudaKernels, RotaryEmbeddingGivesWhatAtensExpressionGives) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const char* names[] = {
      "q", "k", "x", "q projection's gradient", "k projection's gradient", "x's gradient"};
  for (const auto& [dtype, autocast] : std::vector<std::pair<at::ScalarType, bool>>{
           {torch::kFloat, false}, {torch::kBFloat16, false}, {torch::kBFloat16, true}}) {
    for (const int64_t head_dim : {64, 128, 24}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (autocast ? " under autocast" : "") +
                   ", head_dim " + std::to_string(head_dim));
      const auto expected = rotate_heads(false, dtype, autocast, head_dim);
      const auto actual = rotate_heads(true, dtype, autocast, head_dim);
      for (size_t i = 0; i < expected.size(); ++i) {
        // Under autocast the rotated q, k and x are fp32 products of a bf16 value and an fp32
        // table, as ATen's: only their gradients are rounded to bf16.
        const bool fp32 = expected[i].scalar_type() == torch::kFloat;
        expect_as_aten(actual[i], expected[i], fp32 ? kFp32Tolerance : kBf16Tolerance, names[i]);
      }
    }
  }
}

// Attention asks for q and k in autocast's dtype: the rotation rounded once in its own pass must be
// the fp32 rotation cast afterwards, to the bit, and so must the gradients that go back through it
// (head_dim 64 read 8 bf16 at a time, 24 one at a time).
TEST(CudaKernels, RotaryIntoAutocastsDtypeIsTheFp32RotationCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t head_dim : {64, 24}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    torch::manual_seed(13);
    const int64_t batch = 2, time = 40, heads = 4, kv_heads = 2;
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    const auto q_data = torch::randn({batch, time, heads * head_dim}, options);
    const auto k_data = torch::randn({batch, time, kv_heads * head_dim}, options);
    const auto grad_q = torch::randn({batch, heads, time, head_dim}, options);
    const auto grad_k = torch::randn({batch, kv_heads, time, head_dim}, options);
    nn::RotaryEmbedding rotary{nn::RotaryEmbeddingOptions(head_dim)};
    std::vector<at::Tensor> results[2];
    for (const bool into_bf16 : {false, true}) {
      const auto q_proj = q_data.clone().requires_grad_(true);
      const auto k_proj = k_data.clone().requires_grad_(true);
      const auto q = q_proj.view({batch, time, heads, head_dim}).transpose(1, 2);
      const auto k = k_proj.view({batch, time, kv_heads, head_dim}).transpose(1, 2);
      set_autocast_to_bf16(c10::DeviceType::CUDA, true);
      at::Tensor q_out, k_out;
      if (into_bf16) {
        std::tie(q_out, k_out) = rotary->rotate(q, k, torch::kBFloat16);
      } else {
        std::tie(q_out, k_out) = rotary->rotate(q, k);
        EXPECT_EQ(q_out.scalar_type(), torch::kFloat);
        q_out = q_out.to(torch::kBFloat16);
        k_out = k_out.to(torch::kBFloat16);
      }
      set_autocast_to_bf16(c10::DeviceType::CUDA, false);
      at::autocast::clear_cache();
      torch::autograd::backward({q_out, k_out}, {grad_q, grad_k});
      results[into_bf16] = {q_out.detach(), k_out.detach(), q_proj.grad(), k_proj.grad()};
    }
    const char* names[] = {"q", "k", "q projection's gradient", "k projection's gradient"};
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(results[1][i].scalar_type(), torch::kBFloat16) << names[i];
      EXPECT_TRUE(torch::equal(results[1][i], results[0][i])) << names[i];
    }
  }
}

// forward(x) for x [batch, time, 64] of `dtype` on the GPU (under bf16 autocast if asked; inside a
// FusedLinearScope, accumulating weight gradients in place as a pipe step with
// fuse_gradient_accumulation does, if `fused`), then a random gradient: {the output, x's gradient,
// then the gradient of each of `weights`}.
using MlpForward = std::function<at::Tensor(const at::Tensor&)>;
std::vector<at::Tensor> mlp_forward_backward(const MlpForward& forward,
                                             std::array<int64_t, 2> batch_time,
                                             at::ScalarType dtype, bool autocast, bool fused,
                                             const std::vector<at::Tensor>& weights) {
  const auto x = torch::randn({batch_time[0], batch_time[1], 64},
                              torch::TensorOptions().device(torch::kCUDA).dtype(dtype))
                     .requires_grad_(true);
  if (autocast) set_autocast_to_bf16(c10::DeviceType::CUDA, true);
  at::Tensor y;
  {
    std::optional<FusedLinearScope> fusing;
    if (fused) fusing.emplace(nullptr);
    y = forward(x);
  }
  if (autocast) {
    set_autocast_to_bf16(c10::DeviceType::CUDA, false);
    at::autocast::clear_cache();
  }
  y.backward(torch::randn(y.sizes(), y.options()));
  std::vector<at::Tensor> results{y.detach(), x.grad()};
  for (const auto& weight : weights) results.push_back(weight.grad());
  return results;
}

// An MLP (nn::SwiGLU or nn::GeluMlp) of `options`, its weights drawn after manual_seed(seed), on
// the GPU in `dtype`.
template <typename Mlp, typename Options>
Mlp cuda_mlp(uint64_t seed, const Options& options, at::ScalarType dtype) {
  torch::manual_seed(seed);
  Mlp mlp(options);
  mlp->to(torch::kCUDA, dtype);
  return mlp;
}

// SwiGLU (`ours`: the module, whose silu(gate) * up is fused and made again in the backward) or
// its projections around ATen's silu(gate) * up. {output, the gradients of x and of the gate, up
// and down projections' weights}.
std::vector<at::Tensor> swiglu(bool ours, at::ScalarType dtype, bool autocast, int64_t hidden,
                               bool fused) {
  auto mlp = cuda_mlp<nn::SwiGLU>(12, nn::SwiGLUOptions(64, hidden), dtype);
  const MlpForward reference = [&](const at::Tensor& x) {
    const auto gate = pipetrain::linear(x, mlp->gate_proj->weight);
    const auto up = pipetrain::linear(x, mlp->up_proj->weight);
    return pipetrain::linear(torch::silu(gate) * up, mlp->down_proj->weight);
  };
  const MlpForward module = [&](const at::Tensor& x) { return mlp->forward(x); };
  return mlp_forward_backward(
      ours ? module : reference, {2, 5}, dtype, autocast, fused,
      {mlp->gate_proj->weight, mlp->up_proj->weight, mlp->down_proj->weight});
}

// An MLP (`run(ours, dtype, autocast, hidden, fused)`: the module or ATen's expression, its results
// as `names` says) gives what ATen's expression gives in fp32, bf16, and fp32 weights under
// autocast (bf16 hidden activations, so the weights' fp32 gradients are GEMMs of bf16 ones), for
// each hidden width, with and without fused accumulation.
using MlpRun = std::function<std::vector<at::Tensor>(bool, at::ScalarType, bool, int64_t, bool)>;
void expect_mlp_as_aten(const MlpRun& run, const std::vector<std::string>& names,
                        const std::vector<int64_t>& hiddens) {
  for (const auto& [dtype, autocast] : std::vector<std::pair<at::ScalarType, bool>>{
           {torch::kFloat, false}, {torch::kBFloat16, false}, {torch::kFloat, true}}) {
    for (const int64_t hidden : hiddens) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (autocast ? " under autocast" : "") +
                   ", hidden " + std::to_string(hidden));
      const auto expected = run(false, dtype, autocast, hidden, false);
      const double tolerance =
          dtype == torch::kFloat && !autocast ? kFp32Tolerance : kBf16Tolerance;
      for (const bool fused : {false, true}) {
        const auto actual = run(true, dtype, autocast, hidden, fused);
        for (size_t i = 0; i < expected.size(); ++i) {
          expect_as_aten(actual[i], expected[i], tolerance, names[i] + (fused ? ", fused" : ""));
        }
      }
    }
  }
}

// For a width whose elements the kernels read 16 bytes at a time throughout (256) and one that
// leaves a tail (37).
TEST(CudaKernels, SwiGLUGivesWhatAtensExpressionGives) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_mlp_as_aten(swiglu,
                     {"output", "x's gradient", "gate_proj's gradient", "up_proj's gradient",
                      "down_proj's gradient"},
                     {256, 37});
}

// GPT-2's MLP (`ours`: the module, whose tanh GELU runs inside cuBLASLt's GEMMs where the operands
// are 16-bit) or its projections around ATen's GELU. {output, the gradients of x, c_fc's weight
// and bias, and c_proj's weight and bias}.
std::vector<at::Tensor> gelu_mlp(bool ours, at::ScalarType dtype, bool autocast, int64_t hidden,
                                 bool fused) {
  auto mlp = cuda_mlp<nn::GeluMlp>(14, nn::GeluMlpOptions(64, hidden), dtype);
  const MlpForward reference = [&](const at::Tensor& x) {
    const auto pre = pipetrain::linear(x, mlp->c_fc->weight, mlp->c_fc->bias);
    return pipetrain::linear(torch::gelu(pre, "tanh"), mlp->c_proj->weight, mlp->c_proj->bias);
  };
  const MlpForward module = [&](const at::Tensor& x) { return mlp->forward(x); };
  return mlp_forward_backward(
      ours ? module : reference, {3, 7}, dtype, autocast, fused,
      {mlp->c_fc->weight, mlp->c_fc->bias, mlp->c_proj->weight, mlp->c_proj->bias});
}

// For a hidden width cuBLASLt takes (256) and one it cannot stride (36: ATen's GELU); in fp32
// ATen's GELU too (cuBLASLt's path takes 16-bit operands). The epilogue applies the GELU to the
// fp32 sum before rounding it, where ATen's reads the rounded bf16 sum: within bf16's tolerance.
TEST(CudaKernels, GeluMlpGivesWhatAtensExpressionGives) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_mlp_as_aten(gelu_mlp,
                     {"output", "x's gradient", "c_fc's weight gradient", "c_fc's bias gradient",
                      "c_proj's weight gradient", "c_proj's bias gradient"},
                     {256, 36});
}

// How the RMSNorm is called: alone, beside its input going on along the residual stream, or after
// the residual add whose sum it normalises.
enum class RmsNormForm { kAlone, kResidual, kAdd };

// The RMSNorm of x [2, 64, width] (`ours`: pipetrain::nn's function for `form`) or ATen's fp32
// expression x * rsqrt(mean(x^2) + eps) * weight of x or of x + branch, under bf16-mixed with the
// branch in bf16 (a matmul's output) and the normalised rows cast to bf16 as the matmuls reading
// them would cast them; then random gradients at the normalised rows and, where the form returns
// it, at the residual stream. {normalised, x's gradient, the weight's gradient}, and after the
// add {the sum, the branch's gradient}.
std::vector<at::Tensor> rms_norm_rows(bool ours, bool bf16_mixed, RmsNormForm form, int64_t width) {
  torch::manual_seed(13);
  constexpr double eps = 1e-5;
  const auto options = torch::TensorOptions().device(torch::kCUDA);
  const auto x = torch::randn({2, 64, width}, options).mul_(2).add_(0.5).requires_grad_(true);
  const auto branch =
      torch::randn({2, 64, width}, options.dtype(bf16_mixed ? torch::kBFloat16 : torch::kFloat))
          .requires_grad_(true);
  const auto weight = torch::rand({width}, options).add_(0.5).requires_grad_(true);
  if (bf16_mixed) set_autocast_to_bf16(c10::DeviceType::CUDA, true);
  constexpr auto to_matmuls = LayerNormOutput::kAutocastDtype;
  at::Tensor residual, normalised;
  if (ours && form == RmsNormForm::kAlone) {
    normalised = nn::rms_norm(x, weight, eps, to_matmuls);
  } else if (ours) {
    const auto both = form == RmsNormForm::kAdd
                          ? nn::add_rms_norm(x, branch, weight, eps, to_matmuls)
                          : nn::residual_rms_norm(x, weight, eps, to_matmuls);
    residual = both.residual;
    normalised = both.normalised;
  } else {
    const auto rows = form == RmsNormForm::kAdd ? x + branch : x;
    normalised = rows * torch::rsqrt(rows.pow(2).mean(-1, true) + eps) * weight;
    if (bf16_mixed) normalised = normalised.to(torch::kBFloat16);
    if (form != RmsNormForm::kAlone) residual = rows;
  }
  if (bf16_mixed) {
    set_autocast_to_bf16(c10::DeviceType::CUDA, false);
    at::autocast::clear_cache();
  }
  std::vector<at::Tensor> outputs{normalised}, grads{torch::randn_like(normalised)};
  if (residual.defined()) {
    outputs.push_back(residual);
    grads.push_back(torch::randn_like(residual));
  }
  torch::autograd::backward(outputs, grads);
  std::vector<at::Tensor> results{normalised.detach(), x.grad(), weight.grad()};
  if (form == RmsNormForm::kAdd) {
    results.push_back(residual.detach());
    results.push_back(branch.grad());
  }
  return results;
}

// fp32 and bf16-mixed, each form, for widths of Llama and Qwen3 (2048, 1024, 768) and 1536 (12
// vectors of 4 a lane, the weight's gradient summed in registers as for the others), one whose
// weight gradient the input gradient's pass cannot sum (4096: a pass of its own) and one the
// kernels do not take (1022, not a multiple of 4: ATen's expression again). The kernels compute in
// fp32 and round once: fp32 results within relative 1e-5 (the sums over a row and over the rows for
// the weight's gradient run in another order), bf16 ones (the normalised rows, the branch's
// gradient) within bf16's rounding (relative 1e-2).
TEST(CudaKernels, RMSNormAndItsResidualFormsGiveWhatAtensExpressionGives) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const char* names[] = {"normalised", "x's gradient", "weight's gradient", "sum",
                         "branch's gradient"};
  const char* forms[] = {"alone", "beside the residual stream", "after the residual add"};
  for (const bool bf16_mixed : {false, true}) {
    for (const auto form : {RmsNormForm::kAlone, RmsNormForm::kResidual, RmsNormForm::kAdd}) {
      for (const int64_t width : {768, 1024, 1536, 2048, 4096, 1022}) {
        SCOPED_TRACE(std::string(bf16_mixed ? "bf16-mixed" : "fp32") + ", " +
                     forms[static_cast<int>(form)] + ", width " + std::to_string(width));
        const auto expected = rms_norm_rows(false, bf16_mixed, form, width);
        const auto actual = rms_norm_rows(true, bf16_mixed, form, width);
        ASSERT_EQ(actual.size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i) {
          const bool fp32 = expected[i].scalar_type() == torch::kFloat;
          expect_as_aten(actual[i], expected[i], fp32 ? kNormFp32Tolerance : kBf16Tolerance,
                         names[i]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::testing::pipe_cuda_test
