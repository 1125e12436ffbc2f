// Models and steps of a user's own through the Trainer under every strategy, against `single` on
// the same data and initial weights: a masked loss normalised by its own count (sum_over), a step
// that calls forward() on something other than its batch, and BatchNorm (its running statistics
// under activation checkpointing and data parallelism).
// Tolerance: fp32 on CPU, relative 1e-5 on losses and absolute 1e-5 on parameters where only the
// order of sums differs; exact equality where the same arithmetic runs (checkpoint modes).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "pipetrain/module.h"
#include "pipetrain/pipe.h"
#include "pipetrain/safetensors.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"
#include "support/command.h"
#include "support/errors.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::user_models_test {
namespace {

namespace fs = std::filesystem;

// Regression onto 3 outputs of which a per-row mask keeps 0 to 3: the loss is the mean over the
// kept entries, so rows weigh differently and a mean of per-micro-batch means would be wrong.
class MaskedRegression : public SgdModule {
 public:
  MaskedRegression() : SgdModule(tanh_mlp({4, 16, 16, 3}), 0.1) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    const auto y = batch.target.slice(1, 0, 3), mask = batch.target.slice(1, 3, 6);
    auto loss = sum_over(((forward(batch.data) - y).pow(2) * mask).sum(), mask.sum());
    log("train_loss", loss);
    return loss;
  }
};

// The same regression with the mask as a field of the batch beside data and target (Lightning's
// dict batch): the Trainer must hand each micro-batch and replica the mask rows of its data rows.
class MaskedRegressionWithAMaskField : public SgdModule {
 public:
  MaskedRegressionWithAMaskField() : SgdModule(tanh_mlp({4, 16, 16, 3}), 0.1) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    const auto& mask = batch.field("mask");
    auto loss = sum_over(((forward(batch.data) - batch.target).pow(2) * mask).sum(), mask.sum());
    log("train_loss", loss);
    return loss;
  }
};

// The same regression described layer by layer, as a user describes a model too large for one
// process: each process builds only the layers of its stages (layer_spec.h).
class MaskedRegressionBuiltPerRank : public Module {
 public:
  MaskedRegressionBuiltPerRank()
      : Module(std::vector<LayerSpec>{layer([] { return torch::nn::Linear(4, 16); }),
                                      layer([] { return torch::nn::Tanh(); }),
                                      layer([] { return torch::nn::Linear(16, 16); }),
                                      layer([] { return torch::nn::Tanh(); }),
                                      layer([] { return torch::nn::Linear(16, 3); })}) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    const auto y = batch.target.slice(1, 0, 3), mask = batch.target.slice(1, 3, 6);
    auto loss = sum_over(((forward(batch.data) - y).pow(2) * mask).sum(), mask.sum());
    log("train_loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};

// The same with momentum, whose buffers are optimizer state that ZeRO shares out.
class MaskedRegressionWithMomentum : public MaskedRegressionBuiltPerRank {
 public:
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  }
};

TensorDataset masked_data() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(9);
  auto x = torch::randn({64, 4}, generator);
  auto y = torch::stack({x.sum(1), x.slice(1, 0, 2).prod(1), x.tanh().sum(1)}, 1);
  // Row r keeps its first r % 4 outputs: 0 to 3 entries a row.
  auto keep = (torch::arange(3).unsqueeze(0) < (torch::arange(64) % 4).unsqueeze(1)).to(x.dtype());
  return {x, torch::cat({y, keep}, 1)};
}

// Preprocesses the input inside the step: the Trainer has no way to run that through the stages.
class PreprocessingInTheStep : public SgdModule {
 public:
  PreprocessingInTheStep() : SgdModule(tanh_mlp({4, 8, 6}), 0.1) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::mse_loss(forward((batch.data - 100.0) * 0.0), batch.target);
  }
};

// BatchNorm inside each half of the model.
class Normalised : public MseRegression {
 public:
  Normalised()
      : MseRegression(torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                                            torch::nn::Tanh(), torch::nn::Linear(8, 8),
                                            torch::nn::BatchNorm1d(8), torch::nn::Tanh(),
                                            torch::nn::Linear(8, 6)),
                      0.1) {}
};

