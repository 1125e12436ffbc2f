// How the Trainer places a model on processes and devices, chosen by name as in Lightning
// (`strategy="pipe"`). New strategies register a factory under a name of their own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/data.h"
#include "pipetrain/module.h"

namespace pipetrain {

class World;
struct TrainerOptions;

// How the Trainer wants one batch's backward treated.
struct StepOptions {
  // Multiplies the loss: 1 / accumulate_grad_batches, times the replica's share of the batch.
  double loss_scale = 1;
  // The last batch before an optimizer step: reduce gradients across data-parallel replicas.
  bool sync_gradients = true;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // Processes this strategy runs on (the Trainer launches them when no launcher did).
  virtual int64_t world_size() const = 0;
  // Builds a model described layer by layer (Module::layer_specs) on this process of `world`: the
  // layers this process will hold, under `seed` (layer_spec.h). By default, every layer. Called
  // before setup.
  virtual void build_layers(Module& module, const World& /*world*/, uint64_t seed) {
    module.build_layers(std::vector<bool>(module.layer_specs().size(), true), seed);
  }
  // Places `module` on this process: after it, module.forward() and module.parameters() mean what
  // they mean for this rank.
  virtual void setup(Module& module, std::shared_ptr<World> world) = 0;
  // Which part of each batch this process reads (its replica's shard; inputs and targets only
  // where the model needs them).
  virtual BatchShard batch_shard() const { return {}; }
  // Forward and backward of one batch; gradients accumulate into parameters() (averaged over
  // replicas when `step.sync_gradients`); log() calls go to `metrics`. Returns the batch's loss as
  // training_step computed it, unscaled (TrainBatchOutputs::loss in callback.h), detached and
  // possibly still on the device, where it was computed; undefined elsewhere. The Trainer hands it
  // to on_train_batch_end and stops on a loss that is not finite.
  virtual at::Tensor training_step(Module& module, const Batch& batch, int64_t batch_idx,
                                   const StepOptions& step, LoggedMetrics& metrics) = 0;
  // Forward only (no autograd, no recomputation): runs `step` (validation_step or test_step)
  // wherever the model's output is, with forward() yielding it.
  using EvaluationStep = std::function<void(const Batch& batch, int64_t batch_idx)>;
  virtual void evaluation_step(Module& module, const Batch& batch, int64_t batch_idx,
                               const EvaluationStep& step, LoggedMetrics& metrics) = 0;
  // predict_step's output for the batch's rows, on rank 0; undefined elsewhere.
  virtual at::Tensor predict_step(Module& module, const Batch& batch, int64_t batch_idx) = 0;
  // The sample-weighted means of `metrics` as logged wherever the steps ran (over every replica),
  // on every rank.
  // A collective: every rank calls it at the same point.
  virtual ReducedMetrics reduce_metrics(const LoggedMetrics& metrics) = 0;
  // Makes the optimizer configure_optimizers() built this strategy's own, before its first step
  // and before a checkpoint's state is loaded into it (ZeRO: only this replica's share of the
  // parameters stays in it).
  virtual void setup_optimizer(torch::optim::Optimizer& /*optimizer*/) {}
  // One optimizer step, after the gradients have been clipped: afterwards every rank holds the
  // parameters it trains updated, and no gradient of them survives into the next step that the
  // optimizer's zero_grad() does not clear. A collective where parameters are shared out.
  virtual void optimizer_step(torch::optim::Optimizer& optimizer) { optimizer.step(); }
  // Whether this process writes its optimizer's state into a checkpoint (replicas holding the
  // same state leave it to the first).
  virtual bool saves_optimizer_state() const { return batch_shard().replica == 0; }
  // The L2 norm of the gradients of `parameters` (this process's share of those the optimizer
  // trains) over the whole model (every stage), as one process would compute it: a float64 scalar
  // on this rank's device, which the host need not wait for. A collective.
  virtual at::Tensor gradient_norm(const std::vector<at::Tensor>& parameters) = 0;
  // What this process writes of a checkpoint's weights: every parameter and buffer of the layers
  // it holds under its global name ("3.weight"), as file `index` of the `count` the processes
  // write together (checkpoint_io.h). By default one process holds them all. A collective.
  virtual WeightShard weight_shard(Module& module) {
    WeightShard shard;
    auto layers = module.layers();
    for (const auto& item : layers->named_parameters()) shard.weights[item.key()] = item->detach();
    for (const auto& item : layers->named_buffers()) shard.weights[item.key()] = item->detach();
    return shard;
  }
  // The inverse of weight_shard, on every rank: copies the stored weights this process holds into
  // the model; throws naming the file before changing anything when they do not fit the model.
  virtual void load_weights(Module& module, const StoredWeights& stored) {
    auto layers = module.layers();
    pipetrain::load_weights(layers, stored);
  }
  // The name each copy of a tied parameter goes by in checkpoints ({"5.weight": "0.weight"}): the
  // tie's first name, wherever the copies are separate tensors (layers built apart). By default,
  // none.
  virtual std::map<std::string, std::string> tied_names() const { return {}; }
  // What a checkpoint's optimizer state depends on, e.g. {"stages": "2", "balance": "7,8"}.
  virtual std::map<std::string, std::string> layout() const = 0;
  // The ranks of a checkpoint saved under `saved_layout` by `saved_world_size` processes whose
  // files (rank-<r>.pt) hold the optimizer state of the parameters process `rank` trains. Only the
  // first replica's ranks save it (replicas hold the same state). By default a checkpoint resumes
  // under the layout that saved it alone, each rank reading its stage's file of the first replica
  // (rank = replica x stages + stage); a strategy placing layers otherwise says where they were.
  virtual std::vector<int64_t> optimizer_state_ranks(
      const std::map<std::string, std::string>& saved_layout, int64_t saved_world_size,
      int64_t rank) const {
    if (saved_layout != layout() || saved_world_size != world_size()) {
      throw std::invalid_argument(
          "this checkpoint was saved under another layout than this strategy's, which cannot say "
          "which of its processes held this one's parameters: resume it under the layout that "
          "saved it");
    }
    return {rank % (world_size() / batch_shard().replicas)};
  }
  // A line describing the placement, printed once by rank 0.
  virtual std::string describe() const = 0;
  // Throws std::invalid_argument, naming the options, when this strategy cannot train batches
  // of `loader` (more micro-batches than rows).
  virtual void check_data(const DataLoader& /*loader*/) const {}
  // Options that will not do what they say with the others (the precision, the device), each a
  // line the Trainer prints once on rank 0 after setup.
  virtual std::vector<std::string> warnings() const { return {}; }
  // The options this strategy runs with, as they go into hparams.yaml ({"chunks": "4", ...}):
  // what ran, not what was asked for.
  virtual std::map<std::string, std::string> hyperparameters() const { return {}; }
};

// Builds a strategy from the Trainer's options; throws std::invalid_argument on options it cannot
// honour (e.g. `single` with 2 devices).
using StrategyFactory = std::function<std::unique_ptr<Strategy>(const TrainerOptions&)>;

void register_strategy(const std::string& name, StrategyFactory factory);
// Throws std::invalid_argument naming the registered strategies when `name` is unknown.
std::unique_ptr<Strategy> create_strategy(const std::string& name, const TrainerOptions& options);
std::vector<std::string> strategy_names();

}  // namespace pipetrain
