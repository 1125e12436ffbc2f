// Data-parallel replicas, with and without ZeRO stage 1, train as one process does: a fit stopped
// and resumed under the same layout trains as an uninterrupted one, with every replica's share of
// the optimizer state back where it was; a parameter that only some replicas' rows use is
// updated on every replica as one process updates it.
// Tolerance: 1e-6 (fp32 on CPU, sums over replicas in another order than one process's).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/layer_spec.h"
#include "pipetrain/module.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::zero_and_replicas_test {
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

class ZeroResume : public FitRunsTest<ZeroRun> {
 protected:
  ZeroRun run(const std::string& name) const {
    ZeroRun r = named_run(name);
    r.strategy = "ddp";
    r.devices = 2;
    fs::create_directories(r.root);
    return r;
  }
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

// Adds `extra` to the rows whose flag (the input's last column) is set; drops the flag. A batch
// without flagged rows does not use `extra` at all (as an expert no token was routed to).
class FlaggedOffsetImpl : public torch::nn::Module {
 public:
  FlaggedOffsetImpl() { extra = register_parameter("extra", torch::zeros({4})); }
  at::Tensor forward(const at::Tensor& x) {
    const auto flagged = x.select(1, 4) > 0.5;
    auto y = x.slice(1, 0, 4);
    if (flagged.any().item<bool>()) y = y + flagged.unsqueeze(1).to(y.dtype()) * extra;
    return y;
  }
  at::Tensor extra;
};
TORCH_MODULE(FlaggedOffset);

class FlaggedRegression : public MseRegression {
 public:
  FlaggedRegression()
      : MseRegression(torch::nn::Sequential(FlaggedOffset(), torch::nn::Linear(4, 8),
                                            torch::nn::Tanh(), torch::nn::Linear(8, 2)),
                      0.1) {}
};

// 64 rows, 4 of them flagged: global batch 0 (rows 0-15) has its flagged row in the first
// replica's half, batch 1 (rows 16-31) in the second's.
TensorDataset flagged_data() {
  torch::manual_seed(13);
  const auto x = torch::randn({64, 4});
  auto flag = torch::zeros({64, 1});
  for (const int64_t row : {0, 24, 40, 56}) flag[row][0] = 1;
  return {torch::cat({x, flag}, 1), torch::stack({x.sum(1), x.tanh().sum(1) + flag.squeeze(1)}, 1)};
}

// A global batch of 16 rows, over `devices` replicas; 2 epochs.
void train_flagged(const ZeroRun& run) {
  Trainer trainer(run.trainer_options().zero_stage(run.zero_stage).max_epochs(2));
  FlaggedRegression model;
  const DataLoader loader(flagged_data(), DataLoaderOptions().batch_size(16 / run.devices));
  trainer.fit(model, loader);
  save_local_tensors(model, run.rank_tensors(worker_rank()));
}

PIPETRAIN_WORKER(flagged_worker) { train_from_env(train_flagged); }

// A parameter that the rows of one replica use and the other's do not, in a step, once kept no
// gradient on the replica that did not use it (GradientSync left its gradient undefined): without
// ZeRO only some replicas stepped it and the replicas drifted apart, under ZeRO an owner that did
// not use it did not step it at all, and the trained weights were not one process's.
TEST(Replicas, AParameterOnlySomeReplicasUseTrainsAsInOneProcess) {
  const std::string dir = make_temp_dir("zero-and-replicas");
  ZeroRun single;
  single.root = dir + "/single";
  single.zero_stage = 0;
  fs::create_directories(single.root);
  train_flagged(single);
  for (const int64_t zero_stage : {0, 1}) {
    SCOPED_TRACE("zero_stage " + std::to_string(zero_stage));
    ZeroRun ddp;
    ddp.root = dir + "/ddp" + std::to_string(zero_stage);
    ddp.strategy = "ddp";
    ddp.devices = 2;
    ddp.zero_stage = zero_stage;
    fs::create_directories(ddp.root);
    ASSERT_EQ(run_ranks(2, "flagged_worker", to_env(ddp)), 0) << ddp.recorded_error(0);
    expect_same_weights(single.rank_tensors(0), ddp.rank_tensors(0), 1e-6);
    expect_same_weights(single.rank_tensors(0), ddp.rank_tensors(1), 1e-6);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::testing::zero_and_replicas_test
