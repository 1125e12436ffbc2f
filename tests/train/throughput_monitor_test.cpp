// ThroughputMonitor logs, at each logging step after the first, figures whose ratios are fixed by
// the run whatever the clock says (to the CSV's 9 significant digits): samples per optimizer step
// (batch rows x accumulated batches x replicas), items and FLOPs per sample, MFU against the peak
// given. Through the command, a small GPT-2 under ddp (2 replicas) and pipe (2 stages) counts every
// replica's tokens once.
#include "pipetrain/throughput_monitor.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "pipetrain/module.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::testing::throughput_monitor_test {
namespace {

class Regression : public MseRegression {
 public:
  Regression()
      : MseRegression(torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::Linear(4, 1)),
                      0.01) {}
};

void expect_ratio(const std::vector<double>& numerator, const std::vector<double>& denominator,
                  double ratio, const std::string& what) {
  ASSERT_EQ(numerator.size(), denominator.size()) << what;
  for (size_t i = 0; i < numerator.size(); ++i) {
    EXPECT_NEAR(numerator[i] / denominator[i], ratio, 1e-6 * ratio) << what << ", row " << i;
  }
}

class ThroughputMonitorTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(root); }
  std::string root = make_temp_dir("throughput");
};

TEST_F(ThroughputMonitorTest, LogsEachWindowAfterTheFirstLoggingStep) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto x = torch::randn({48, 3}, generator);
  const DataLoader train(TensorDataset{x, x.sum(1, true)}, DataLoaderOptions().batch_size(3));
  auto monitor = std::make_shared<ThroughputMonitor>(
      ThroughputMonitorOptions().items_per_sample(5).flops_per_sample(7).available_flops(1e3));
  Trainer trainer(TrainerOptions()
                      .default_root_dir(root)
                      .enable_progress_bar(false)
                      .log_every_n_steps(2)
                      .accumulate_grad_batches(2)
                      .max_steps(8)
                      .callbacks({monitor}));
  Regression model;
  trainer.fit(model, train);
  const auto csv = trainer.log_dir() + "/metrics.csv";
  const auto steps = read_csv_column(csv, "train/steps_per_sec");
  const auto samples = read_csv_column(csv, "train/samples_per_sec");
  // Logging steps 2, 4, 6, 8: the first opens the window, each later one logs it.
  EXPECT_EQ(steps.size(), 3u);
  expect_ratio(samples, steps, 3 * 2, "samples per optimizer step");
  expect_ratio(read_csv_column(csv, "train/items_per_sec"), samples, 5, "items per sample");
  const auto flops = read_csv_column(csv, "train/flops_per_sec");
  expect_ratio(flops, samples, 7, "FLOPs per sample");
  expect_ratio(read_csv_column(csv, "train/mfu"), flops, 1e-3, "MFU per FLOP/s");
}

TEST_F(ThroughputMonitorTest, LeavesOutWhatItWasNotGiven) {
  const auto x = torch::ones({12, 3});
  const DataLoader train(TensorDataset{x, x.sum(1, true)}, DataLoaderOptions().batch_size(2));
  Trainer trainer(TrainerOptions()
                      .default_root_dir(root)
                      .enable_progress_bar(false)
                      .log_every_n_steps(1)
                      .max_steps(4)
                      .callbacks({std::make_shared<ThroughputMonitor>()}));
  Regression model;
  trainer.fit(model, train);
  const auto csv = trainer.log_dir() + "/metrics.csv";
  EXPECT_EQ(read_csv_column(csv, "train/samples_per_sec").size(), 3u);
  std::ifstream file(csv);
  std::string header;
  std::getline(file, header);
  EXPECT_EQ(header.find("items_per_sec"), std::string::npos) << header;
  EXPECT_EQ(header.find("flops_per_sec"), std::string::npos) << header;
  EXPECT_EQ(header.find("mfu"), std::string::npos) << header;
}

TEST_F(ThroughputMonitorTest, RefusesNegativeOptions) {
  EXPECT_THROW(ThroughputMonitor(ThroughputMonitorOptions().items_per_sample(-1)),
               std::invalid_argument);
}

// Through the command: every replica's (and, under pipe, the whole batch's) tokens counted once.
TEST_F(ThroughputMonitorTest, TheCommandCountsTokensOfEveryReplicaOnce) {
#ifndef PIPETRAIN_HAS_GLOO
  GTEST_SKIP() << "CPU ranks need Gloo, which this libtorch lacks";
#endif
  ASSERT_EQ(run_command({PIPETRAIN_CLI, "prepare-data", "--input",
                         "/usr/share/common-licenses/GPL-3", "--output", root + "/data"})
                .exit_code,
            0);
  for (const auto& [strategy, replicas] :
       std::vector<std::pair<std::string, int>>{{"ddp", 2}, {"pipe", 1}}) {
    const std::string run = root + "/" + strategy;
    const auto result = run_command(tiny_gpt2_fit_command(
        run, root + "/data/train.bin",
        {"--max-steps", "6", "--log-every-n-steps", "2", "--strategy", strategy, "--devices", "2",
         "--enable-checkpointing", "false", "--num-sanity-val-steps", "0"}));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto csv = metrics_csv(run);
    const auto steps = read_csv_column(csv, "train/steps_per_sec");
    const auto tokens = read_csv_column(csv, "train/items_per_sec");
    EXPECT_EQ(steps.size(), 2u) << strategy;
    expect_ratio(tokens, steps, 4.0 * 8 * replicas, strategy + ": tokens per step");
    EXPECT_FALSE(read_csv_column(csv, "train/flops_per_sec").empty()) << strategy;
  }
}

}  // namespace
}  // namespace pipetrain::testing::throughput_monitor_test