struct UserRun : FitRun {
  std::string model;  // masked | preprocessing | normalised | input_normalised
  int64_t batch_size = 16;
  int64_t accumulate = 1;
  bool deferred_batch_norm = false;
  int64_t zero_stage = 0;
  int64_t stages = 0;            // ddp_pipe's
  std::string plan;              // "": none; "auto": the planner's; else a plan.json
  std::string planned_schedule;  // under "auto": the only schedule weighed; "": all

  template <typename Visit>
  void fields(Visit&& visit) {
    FitRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, model, batch_size, accumulate, deferred_batch_norm, zero_stage,
                           stages, plan, planned_schedule);
  }
};

// BatchNorm of the inputs first: its running statistics depend on the data alone, not on how
// training went (micro-batches are normalised by their own statistics, so weights differ).
class InputNormalised : public SgdModule {
 public:
  InputNormalised()
      : SgdModule(torch::nn::Sequential(torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 8),
                                        torch::nn::Tanh(), torch::nn::Linear(8, 6)),
                  0.1) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::mse_loss(forward(batch.data), batch.target);
  }
};

// Two dropouts, then a Linear that passes its input on (identity, no bias, learning rate 0):
// logs the share of the output's elements that both masks kept, a quarter where the two layers'
// masks are drawn apart, as one process draws them.
class TwoDropouts : public SgdModule {
 public:
  TwoDropouts()
      : SgdModule(
            torch::nn::Sequential(torch::nn::Dropout(0.5), torch::nn::Dropout(0.5),
                                  torch::nn::Linear(torch::nn::LinearOptions(16, 16).bias(false))),
            0.0) {
    torch::NoGradGuard no_grad;
    layers()->parameters()[0].copy_(torch::eye(16));
  }
  at::Tensor training_step(const Batch& batch, int64_t) override {
    const auto out = forward(batch.data);
    log("kept", (out != 0).to(torch::kFloat).mean());
    return torch::mse_loss(out, batch.target);
  }
};

// Preprocessing in a layer at the front of the Sequential, as forward()'s message advises, written
// in place: it halves its input.
class HalvedInPlace : public MseRegression {
 public:
  HalvedInPlace()
      : MseRegression(torch::nn::Sequential(
                          torch::nn::Functional([](at::Tensor x) { return x.mul_(0.5); }),
                          torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 6)),
                      0.1) {}
};

// A layer holding a tensor it does not use (a spare embedding row set, a branch not taken): the
// input passes through.
class HoldsUnusedImpl : public torch::nn::Module {
 public:
  explicit HoldsUnusedImpl(const at::Tensor& spare) {
    this->spare = register_parameter("spare", spare);
  }
  at::Tensor forward(const at::Tensor& x) { return x; }
  at::Tensor spare;
};
TORCH_MODULE(HoldsUnused);

// One tensor of ones, registered in a layer of each stage (a tie across the stages) and used by
// neither, trained with the rest by AdamW with weight decay, which steps only parameters with a
// gradient, as in PyTorch.
class UnusedTie : public MseRegression {
 public:
  UnusedTie() : MseRegression(layers_with_unused_tie(), 0.1) {}
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::AdamW>(
        parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  }
  static torch::nn::Sequential layers_with_unused_tie() {
    const auto spare = torch::ones({2, 2});
    return torch::nn::Sequential(HoldsUnused(spare), torch::nn::Linear(4, 8), torch::nn::Tanh(),
                                 HoldsUnused(spare), torch::nn::Linear(8, 6));
  }
};

// A tie described layer by layer (LayerSpec::tie), as a head tied to its embedding: the third
// layer's weight is the first's, a copy on each stage where the stages part them. The optimizer is
// given every parameter but `left_out`, and `frozen` is frozen first ("": none).
class TiedPerRank : public Module {
 public:
  TiedPerRank(std::string left_out, std::string frozen)
      : Module(std::vector<LayerSpec>{
            layer([] { return torch::nn::Linear(4, 4); }), layer([] { return torch::nn::Tanh(); }),
            layer([] { return torch::nn::Linear(4, 4); }).tie("weight", "0.weight"),
            layer([] { return torch::nn::Tanh(); }),
            layer([] { return torch::nn::Linear(4, 6); })}),
        left_out_(std::move(left_out)),
        frozen_(std::move(frozen)) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    std::vector<at::Tensor> given;
    for (const auto& item : layers()->named_parameters()) {
      if (item.key() == frozen_) item.value().set_requires_grad(false);
      if (item.key() != left_out_) given.push_back(item.value());
    }
    return std::make_unique<torch::optim::SGD>(given, torch::optim::SGDOptions(0.1));
  }

 private:
  std::string left_out_, frozen_;
};

