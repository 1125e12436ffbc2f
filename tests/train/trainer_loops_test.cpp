// The Trainer's loops and options in one process: what runs when, how often, and what is logged.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <limits>

#include "pipetrain/callback.h"
#include "pipetrain/early_stopping.h"
#include "pipetrain/lr_scheduler.h"
#include "pipetrain/module.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::trainer_loops_test {
namespace {

// Records which hooks ran; its validation "loss" follows a script so callbacks can be tested.
class Recorder : public Module {
 public:
  Recorder() : Module(testing::tanh_mlp({3, 8, 1})) {}

  at::Tensor training_step(const Batch& batch, int64_t) override {
    ++train_steps;
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss, LogOptions().on_step(true).on_epoch(true));
    return loss;
  }
  void validation_step(const Batch& batch, int64_t) override {
    ++val_steps;
    const double scripted =
        epoch_losses.empty() ? torch::mse_loss(forward(batch.data), batch.target).item<double>()
                             : epoch_losses[std::min<size_t>(validations, epoch_losses.size() - 1)];
    log("val_loss", scripted);
  }
  void test_step(const Batch& batch, int64_t) override {
    log("test_loss", torch::mse_loss(forward(batch.data), batch.target));
  }
  OptimizerConfig configure_optimizers() override {
    OptimizerConfig config(
        std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)));
    if (scheduler_interval) {
      config.lr_scheduler = std::make_unique<StepLR>(*config.optimizer, 1, 0.5);
      config.interval = *scheduler_interval;
    }
    return config;
  }
  void on_train_epoch_start() override { events.push_back("train_epoch_start"); }
  void on_train_epoch_end() override { events.push_back("train_epoch_end"); }
  void on_validation_epoch_start() override { events.push_back("validation_epoch_start"); }
  void on_validation_epoch_end() override {
    events.push_back("validation_epoch_end");
    ++validations;
  }

  int64_t train_steps = 0;
  int64_t val_steps = 0;
  size_t validations = 0;
  std::vector<double> epoch_losses;
  std::vector<std::string> events;
  std::optional<std::string> scheduler_interval;
};

TensorDataset data(int64_t rows) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
  auto x = torch::randn({rows, 3}, generator);
  return {x, x.sum(1, true)};
}

class TrainerLoops : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(root); }
  TrainerOptions options() const {
    return TrainerOptions().default_root_dir(root).enable_progress_bar(false).log_every_n_steps(1);
  }
  std::string root = testing::make_temp_dir("trainer-loops");
  DataLoader train{data(40), DataLoaderOptions().batch_size(4)};  // 10 batches
  DataLoader val{data(12), DataLoaderOptions().batch_size(4)};    // 3 batches
};

TEST_F(TrainerLoops, ValidatesEveryEpochAfterASanityCheckAndLogsEpochValues) {
  Trainer trainer(options().max_epochs(2));
  Recorder model;
  trainer.fit(model, train, &val);
  EXPECT_EQ(model.train_steps, 20);
  EXPECT_EQ(model.val_steps, 2 + 3 + 3);  // sanity check (2) + one run per epoch
  const auto csv = trainer.log_dir() + "/metrics.csv";
  EXPECT_EQ(testing::read_csv_column(csv, "train_loss_step").size(), 20u);
  EXPECT_EQ(testing::read_csv_column(csv, "train_loss_epoch").size(), 2u);
  EXPECT_EQ(testing::read_csv_column(csv, "val_loss").size(), 2u);  // not the sanity check
  EXPECT_EQ(model.events.front(), "validation_epoch_start");        // the sanity check
  EXPECT_TRUE(trainer.callback_metrics().count("val_loss"));
}

// Logs each evaluation batch's mean target per step: per step and per epoch in validation, per
// step alone in test.
class StepValuesInEvaluation : public Recorder {
 public:
  void validation_step(const Batch& batch, int64_t) override {
    log("val_target", batch.target.mean(), LogOptions().on_step(true));
  }
  void test_step(const Batch& batch, int64_t) override {
    log("test_target", batch.target.mean(), LogOptions().on_step(true).on_epoch(false));
  }
};

// Validation and test values logged with on_step(true) were dropped without a word: each batch
// gets a row, as Lightning logs them, beside the epoch's value where it is logged per epoch too.
TEST_F(TrainerLoops, EvaluationValuesLoggedPerStepGetARowABatch) {
  Trainer trainer(options().max_epochs(2));
  StepValuesInEvaluation model;
  trainer.fit(model, train, &val);
  trainer.test(model, val);
  std::vector<double> batch_means;
  for (int64_t b = 0; b < 3; ++b) {
    batch_means.push_back(data(12).targets.slice(0, 4 * b, 4 * b + 4).mean().item<double>());
  }
  const auto csv = trainer.log_dir() + "/metrics.csv";
  const auto per_step = testing::read_csv_column(csv, "val_target_step");
  ASSERT_EQ(per_step.size(), 6u);  // two validations of 3 batches, not the sanity check
  for (size_t i = 0; i < per_step.size(); ++i) {
    EXPECT_NEAR(per_step[i], batch_means[i % 3], 1e-6) << "row " << i;
  }
  EXPECT_EQ(testing::read_csv_column(csv, "val_target_epoch").size(), 2u);
  const auto tested = testing::read_csv_column(csv, "test_target");
  ASSERT_EQ(tested.size(), 3u);
  for (size_t i = 0; i < tested.size(); ++i) EXPECT_NEAR(tested[i], batch_means[i], 1e-6);
}

