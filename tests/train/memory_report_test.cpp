// What fit says about memory: the figures of a rank's layers and optimizer, the limit held against
// them, the first step's peak as the meter counts it (exact tensor bytes), and all of it in
// callback_metrics.
#include "train/memory_report.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/callback.h"
#include "pipetrain/module.h"
#include "pipetrain/trainer.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::testing::memory_report_test {
namespace {

// Two Linear layers, 8 -> 16 -> 4, in fp32: (8 x 16 + 16 + 16 x 4 + 4) x 4 bytes.
constexpr int64_t kParameterBytes = (8 * 16 + 16 + 16 * 4 + 4) * 4;

class TwoLinears : public Module {
 public:
  TwoLinears() : Module(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Linear(16, 4))) {
    place(nullptr, layers());
  }
  at::Tensor training_step(const Batch&, int64_t) override { return {}; }
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
};

TEST(MemoryReport, FiguresCountTheStateEachOptimizerKeeps) {
  TwoLinears module;
  const auto parameters = module.layers()->parameters();
  const std::vector<std::pair<std::unique_ptr<torch::optim::Optimizer>, int64_t>> cases = [&] {
    std::vector<std::pair<std::unique_ptr<torch::optim::Optimizer>, int64_t>> list;
    list.emplace_back(std::make_unique<torch::optim::SGD>(parameters, 0.1), 0);
    list.emplace_back(std::make_unique<torch::optim::SGD>(
                          parameters, torch::optim::SGDOptions(0.1).momentum(0.9)),
                      1);
    list.emplace_back(std::make_unique<torch::optim::AdamW>(parameters), 2);
    list.emplace_back(
        std::make_unique<torch::optim::Adam>(parameters, torch::optim::AdamOptions().amsgrad(true)),
        3);
    return list;
  }();
  for (const auto& [optimizer, tensors] : cases) {
    const auto figures = memory_figures(module, *optimizer);
    EXPECT_EQ(figures.parameters, kParameterBytes);
    EXPECT_EQ(figures.gradients, kParameterBytes);
    EXPECT_TRUE(figures.optimizer_state_known);
    EXPECT_EQ(figures.optimizer_state, tensors * kParameterBytes);
    EXPECT_EQ(figures.total(), (2 + tensors) * kParameterBytes);
  }
  // An optimizer holding part of the parameters (as ZeRO leaves it) keeps state for that part.
  torch::optim::AdamW part(std::vector<at::Tensor>{parameters[0]});
  EXPECT_EQ(memory_figures(module, part).optimizer_state, 2 * 8 * 16 * 4);
}

// An optimizer given every parameter steps only those with gradients: a frozen one gets neither a
// gradient nor state.
TEST(MemoryReport, AFrozenParameterHasNoGradientNorOptimizerState) {
  TwoLinears module;
  const auto parameters = module.layers()->parameters();
  parameters[0].requires_grad_(false);  // the first Linear's 16 x 8 weight
  torch::optim::AdamW optimizer(parameters);
  const auto figures = memory_figures(module, optimizer);
  constexpr int64_t kTrainable = kParameterBytes - 8 * 16 * 4;
  EXPECT_EQ(figures.parameters, kParameterBytes);
  EXPECT_EQ(figures.gradients, kTrainable);
  EXPECT_EQ(figures.optimizer_state, 2 * kTrainable);
}

// What trainer.callback_metrics() held when each hook ran.
class MemoryMetricsRecorder : public Callback {
 public:
  void on_fit_start(Trainer& trainer, Module&) override { at_start = trainer.callback_metrics(); }
  void on_train_batch_end(Trainer& trainer, Module&, const TrainBatchOutputs&, const Batch&,
                          int64_t batch_idx) override {
    if (batch_idx == 0) after_first_step = trainer.callback_metrics();
  }
  void on_fit_end(Trainer& trainer, Module&) override { at_end = trainer.callback_metrics(); }
  std::map<std::string, double> at_start, after_first_step, at_end;
};