std::unique_ptr<Module> make_model(const std::string& name) {
  if (name == "tied_per_rank") return std::make_unique<TiedPerRank>("", "");
  if (name == "tie_left_out") return std::make_unique<TiedPerRank>("0.weight", "");
  if (name == "tie_frozen_once") return std::make_unique<TiedPerRank>("", "0.weight");
  if (name == "unused_tie") return std::make_unique<UnusedTie>();
  if (name == "halved_in_place") return std::make_unique<HalvedInPlace>();
  if (name == "dropouts") return std::make_unique<TwoDropouts>();
  if (name == "masked") return std::make_unique<MaskedRegression>();
  if (name == "masked_field") return std::make_unique<MaskedRegressionWithAMaskField>();
  if (name == "masked_per_rank") return std::make_unique<MaskedRegressionBuiltPerRank>();
  if (name == "masked_momentum") return std::make_unique<MaskedRegressionWithMomentum>();
  if (name == "preprocessing") return std::make_unique<PreprocessingInTheStep>();
  if (name == "input_normalised") return std::make_unique<InputNormalised>();
  return std::make_unique<Normalised>();
}

// 64 rows for `model`: ones to drop out onto zeros, the masked regression, or its first 3
// targets twice.
TensorDataset data_for(const std::string& model) {
  if (model == "dropouts") return {torch::ones({64, 16}), torch::zeros({64, 16})};
  auto d = masked_data();
  if (model == "masked_field") {
    return {d.inputs, d.targets.slice(1, 0, 3), {{"mask", d.targets.slice(1, 3, 6)}}};
  }
  if (model.rfind("masked", 0) == 0) return d;
  return {d.inputs, d.targets.slice(1, 0, 3).repeat({1, 2})};
}

// Two epochs of 64 rows, validated on the same rows; every rank writes its layers' parameters and
// buffers to rank-<r>.
void train(const UserRun& run) {
  auto pipe_options = PipeOptions().deferred_batch_norm(run.deferred_batch_norm);
  // One dropout on each stage.
  if (run.model == "dropouts" && run.strategy == "pipe") pipe_options.balance({1, 2});
  // One copy of the tie on each stage.
  if ((run.model == "unused_tie" || run.model.rfind("tie", 0) == 0) && run.strategy == "pipe") {
    pipe_options.balance({2, 3});
  }
  Trainer trainer(run.trainer_options(pipe_options)
                      .accumulate_grad_batches(run.accumulate)
                      .zero_stage(run.zero_stage)
                      .stages(run.stages)
                      .plan(run.plan.empty() ? std::nullopt
                            : run.plan == "auto"
                                ? std::optional(run.planned_schedule.empty()
                                                    ? PlanOptions().repeats(1)
                                                    : PlanOptions().repeats(1).schedules(
                                                          {run.planned_schedule}))
                                : std::optional(PlanOptions().file(run.plan)))
                      .max_epochs(2));
  auto model = make_model(run.model);
  const auto data = data_for(run.model);
  // Validation (the sanity check and each epoch's end) must leave BatchNorm's statistics alone.
  const DataLoader loader(data, DataLoaderOptions().batch_size(run.batch_size));
  trainer.fit(*model, loader, &loader);
  save_local_tensors(*model, run.rank_tensors(worker_rank()));
  if (!model->layer_specs().empty()) {
    // Nothing built but what this process runs.
    const auto runs = model->local_layers()->named_parameters();
    for (const auto& item : model->layers()->named_parameters()) {
      if (!runs.contains(item.key())) {
        throw std::logic_error("rank " + std::to_string(worker_rank()) + " built " + item.key() +
                               ", a layer it does not run");
      }
    }
  }
}