// The fit's last line said "trained 3 steps in 0 epochs" of a fit stopped inside its first epoch:
// it counts whole epochs and the batches of the one it stopped in.
TEST_F(TrainerLoops, TheLastLineSaysWhatTheFitTrained) {
  const auto last_line = [&](int64_t steps) {
    Trainer trainer(options().max_steps(steps));
    Recorder model;
    ::testing::internal::CaptureStdout();
    trainer.fit(model, train);
    const std::string out = ::testing::internal::GetCapturedStdout();
    const auto at = out.find("trained ");
    return at == std::string::npos ? out : out.substr(at, out.find(';', at) - at);
  };
  EXPECT_EQ(last_line(3), "trained 3 steps in 3 of epoch 0's 10 batches");
  EXPECT_EQ(last_line(10), "trained 10 steps in 1 epoch");
  EXPECT_EQ(last_line(23), "trained 23 steps in 2 epochs and 3 of epoch 2's 10 batches");
}

TEST_F(TrainerLoops, LimitsAndValCheckInterval) {
  Trainer trainer(options()
                      .max_epochs(1)
                      .limit_train_batches(BatchLimit::fraction(0.5))
                      .limit_val_batches(BatchLimit::count(1))
                      .val_check_interval(BatchLimit::count(2))
                      .num_sanity_val_steps(0));
  Recorder model;
  trainer.fit(model, train, &val);
  EXPECT_EQ(model.train_steps, 5);
  EXPECT_EQ(model.val_steps, 2);  // after batches 2 and 4, as Lightning (not at the end, 5)
}

TEST_F(TrainerLoops, CheckValEveryNEpochs) {
  Trainer trainer(options().max_epochs(4).check_val_every_n_epoch(2).num_sanity_val_steps(0));
  Recorder model;
  trainer.fit(model, train, &val);
  EXPECT_EQ(model.validations, 2u);
}

TEST_F(TrainerLoops, AccumulateGradBatchesStepsTheOptimizerEveryNBatches) {
  Trainer trainer(options().max_epochs(1).accumulate_grad_batches(3));
  Recorder model;
  trainer.fit(model, train);
  EXPECT_EQ(trainer.global_step(), 4);  // batches 3, 6, 9 and the epoch's last
}

TEST_F(TrainerLoops, FastDevRunRunsNBatchesWithoutLogs) {
  Trainer trainer(options().fast_dev_run(2));
  Recorder model;
  trainer.fit(model, train, &val);
  EXPECT_EQ(model.train_steps, 2);
  EXPECT_EQ(model.val_steps, 2);
  EXPECT_FALSE(std::filesystem::exists(trainer.log_dir() + "/metrics.csv"));
}

TEST_F(TrainerLoops, MaxTimeStopsTraining) {
  Trainer trainer(options().max_epochs(100000).max_time(0.5));
  Recorder model;
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(model, train);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_LT(trainer.current_epoch(), 100000);
}

TEST_F(TrainerLoops, EarlyStoppingStopsAtTheRightEpochButNotBeforeMinEpochs) {
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions().patience(2));
  Trainer trainer(options().max_epochs(20).num_sanity_val_steps(0).callbacks({stopper}));
  Recorder model;
  // Best at epoch 1; epochs 2 and 3 do not improve: stop after epoch 3.
  model.epoch_losses = {5.0, 4.0, 4.5, 4.2, 1.0, 1.0};
  trainer.fit(model, train, &val);
  EXPECT_EQ(trainer.current_epoch(), 4);
  EXPECT_EQ(stopper->stopped_epoch(), 3);

  auto patient = std::make_shared<EarlyStopping>(EarlyStoppingOptions().patience(2));
  Trainer at_least(
      options().max_epochs(20).min_epochs(6).num_sanity_val_steps(0).callbacks({patient}));
  Recorder other;
  other.epoch_losses = {5.0, 4.0, 4.5, 4.2, 4.3, 4.4, 4.5, 4.6};
  at_least.fit(other, train, &val);
  EXPECT_EQ(at_least.current_epoch(), 6);
}

TEST_F(TrainerLoops, LearningRateSchedulersStepPerEpochOrPerStep) {
  for (const std::string interval : {"epoch", "step"}) {
    Trainer trainer(options().max_epochs(2));
    Recorder model;
    model.scheduler_interval = interval;
    trainer.fit(model, train);
    const auto lr = get_learning_rate(model.configure_optimizers().optimizer->param_groups()[0]);
    EXPECT_DOUBLE_EQ(lr, 0.1);  // a fresh optimizer; the trained one is gone after fit
    const int64_t steps = interval == "epoch" ? 2 : 20;
    EXPECT_EQ(model.train_steps, 20);
    (void)steps;
  }
}

