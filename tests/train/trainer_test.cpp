// The Trainer under `single`, a user-registered strategy, and logging reductions.
#include "pipetrain/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/world.h"
#include "support/command.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::trainer_test {
namespace {

// Logs each batch's rows beside its loss.
class Regression : public testing::MseRegression {
 public:
  Regression() : MseRegression(testing::tanh_mlp({3, 8, 1}), 0.1) {}
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    auto loss = MseRegression::training_step(batch, batch_idx);
    log("rows", static_cast<double>(batch.data.size(0)));
    return loss;
  }
};

TensorDataset regression_data() {
  torch::manual_seed(11);
  auto x = torch::randn({40, 3});
  return {x, x.sum(1, true)};
}

TEST(LoggedMetrics, ReducesToTheSampleWeightedMean) {
  LoggedMetrics metrics;
  metrics.add("loss", torch::tensor(1.0), 3);
  metrics.add("loss", torch::tensor(3.0), 1);
  EXPECT_DOUBLE_EQ(metrics.means().at("loss"), 1.5);
  EXPECT_THROW(metrics.add("loss", torch::ones({2}), 1), std::invalid_argument);
}

// Names travel between ranks as tab-separated lines: one that would break them is refused when
// it is logged, on every rank alike, rather than when the stages share it.
TEST(LoggedMetrics, RefusesNamesWithTabsOrLineBreaks) {
  LoggedMetrics metrics;
  for (const std::string name : {"", "train\tloss", "train\nloss", "loss\r"}) {
    EXPECT_THROW(metrics.add(name, torch::tensor(1.0), 1), std::invalid_argument) << name;
    EXPECT_THROW(metrics.add_ratio(name, torch::tensor(1.0), torch::tensor(2.0)),
                 std::invalid_argument)
        << name;
  }
  EXPECT_TRUE(metrics.empty());
  metrics.add("train/loss step", torch::tensor(1.0), 1);
  EXPECT_FALSE(metrics.empty());
}

TEST(Trainer, SingleStrategyLearnsAndLogsEveryStep) {
  const auto root = testing::make_temp_dir("trainer");
  Trainer trainer(TrainerOptions()
                      .max_epochs(3)
                      .log_every_n_steps(1)
                      .default_root_dir(root)
                      .enable_progress_bar(false));
  Regression model;
  DataLoader loader(regression_data(), DataLoaderOptions().batch_size(8).shuffle(true));
  trainer.fit(model, loader);
  EXPECT_EQ(trainer.global_step(), 15);
  const auto losses = testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss");
  ASSERT_EQ(losses.size(), 15u);
  EXPECT_LT(losses.back(), losses.front());
  const auto epochs = testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "epoch");
  EXPECT_EQ(epochs.front(), 0);
  EXPECT_EQ(epochs.back(), 2);
  std::filesystem::remove_all(root);
}

TEST(Trainer, MaxStepsStopsMidEpochAndLogEveryNStepsFollowsLightning) {
  const auto root = testing::make_temp_dir("trainer");
  Trainer trainer(
      TrainerOptions().max_steps(7).log_every_n_steps(3).default_root_dir(root).enable_progress_bar(
          false));
  Regression model;
  DataLoader loader(regression_data(), DataLoaderOptions().batch_size(8));
  trainer.fit(model, loader);
  EXPECT_EQ(trainer.global_step(), 7);
  // Lightning logs when (step + 1) % n == 0: steps 2 and 5; the last row is the measured peak
  // memory that fit logs at its end, at its last step.
  EXPECT_EQ(testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "step"),
            (std::vector<double>{2, 5, 6}));
  EXPECT_EQ(testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss").size(), 2u);
  EXPECT_GT(
      testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "peak_memory_mib/rank_0").at(0),
      0);
  std::filesystem::remove_all(root);
}

// A strategy of the user's own: `single`, counting its steps.
int64_t counted_steps = 0;
class CountingStrategy : public Strategy {
 public:
  explicit CountingStrategy(const TrainerOptions& options)
      : inner_(create_strategy("single", options)) {}
  int64_t world_size() const override { return inner_->world_size(); }
  void setup(Module& module, std::shared_ptr<World> world) override {
    inner_->setup(module, std::move(world));
  }
  at::Tensor training_step(Module& module, const Batch& batch, int64_t batch_idx,
                           const StepOptions& step, LoggedMetrics& metrics) override {
    ++counted_steps;
    return inner_->training_step(module, batch, batch_idx, step, metrics);
  }
  void evaluation_step(Module& module, const Batch& batch, int64_t batch_idx,
                       const EvaluationStep& step, LoggedMetrics& metrics) override {
    inner_->evaluation_step(module, batch, batch_idx, step, metrics);
  }
  at::Tensor predict_step(Module& module, const Batch& batch, int64_t batch_idx) override {
    return inner_->predict_step(module, batch, batch_idx);
  }
  ReducedMetrics reduce_metrics(const LoggedMetrics& metrics) override {
    return inner_->reduce_metrics(metrics);
  }
  at::Tensor gradient_norm(const std::vector<at::Tensor>& parameters) override {
    return inner_->gradient_norm(parameters);
  }
  WeightShard weight_shard(Module& module) override { return inner_->weight_shard(module); }
  void load_weights(Module& module, const StoredWeights& stored) override {
    inner_->load_weights(module, stored);
  }
  std::map<std::string, std::string> tied_names() const override { return inner_->tied_names(); }
  std::map<std::string, std::string> layout() const override { return inner_->layout(); }
  std::string describe() const override { return "counting " + inner_->describe(); }

 private:
  std::unique_ptr<Strategy> inner_;
};

// A Trainer never exits the process: started alone with devices 2, it says to launch the ranks
// first (the command and the example project do, through launch_ranks; their tests run it).
TEST(Trainer, TwoDevicesInALoneProcessAskForLaunchRanks) {
  const auto options = TrainerOptions().strategy("pipe").devices(2).loggers({});
  const auto error = testing::error_of<std::logic_error>([&] { Trainer trainer(options); });
  EXPECT_NE(error.find("call pipetrain::launch_ranks(options)"), std::string::npos) << error;
  EXPECT_FALSE(launch_ranks(TrainerOptions()).has_value());  // one process: this one trains
}

TEST(StrategyRegistry, UserStrategiesAreChosenByName) {
  register_strategy("counting", [](const TrainerOptions& options) {
    return std::make_unique<CountingStrategy>(options);
  });
  const auto names = strategy_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "counting"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "pipe"), names.end());

  const auto root = testing::make_temp_dir("trainer");
  Trainer trainer(TrainerOptions()
                      .strategy("counting")
                      .max_steps(4)
                      .default_root_dir(root)
                      .enable_progress_bar(false));
  Regression model;
  trainer.fit(model, DataLoader(regression_data(), DataLoaderOptions().batch_size(8)));
  EXPECT_EQ(counted_steps, 4);
  std::filesystem::remove_all(root);
}

TEST(StrategyRegistry, UnknownNameListsTheRegisteredOnes) {
  const auto error = testing::error_of<std::invalid_argument>(
      [] { Trainer trainer(TrainerOptions().strategy("dpp")); });
  EXPECT_NE(error.find("unknown strategy 'dpp': registered strategies are "), std::string::npos)
      << error;
  EXPECT_NE(error.find("pipe, single"), std::string::npos) << error;
}

}  // namespace
}  // namespace pipetrain::trainer_test