// The table fit prints is in callback_metrics for callbacks and code, per rank in MiB: the figures
// from fit's start, the first step's peak after it, the measured peak from fit's end.
TEST(MemoryReport, FitGivesEveryFigureToCallbackMetrics) {
  const std::string root = make_temp_dir("memory-metrics");
  auto recorder = std::make_shared<MemoryMetricsRecorder>();
  Trainer trainer(TrainerOptions()
                      .max_steps(2)
                      .loggers({})
                      .enable_progress_bar(false)
                      .enable_checkpointing(false)
                      .callbacks({recorder})
                      .default_root_dir(root));
  MseRegression model(tanh_mlp({8, 16, 4}), 0.1, /*momentum=*/0.9);
  model.layers()->parameters()[0].requires_grad_(false);  // frozen: no gradient, no momentum
  torch::manual_seed(0);
  const auto x = torch::randn({16, 8});
  DataLoader loader(TensorDataset(x, x.slice(1, 0, 4)), DataLoaderOptions().batch_size(8));
  trainer.fit(model, loader);

  constexpr double kMiB = 1 << 20;
  constexpr int64_t kTrainable = kParameterBytes - 8 * 16 * 4;
  const auto& start = recorder->at_start;
  EXPECT_DOUBLE_EQ(start.at("parameter_memory_mib/rank_0"), kParameterBytes / kMiB);
  EXPECT_DOUBLE_EQ(start.at("gradient_memory_mib/rank_0"), kTrainable / kMiB);
  EXPECT_DOUBLE_EQ(start.at("optimizer_state_memory_mib/rank_0"), kTrainable / kMiB);
  EXPECT_EQ(start.count("first_step_peak_memory_mib/rank_0"), 0u);
  EXPECT_EQ(start.count("peak_memory_mib/rank_0"), 0u);
  EXPECT_GT(recorder->after_first_step.at("first_step_peak_memory_mib/rank_0"), 0);
  EXPECT_EQ(recorder->after_first_step.count("peak_memory_mib/rank_0"), 0u);
  EXPECT_GT(recorder->at_end.at("peak_memory_mib/rank_0"), 0);
  for (const std::string name :
       {"parameter", "gradient", "optimizer_state", "first_step_peak", "peak"}) {
    EXPECT_EQ(trainer.callback_metrics().at(name + "_memory_mib/rank_0"),
              recorder->at_end.at(name + "_memory_mib/rank_0"))
        << name;
  }
  std::filesystem::remove_all(root);
}

TEST(MemoryReport, TheLimitNamesTheRankItsFiguresAndWhatWouldFit) {
  MemoryFigures small;
  small.parameters = small.gradients = 1 << 20;
  MemoryFigures large = small;
  large.optimizer_state = 2 << 20;
  EXPECT_NO_THROW(check_memory_limit({small, large}, 0));
  EXPECT_NO_THROW(check_memory_limit({small, large}, 4 << 20));
  const auto message = error_of<std::invalid_argument>([&] {
    check_memory_limit({small, large}, (4 << 20) - 1);
  });
  EXPECT_NE(message.find("rank 1 needs 4.0 MiB (parameters 1.0, optimizer state 2.0, gradients "
                         "1.0, before any activation MiB), more than max_memory (--max-memory) "
                         "4.0 MiB; nothing was trained"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--zero-stage 1"), std::string::npos) << message;
  // Once measured, the first step's peak (which holds the gradients) takes their place.
  large.first_step_peak = 3 << 20;
  EXPECT_EQ(large.total(), 6 << 20);
  const auto measured = error_of<std::invalid_argument>([&] {
    check_memory_limit({small, large}, 5 << 20);
  });
  EXPECT_NE(measured.find("the first step's activations, gradients and workspace at their peak "
                          "3.0 MiB"),
            std::string::npos)
      << measured;
  EXPECT_NE(measured.find("--checkpoint always"), std::string::npos) << measured;
  MemoryFigures unknown = small;
  unknown.optimizer_state_known = false;
  EXPECT_NO_THROW(check_memory_limit({unknown}, 0));
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              check_memory_limit({unknown}, 1 << 30);
            }).find("cannot count the state of rank 0's optimizer"),
            std::string::npos);
}

TEST(MemoryReport, TheMeterCountsWhatIsAllocatedAboveItsStartAtItsHighest) {
  const auto before = torch::ones({1024});  // live before: not counted
  int64_t peak = 0;
  {
    StepMemoryMeter meter(torch::kCPU);
    {
      const auto kept = torch::ones({1 << 18});   // 1 MiB
      const auto freed = torch::ones({1 << 19});  // 2 MiB while both live
    }
    const auto after = torch::ones({1 << 16});  // 256 KiB, below the peak
    peak = meter.peak();
  }
  EXPECT_EQ(peak, (3 << 20));
  // The meter gone, tensors it counted free through their own allocator.
  const auto later = torch::ones({16});
  EXPECT_EQ(later.sum().item<float>(), 16);
}

}  // namespace
}  // namespace pipetrain::testing::memory_report_test