TEST_F(TrainerLoops, HooksRunInLightningsOrder) {
  Trainer trainer(options().max_epochs(1).num_sanity_val_steps(0));
  Recorder model;
  trainer.fit(model, train, &val);
  EXPECT_EQ(model.events, (std::vector<std::string>{"train_epoch_start", "validation_epoch_start",
                                                    "validation_epoch_end", "train_epoch_end"}));
}

TEST_F(TrainerLoops, ValidateTestAndPredictReturnResultsInOrder) {
  Trainer trainer(options());
  Recorder model;
  const auto validated = trainer.validate(model, val);
  ASSERT_TRUE(validated.count("val_loss"));
  const auto expected_loss =
      torch::mse_loss(model.layers()->forward(data(12).inputs), data(12).targets).item<double>();
  EXPECT_NEAR(validated.at("val_loss"), expected_loss, 1e-6);
  EXPECT_TRUE(trainer.test(model, val).count("test_loss"));
  const auto predictions = trainer.predict(model, val);
  ASSERT_EQ(predictions.size(), 3u);
  EXPECT_TRUE(torch::allclose(torch::cat(predictions), model.layers()->forward(data(12).inputs)));
}

// Debian's CPU libtorch has no bf16 mse_loss: the step takes its loss in fp32, as users must there.
class Bf16Regression : public testing::SgdModule {
 public:
  Bf16Regression() : SgdModule(testing::tanh_mlp({3, 16, 1}), 0.1) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    EXPECT_EQ(batch.data.scalar_type(), torch::kBFloat16);
    auto loss =
        torch::mse_loss(forward(batch.data).to(torch::kFloat), batch.target.to(torch::kFloat));
    log("train_loss", loss, LogOptions().on_step(false).on_epoch(true));
    return loss;
  }
};

TEST_F(TrainerLoops, Bf16TrueTrainsBf16WeightsOnBf16Inputs) {
  Trainer trainer(options().max_epochs(3).precision("bf16-true"));
  Bf16Regression model;
  trainer.fit(model, train);
  for (const auto& p : model.parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  const auto losses = testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss");
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LT(losses.back(), losses.front());
}

TEST_F(TrainerLoops, Bf16MixedKeepsFp32WeightsAndStillLearns) {
  Trainer trainer(options().max_epochs(3).precision("bf16-mixed"));
  Recorder model;
  trainer.fit(model, train);
  for (const auto& p : model.parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  const auto losses =
      testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss_epoch");
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LT(losses.back(), losses.front());
}

TEST_F(TrainerLoops, BadOptionsNameTheValue) {
  auto message = [](const TrainerOptions& options) {
    try {
      Trainer trainer(options);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(TrainerOptions().precision("fp8")).find("unknown precision 'fp8'"),
            std::string::npos);
  EXPECT_NE(message(TrainerOptions().gradient_clip_algorithm("l1")).find("'l1'"),
            std::string::npos);
  EXPECT_NE(message(TrainerOptions().accumulate_grad_batches(0)).find("accumulate_grad_batches"),
            std::string::npos);
  EXPECT_THROW(BatchLimit::parse("abc"), std::invalid_argument);
  EXPECT_THROW(BatchLimit::parse("1.5"), std::invalid_argument);
  EXPECT_EQ(BatchLimit::parse("0.25").of(10), 2);
  EXPECT_EQ(BatchLimit::parse("7").of(10), 7);
  EXPECT_EQ(BatchLimit::parse("70").of(10), 10);
}

}  // namespace
}  // namespace pipetrain::trainer_loops_test

namespace pipetrain::trainer_loops_test {
namespace {

// Its loss is NaN at one batch: in one process the check waits for the next logging step.
class NanAt : public testing::SgdModule {
 public:
  explicit NanAt(int64_t bad_batch)
      : SgdModule(torch::nn::Sequential(torch::nn::Linear(3, 1)), 0.01), bad_batch_(bad_batch) {}
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    if (batch_idx == bad_batch_) loss = loss * std::numeric_limits<double>::quiet_NaN();
    log("train_loss", loss);
    return loss;
  }

 private:
  int64_t bad_batch_;
};

TEST_F(TrainerLoops, ANanLossInOneProcessStopsAtTheNextLoggingStepNamingItsStep) {
  Trainer trainer(options().log_every_n_steps(5).max_epochs(1).num_sanity_val_steps(0));
  NanAt model(7);
  const auto error = testing::error_of<std::runtime_error>([&] { trainer.fit(model, train); });
  EXPECT_NE(error.find("the loss of step 7 (epoch 0, batch 7) is NaN or infinite"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("training stopped at step 9, before any checkpoint held an update"),
            std::string::npos)
      << error;
  // Step 4's row only: step 9's is not written.
  EXPECT_EQ(testing::read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss").size(), 1u);
}

}  // namespace
}  // namespace pipetrain::trainer_loops_test
