// Stopping a fit and resuming it loses nothing: a stop mid-epoch (max_steps, a SIGTERM or SIGUSR1
// reaching one rank) saves last.ckpt where it stopped, and the resumed run's per-step losses equal
// an uninterrupted run's (exact: fp32 on CPU, the same arithmetic in the same order); resuming a
// finished run trains nothing; epoch hooks stay paired. A NaN loss stops every rank before the
// optimizer step with an error naming the step, and no checkpoint holds what came after it.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "pipetrain/callback.h"
#include "pipetrain/module.h"
#include "pipetrain/safetensors.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::testing::stop_and_resume_test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 64, kBatchSize = 8;  // 8 batches an epoch

// A regression whose loss turns NaN at global step `nan_at_step` (-1: never).
class Regression : public SgdModule {
 public:
  explicit Regression(int64_t nan_at_step)
      : SgdModule(tanh_mlp({4, 16, 16, 2}), 0.05, 0.9), nan_at_step_(nan_at_step) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    if (trainer_step_ == nan_at_step_) loss = loss * std::numeric_limits<double>::quiet_NaN();
    log("train_loss", loss);
    return loss;
  }
  int64_t trainer_step_ = 0;  // set by StepCounter

 private:
  int64_t nan_at_step_;
};

// Keeps the model told of the step, raises `signo` on this process after step `at` (once), and
// records the epoch hooks it sees.
class StepCounter : public Callback {
 public:
  StepCounter(int64_t signal_at, int signo, std::string hooks_path)
      : signal_at_(signal_at), signo_(signo), hooks_path_(std::move(hooks_path)) {}
  void on_train_batch_start(Trainer& trainer, Module& module, const Batch&, int64_t) override {
    dynamic_cast<Regression&>(module).trainer_step_ = trainer.global_step();
  }
  void on_train_batch_end(Trainer& trainer, Module&, const TrainBatchOutputs&, const Batch&,
                          int64_t) override {
    if (trainer.global_step() == signal_at_) raise(signo_);
  }
  void on_train_epoch_start(Trainer& trainer, Module&) override {
    std::ofstream(hooks_path_, std::ios::app) << "start " << trainer.current_epoch() << "\n";
  }
  void on_train_epoch_end(Trainer& trainer, Module&) override {
    std::ofstream(hooks_path_, std::ios::app) << "end " << trainer.current_epoch() << "\n";
  }

 private:
  int64_t signal_at_;
  int signo_;
  std::string hooks_path_;
};

TensorDataset regression_data() {
  torch::manual_seed(5);
  auto x = torch::randn({kRows, 4});
  return {x, torch::stack({x.sum(1), x.slice(1, 0, 2).prod(1)}, 1)};
}

// A fit in ranks (run by stop_worker), stopped by max_steps, a signal or a NaN loss.
struct StopRun : FitRun {
  int64_t signal_at = -1;  // raise `signo` on rank 0 after this global step
  int signo = SIGTERM;
  int64_t nan_at = -1;      // the loss of this global step is NaN
  bool permissive = false;  // stop_on_nonfinite_loss off

  template <typename Visit>
  void fields(Visit&& visit) {
    FitRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, signal_at, signo, nan_at, permissive);
  }
  int start() const { return run_ranks(static_cast<int>(devices), "stop_worker", to_env(*this)); }
};

PIPETRAIN_WORKER(stop_worker) {
  const auto run = from_env<StopRun>();
  const int64_t rank = worker_rank();
  // Only rank 0 is signalled: the others must stop after the same step anyway.
  const int64_t signal_at = rank == 0 ? run.signal_at : -1;
  auto options = run.trainer_options();
  auto callbacks = options.callbacks();
  callbacks.push_back(std::make_shared<StepCounter>(
      signal_at, run.signo, run.root + "/hooks-" + std::to_string(rank) + ".txt"));
  Trainer trainer(
      options.callbacks(callbacks).max_epochs(3).stop_on_nonfinite_loss(!run.permissive));
  Regression model(run.nan_at);
  // Replicas share each global batch of kBatchSize rows: 8 steps an epoch under every strategy.
  const int64_t replicas = run.strategy == "ddp" ? 2 : 1;
  const DataLoader loader(regression_data(), DataLoaderOptions().batch_size(kBatchSize / replicas));
  run.record_error_of([&] { trainer.fit(model, loader, nullptr, run.resume); });
  std::ofstream(run.root + "/stopped-by-" + std::to_string(rank) + ".txt")
      << trainer.stopped_by_signal();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class StopAndResume : public FitRunsTest<StopRun, ::testing::TestWithParam<std::string>> {
 protected:
  StopRun run(const std::string& name) const {
    StopRun r = named_run(name);
    r.strategy = GetParam();
    r.devices = GetParam() == "single" ? 1 : 2;
    r.chunks = GetParam() == "pipe" ? 2 : 1;
    fs::create_directories(r.root);
    return r;
  }
  // The losses of the uninterrupted run's steps.
  std::vector<double> straight() const {
    auto r = run("straight");
    EXPECT_EQ(r.start(), 0);
    return read_csv_column(metrics_csv(r.root, 0), "train_loss");
  }
};

// Resumed steps, then what comes after, equal the uninterrupted run's.
void expect_continues(const std::vector<double>& straight, const std::string& root,
                      int64_t stopped_after) {
  const auto first = read_csv_column(metrics_csv(root, 0), "train_loss");
  const auto second = read_csv_column(metrics_csv(root, 1), "train_loss");
  ASSERT_EQ(first.size(), static_cast<size_t>(stopped_after));
  ASSERT_EQ(first.size() + second.size(), straight.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], straight[i]) << "step " << i;
  for (size_t i = 0; i < second.size(); ++i) {
    EXPECT_EQ(second[i], straight[first.size() + i]) << "step " << first.size() + i;
  }
}

