// ZeRO stage 1 across a checkpoint: a fit stopped and resumed under the same layout trains as an
// uninterrupted one, with every replica's share of the optimizer state back where it was.
// Tolerance: exact (fp32 on CPU, the same arithmetic in the same order).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/layer_spec.h"
#include "pipetrain/module.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::zero_resume_test {
namespace {

namespace fs = std::filesystem;

// 8 -> 8 -> 8 -> 3 described per rank, the second Linear's weight tied by name to the first's
// (no build_sharing: one process holding both layers holds two tensors of the tie). The tied
// weights are the largest tensors, so ZeRO gives one copy to each of two replicas. Adam, whose
// moments and step counts are what a resume must bring back.
class TiedRegression : public Module {
 public:
  TiedRegression()
      : Module(std::vector<LayerSpec>{
            layer([] { return torch::nn::Linear(8, 8); }), layer([] { return torch::nn::Tanh(); }),
            layer([] { return torch::nn::Linear(8, 8); }).tie("weight", "0.weight"),
            layer([] { return torch::nn::Tanh(); }),
            layer([] { return torch::nn::Linear(8, 3); })}) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
};

TensorDataset tied_data() {
  torch::manual_seed(11);
  auto x = torch::randn({64, 8});
  return {x, torch::stack({x.sum(1), x.slice(1, 0, 4).prod(1), x.tanh().sum(1)}, 1)};
}

struct ZeroRun : FitRun {
  int64_t zero_stage = 1;
  template <typename Visit>
  void fields(Visit&& visit) {
    FitRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, zero_stage);
  }
};

// Two replicas of 8 rows each: 4 steps an epoch. Each rank writes its layers' tensors.
void train(const ZeroRun& run) {
  Trainer trainer(run.trainer_options().zero_stage(run.zero_stage).max_epochs(3));
  TiedRegression model;
  const DataLoader loader(tied_data(), DataLoaderOptions().batch_size(8));
  trainer.fit(model, loader, nullptr, run.resume);
  save_local_tensors(model, run.rank_tensors(worker_rank()));
}

PIPETRAIN_WORKER(zero_resume_worker) { train_from_env(train); }

class ZeroResume : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  ZeroRun run(const std::string& name) const {
    ZeroRun r;
    r.root = dir + "/" + name;
    r.strategy = "ddp";
    r.devices = 2;
    fs::create_directories(r.root);
    return r;
  }
  std::string dir = make_temp_dir("zero-resume");
};

// Both tensors of a tie held by one process, owned by different replicas under ZeRO: the replica
// owning the second copy once saved no state for it (only the tie's first tensor's state was
// written, and that replica does not own it), so a resume under the same layout restarted that
// copy's Adam moments and step count: the copies drifted apart and the losses left the
// uninterrupted run's.
TEST_F(ZeroResume, ATieHeldTwiceByOneProcessResumesBothCopiesOptimizerState) {
  auto straight = run("straight");
  straight.max_steps = 6;
  ASSERT_EQ(run_ranks(2, "zero_resume_worker", to_env(straight)), 0) << straight.recorded_error(0);
  auto stopped = run("stopped");
  stopped.max_steps = 3;
  ASSERT_EQ(run_ranks(2, "zero_resume_worker", to_env(stopped)), 0) << stopped.recorded_error(0);
  stopped.max_steps = 6;
  stopped.resume = stopped.last_checkpoint();
  ASSERT_EQ(run_ranks(2, "zero_resume_worker", to_env(stopped)), 0) << stopped.recorded_error(0);

  const auto expected = read_csv_column(metrics_csv(straight.root, 0), "train_loss");
  auto losses = read_csv_column(metrics_csv(stopped.root, 0), "train_loss");
  const auto resumed = read_csv_column(metrics_csv(stopped.root, 1), "train_loss");
  losses.insert(losses.end(), resumed.begin(), resumed.end());
  expect_same_losses(expected, losses, 1e-6);
  for (int64_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    expect_same_weights(straight.rank_tensors(rank), stopped.rank_tensors(rank), 1e-6);
  }
}

}  // namespace
}  // namespace pipetrain::testing::zero_resume_test