// Runs `train` in ranks; a rank that fails records its error (recorded_error).
PIPETRAIN_WORKER(user_model_worker) { train_from_env(train); }

void train_in_ranks(const UserRun& run, int ranks) {
  fs::create_directories(run.root);
  ASSERT_EQ(run_ranks(ranks, "user_model_worker", to_env(run)), 0);
}

class UserModels : public FitRunsTest<UserRun> {
 protected:
  UserRun run(const std::string& model, const std::string& name) const {
    UserRun r = named_run(name);
    r.model = model;
    return r;
  }
  // `model` under `strategy` on 2 processes, to train.
  UserRun on_two(const std::string& model, const std::string& name,
                 const std::string& strategy) const {
    auto r = run(model, name);
    r.strategy = strategy;
    r.devices = 2;
    return r;
  }
  // `model` trained as a pipe of 2 stages and 4 micro-batches.
  UserRun trained_by_pipe(const std::string& model) const {
    auto pipe = on_two(model, "pipe", "pipe");
    pipe.chunks = 4;
    train_in_ranks(pipe, 2);
    return pipe;
  }
  // `model` trained by 2 replicas of 8 rows each, the global batch of single's 16.
  UserRun trained_by_ddp(const std::string& model) const {
    auto ddp = on_two(model, "ddp", "ddp");
    ddp.batch_size = 8;
    train_in_ranks(ddp, 2);
    return ddp;
  }
  // Each of `others` logged `single`'s training losses and ends with its weights.
  static void expect_trained_as(const UserRun& single, const std::vector<const UserRun*>& others) {
    for (const auto* other : others) {
      SCOPED_TRACE(other->root);
      expect_same_train_losses(single.root, other->root);
      expect_same_weights(single.final_weights(), other->final_weights(), 1e-5);
    }
  }
};

TEST_F(UserModels, SumOverNormalisesByTheGlobalCountUnderPipeDdpAndAccumulation) {
  auto single = run("masked", "single");
  train(single);
  const auto expected = read_csv_column(metrics_csv(single.root), "train_loss");
  ASSERT_EQ(expected.size(), 8u);

  auto pipe = trained_by_pipe("masked");
  auto ddp = trained_by_ddp("masked");
  auto accumulated = run("masked", "accumulated");
  accumulated.batch_size = 8;
  accumulated.accumulate = 2;
  train(accumulated);

  expect_trained_as(single, {&pipe, &ddp, &accumulated});
}

// A mask carried as a field of the batch reaches each micro-batch and replica with its rows: pipe
// and ddp train as single, and single as the mask inside the target trains.
TEST_F(UserModels, AFieldOfTheBatchFollowsItsRowsUnderPipeAndDdp) {
  auto in_target = run("masked", "in-target");
  train(in_target);
  auto single = run("masked_field", "single");
  train(single);
  expect_same_train_losses(in_target.root, single.root);

  auto pipe = trained_by_pipe("masked_field");
  auto ddp = trained_by_ddp("masked_field");
  expect_trained_as(single, {&pipe, &ddp});
}

// Built per rank, each process builds and holds its own layers alone (train() checks it), and pipe
// and ddp train as single built the same way does.
TEST_F(UserModels, AModelBuiltPerRankTrainsUnderPipeAndDdpAsSingle) {
  auto single = run("masked_per_rank", "single");
  train(single);
  auto pipe = trained_by_pipe("masked_per_rank");
  auto ddp = trained_by_ddp("masked_per_rank");
  expect_trained_as(single, {&pipe, &ddp});
  const auto first = load_safetensors(pipe.rank_tensors(0));
  const auto second = load_safetensors(pipe.rank_tensors(1));
  EXPECT_TRUE(first.count("0.weight"));
  EXPECT_FALSE(first.count("4.weight"));
  EXPECT_TRUE(second.count("4.weight"));
  EXPECT_FALSE(second.count("0.weight"));
}

