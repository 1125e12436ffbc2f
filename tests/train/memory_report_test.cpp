// What fit says about memory: the figures of a rank's layers and optimizer, the limit held against
// them, and the first step's peak as the meter counts it (exact tensor bytes).
#include "train/memory_report.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/module.h"
#include "support/errors.h"

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