TEST_P(StopAndResume, MaxStepsMidEpochResumesMidEpochAndAFinishedRunTrainsNothing) {
  const auto expected = straight();
  ASSERT_EQ(expected.size(), 24u);
  auto stopped = run("stopped");
  stopped.max_steps = 11;  // in the second epoch
  ASSERT_EQ(stopped.start(), 0);
  stopped.max_steps = -1;
  stopped.resume = stopped.last_checkpoint();
  ASSERT_EQ(stopped.start(), 0);
  expect_continues(expected, stopped.root, 11);
  // Epoch 1's end ran once, in the run that finished it, which also started it again.
  EXPECT_EQ(read_text(stopped.root + "/hooks-0.txt"),
            "start 0\nend 0\nstart 1\nstart 1\nend 1\nstart 2\nend 2\n");

  // Finished: a third run restores and trains nothing.
  ASSERT_EQ(stopped.start(), 0);
  const auto third = metrics_csv(stopped.root, 2);
  EXPECT_EQ(read_text(third).find("train_loss"), std::string::npos) << read_text(third);
}

TEST_P(StopAndResume, ASignalToOneRankStopsEveryRankAfterTheSameStepWithLastCkpt) {
  const auto expected = straight();
  for (const int signo : {SIGTERM, SIGUSR1}) {
    SCOPED_TRACE(signo);
    auto stopped = run("signalled-" + std::to_string(signo));
    stopped.signal_at = 12;  // after 12 of 24 steps: the next one, mid-epoch, is the last
    stopped.signo = signo;
    ASSERT_EQ(stopped.start(), 0);
    for (int rank = 0; rank < stopped.devices; ++rank) {
      EXPECT_EQ(read_text(stopped.root + "/stopped-by-" + std::to_string(rank) + ".txt"),
                std::to_string(signo));
    }
    stopped.signal_at = -1;
    stopped.resume = stopped.last_checkpoint();
    ASSERT_EQ(stopped.start(), 0);
    expect_continues(expected, stopped.root, 13);
  }
}

TEST_P(StopAndResume, ANanLossStopsEveryRankBeforeItsOptimizerStep) {
  auto failed = run("nan");
  failed.nan_at = 10;  // after epoch 0's last.ckpt (step 8)
  EXPECT_NE(failed.start(), 0);
  const auto error = failed.recorded_error(failed.devices - 1);
  EXPECT_NE(error.find("the loss of step 10 (epoch 1, batch 2) is NaN or infinite"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("last.ckpt (step 8)"), std::string::npos) << error;
  EXPECT_NE(error.find("--stop-on-nonfinite-loss false"), std::string::npos) << error;
  for (const auto& [name, tensor] : failed.final_weights()) {
    EXPECT_TRUE(tensor.isfinite().all().item<bool>()) << name;
  }
  EXPECT_EQ(read_csv_column(metrics_csv(failed.root, 0), "train_loss").size(), 10u);

  auto permissive = run("permissive");
  permissive.nan_at = 10;
  permissive.permissive = true;
  EXPECT_EQ(permissive.start(), 0);
  EXPECT_EQ(read_csv_column(metrics_csv(permissive.root, 0), "train_loss").size(), 24u);
}

INSTANTIATE_TEST_SUITE_P(Strategies, StopAndResume, ::testing::Values("single", "pipe", "ddp"));

// The command: SIGTERM mid-run saves last.ckpt and exits 128 + 15; --ckpt-path last with no
// checkpoint warns and trains from the start.
TEST(StopAndResumeCommand, SigtermSavesLastCkptAndExitsWithTheSignalsStatus) {
  const auto root = make_temp_dir("sigterm-command");
  const auto fresh =
      run_command(mlp_fit_command(root + "/fresh", {"--ckpt-path", "last", "--logger", "csv"}, 3));
  EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("no last.ckpt under"), std::string::npos) << fresh.output;

  const auto running = start_command(mlp_fit_command(
      root + "/long", {"--strategy", "pipe", "--devices", "2", "--logger", "csv"}, 1000000));
  // Once it trains (its first rows are flushed), stop it as a cluster manager would.
  const auto csv = root + "/long/lightning_logs/version_0/metrics.csv";
  for (int i = 0; i < 600 && !fs::exists(csv); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(csv)) << read_output(running);
  kill(running.pid, SIGTERM);
  const auto result = wait_command(running, std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.output;
  EXPECT_NE(result.output.find("stopped by SIGTERM after step"), std::string::npos)
      << result.output;
  EXPECT_TRUE(fs::exists(root + "/long/lightning_logs/version_0/checkpoints/last.ckpt"))
      << result.output;
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::stop_and_resume_test