// ZeRO stage 1 through the library (TrainerOptions::zero_stage) on a model of one's own built per
// rank, with momentum as the state shared out: two replicas train as one process on the whole
// batch.
TEST_F(UserModels, ZeroStageOneOnAModelOfOnesOwnTrainsAsSingle) {
  auto single = run("masked_momentum", "single");
  train(single);
  auto zero = on_two("masked_momentum", "zero", "ddp");
  zero.batch_size = 8;
  zero.zero_stage = 1;
  train_in_ranks(zero, 2);
  expect_trained_as(single, {&zero});
}

// The plan.json a planned run wrote beside its logs.
std::string plan_of(const UserRun& run) {
  std::ifstream in(run.root + "/lightning_logs/version_0/plan.json");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(UserModels, ThePlannersPlanTrainsAsSingleAndRunsAgainFromItsFile) {
  auto single = run("masked_per_rank", "single");
  train(single);
  // Planned under pipe (all schedules weighed); with two stages per rank (interleaved1f1b alone
  // weighed); and as replicas of a one-stage pipeline each reading half of single's batch (the
  // ZeRO stage among what the plan chooses).
  auto planned = run("masked_per_rank", "planned");
  planned.strategy = "pipe";
  auto interleaved = run("masked_per_rank", "interleaved");
  interleaved.strategy = "pipe";
  interleaved.planned_schedule = "interleaved1f1b";
  auto replicated = run("masked_per_rank", "replicated");
  replicated.strategy = "ddp_pipe";
  replicated.stages = 1;
  replicated.batch_size = 8;
  for (auto* planned_run : {&planned, &interleaved, &replicated}) {
    SCOPED_TRACE(planned_run->root);
    planned_run->devices = 2;
    planned_run->plan = "auto";
    train_in_ranks(*planned_run, 2);
    expect_trained_as(single, {planned_run});
  }
  EXPECT_NE(plan_of(interleaved).find("\"virtual_stages\": 2"), std::string::npos)
      << plan_of(interleaved);
  EXPECT_NE(plan_of(replicated).find("\"replicas\": 2"), std::string::npos) << plan_of(replicated);

  const std::string plan_file = planned.root + "/lightning_logs/version_0/plan.json";
  ASSERT_TRUE(fs::exists(plan_file));
  auto again = on_two("masked_per_rank", "again", "pipe");
  again.plan = plan_file;
  train_in_ranks(again, 2);
  expect_same_train_losses(single.root, again.root);
  // The plan it ran is the file's, kept beside its own logs.
  EXPECT_EQ(plan_of(planned), plan_of(again));

  auto refused = run("masked_per_rank", "refused");
  refused.plan = "auto";  // under single: no pipeline to plan
  fs::create_directories(refused.root);
  const auto error = error_of<std::invalid_argument>([&] { train(refused); });
  EXPECT_NE(error.find("needs strategy pipe or ddp_pipe, not 'single'"), std::string::npos)
      << error;
}

TEST_F(UserModels, ForwardOnAnythingButTheStepsBatchIsRefusedUnderEveryStrategy) {
  auto single = run("preprocessing", "single");
  fs::create_directories(single.root);
  const auto error = error_of<std::invalid_argument>([&] { train(single); });
  EXPECT_NE(error.find("not the step's batch.data"), std::string::npos) << error;
  EXPECT_NE(error.find("layer at the front of the Sequential"), std::string::npos) << error;
  for (const std::string strategy : {"pipe", "ddp"}) {
    SCOPED_TRACE(strategy);
    auto parallel = on_two("preprocessing", strategy, strategy);
    parallel.chunks = strategy == "pipe" ? 2 : 1;
    fs::create_directories(parallel.root);
    EXPECT_NE(run_ranks(2, "user_model_worker", to_env(parallel)), 0);
    const std::string message = parallel.recorded_error(1);
    EXPECT_NE(message.find("not the step's batch.data"), std::string::npos) << message;
  }
}

TEST_F(UserModels, BatchNormTrainsAlikeInEveryCheckpointModeAndSchedule) {
  for (const std::string schedule : {"gpipe", "1f1b", "zbh1", "zbh2"}) {
    std::map<std::string, UserRun> runs;
    for (const std::string mode : {"never", "except_last", "always"}) {
      auto pipe = on_two("normalised", schedule + "-" + mode, "pipe");
      pipe.chunks = 4;
      pipe.checkpoint = mode;
      pipe.schedule = schedule;
      train_in_ranks(pipe, 2);
      runs[mode] = pipe;
    }
    for (const std::string mode : {"except_last", "always"}) {
      SCOPED_TRACE(schedule + " " + mode);
      EXPECT_EQ(read_csv_column(metrics_csv(runs[mode].root), "train_loss"),
                read_csv_column(metrics_csv(runs["never"].root), "train_loss"));
      for (const int64_t rank : {0, 1}) {
        expect_same_weights(runs["never"].rank_tensors(rank), runs[mode].rank_tensors(rank), 0);
      }
    }
    // 4 micro-batches a batch, 4 batches an epoch, 2 epochs: each micro-batch counted once.
    const auto buffers = load_safetensors(runs["always"].rank_tensors(0));
    EXPECT_EQ(buffers.at("1.num_batches_tracked").item<int64_t>(), 32);
  }
}

TEST_F(UserModels, DeferredBatchNormKeepsTheWholeBatchsRunningStatistics) {
  auto single = run("input_normalised", "single");
  train(single);
  const auto expected = load_safetensors(single.rank_tensors(0));
  for (const bool deferred : {true, false}) {
    SCOPED_TRACE(deferred ? "deferred" : "per micro-batch");
    auto pipe = on_two("input_normalised", deferred ? "deferred" : "immediate", "pipe");
    pipe.chunks = 4;
    pipe.checkpoint = "always";
    pipe.schedule = "1f1b";
    pipe.deferred_batch_norm = deferred;
    train_in_ranks(pipe, 2);
    const auto actual = load_safetensors(pipe.rank_tensors(0));
    const bool same_mean =
        torch::allclose(actual.at("0.running_mean"), expected.at("0.running_mean"), 1e-5, 1e-6);
    const bool same_var =
        torch::allclose(actual.at("0.running_var"), expected.at("0.running_var"), 1e-5, 1e-6);
    EXPECT_EQ(same_mean && same_var, deferred)
        << (actual.at("0.running_var") - expected.at("0.running_var")).abs().max().item<double>();
    EXPECT_EQ(actual.at("0.num_batches_tracked").item<int64_t>(), deferred ? 8 : 32);
  }
}

// A layer of the user's own with a BatchNorm inside.
struct NormBlockImpl : torch::nn::Module {
  NormBlockImpl() : norm(register_module("norm", torch::nn::BatchNorm1d(8))) {}
  at::Tensor forward(const at::Tensor& x) { return norm(x); }
  torch::nn::BatchNorm1d norm;
};
TORCH_MODULE(NormBlock);

// What the deferral cannot honour is refused rather than trained per micro-batch.
TEST(DeferredBatchNorm, RefusesANestedBatchNormAndCudaGraphs) {
  const auto world = std::make_shared<World>();
  auto expect_refusal = [&](torch::nn::Sequential model, PipeOptions options,
                            const std::string& part) {
    try {
      Pipe pipe(model, options.deferred_batch_norm(true), world);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_refusal(
      torch::nn::Sequential(torch::nn::Linear(4, 8), NormBlock(), torch::nn::Linear(8, 6)),
      PipeOptions(), "layer 1 holds one inside");
  expect_refusal(torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8)),
                 PipeOptions().cuda_graphs(true).checkpoint("never"), "cannot be combined");
}

// Every rank is seeded alike (the Trainer's seed): the dropout of the second stage drew the very
// mask the first stage's drew, so half the elements came through both where a quarter does in one
// process.
TEST_F(UserModels, DropoutMasksOfDifferentStagesAreDrawnApart) {
  auto single = run("dropouts", "single");
  single.batch_size = 64;  // a batch an epoch, two epochs
  train(single);
  auto pipe = single;
  pipe.root = dir + "/pipe";
  pipe.strategy = "pipe";
  pipe.devices = 2;
  train_in_ranks(pipe, 2);
  for (const auto* r : {&single, &pipe}) {
    SCOPED_TRACE(r->root);
    const auto kept = read_csv_column(metrics_csv(r->root), "kept");
    ASSERT_EQ(kept.size(), 2u);
    for (double k : kept) EXPECT_NEAR(k, 0.25, 0.06);
  }
}

// A tie no copy used in a step got a gradient of zeros from the tied parameters' reduction, and
// AdamW stepped it (its weight decay shrank the ones), in one process and across stages alike;
// PyTorch's AdamW skips a parameter without a gradient. It stays as it was, and the rest trains
// as single.
TEST_F(UserModels, ATieNoStageUsesIsNotStepped) {
  auto single = run("unused_tie", "single");
  train(single);
  auto pipe = on_two("unused_tie", "pipe", "pipe");
  train_in_ranks(pipe, 2);
  for (const auto* r : {&single, &pipe}) {
    SCOPED_TRACE(r->root);
    const auto weights = r->final_weights();
    ASSERT_TRUE(weights.count("0.spare"));
    EXPECT_TRUE(torch::equal(weights.at("0.spare"), torch::ones({2, 2}))) << weights.at("0.spare");
  }
  expect_trained_as(single, {&pipe});
}

// A tie described layer by layer trains as single under pipe, its copies as one parameter. An
// optimizer given one copy and not the other (the first stage's) once trained the last stage's
// copy alone, and the checkpoint kept the untrained one; a copy frozen and another not hung the
// pipe's sum of the tie's gradients for the whole timeout. Both are refused before the first
// step, naming the tie, in one process as across stages.
TEST_F(UserModels, TiedCopiesTrainAsOneParameterOrAreRefused) {
  auto single = run("tied_per_rank", "single");
  train(single);
  auto pipe = on_two("tied_per_rank", "pipe", "pipe");
  pipe.chunks = 2;
  train_in_ranks(pipe, 2);
  expect_trained_as(single, {&pipe});

  const std::map<std::string, std::string> refusals{
      {"tie_left_out", "some of its copies are given to the optimizer and others are not"},
      {"tie_frozen_once",
       "some of its copies are frozen (requires_grad false) and others are not"}};
  for (const auto& [model, why] : refusals) {
    SCOPED_TRACE(model);
    auto alone = run(model, model + "-single");
    fs::create_directories(alone.root);
    const auto error = error_of<std::invalid_argument>([&] { train(alone); });
    EXPECT_NE(error.find("the tied parameter 0.weight, 2.weight trains as one parameter"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find(why), std::string::npos) << error;
    auto staged = on_two(model, model + "-pipe", "pipe");
    fs::create_directories(staged.root);
    EXPECT_NE(run_ranks(2, "user_model_worker", to_env(staged)), 0);
    for (int64_t rank : {0, 1}) {
      const std::string message = staged.recorded_error(rank);
      EXPECT_NE(message.find(why), std::string::npos) << "rank " << rank << ": " << message;
    }
  }
}

// A first layer that changes its input in place: under recomputation it ran again on the input it
// had changed (halved twice), and the first stage's weights took gradients of other activations
// than the loss saw (except_last, always); without it, the next micro-batch's change failed
// autograd's version check on the rows the first had saved (never). Every mode trains as single.
TEST_F(UserModels, ALayerChangingItsInputInPlaceTrainsAsSingleInEveryCheckpointMode) {
  auto single = run("halved_in_place", "single");
  train(single);
  for (const std::string mode : {"except_last", "always", "never"}) {
    SCOPED_TRACE(mode);
    auto pipe = on_two("halved_in_place", "pipe-" + mode, "pipe");
    pipe.chunks = 4;
    pipe.checkpoint = mode;
    train_in_ranks(pipe, 2);
    expect_trained_as(single, {&pipe});
  }
}

TEST_F(UserModels, DdpReplicasHoldReplicaZerosBatchNormStatistics) {
  auto ddp = on_two("normalised", "ddp", "ddp");
  ddp.batch_size = 8;
  train_in_ranks(ddp, 2);
  expect_same_weights(ddp.rank_tensors(0), ddp.rank_tensors(1), 0);
  const auto saved = ddp.final_weights();
  const auto replica0 = load_safetensors(ddp.rank_tensors(0));
  EXPECT_TRUE(torch::equal(saved.at("4.running_mean"), replica0.at("4.running_mean")));
}

}  // namespace
}  // namespace pipetrain::testing::user_models_test
