// `single`, `pipe`, `ddp` and `ddp_pipe`: replicas of a pipeline of stages, one process per stage
// and replica. `single` is one replica of one stage with one micro-batch, `pipe` one replica,
// `ddp` one stage, so all four share every code path and `single` stays the reference.
//
// Rank layout (as a ("replica", "stage") device mesh): rank = replica x stages + stage. So a
// pipeline is `stages` consecutive ranks (on one node when a node holds a whole pipeline, where
// activations travel most), and stage s's data-parallel group is ranks s, s + stages, ...
//
// The user's steps run on the last stage once per micro-batch, where forward() returns the
// pipeline's output for that micro-batch; what they log is reduced there, over the replicas'
// last stages, and broadcast along each pipeline.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "distributed/gradient_sync.h"
#include "distributed/world_connection.h"
#include "distributed/zero_partition.h"
#include "pipeline/pipe_options.h"
#include "pipeline/tied_parameters.h"
#include "pipetrain/balance.h"
#include "pipetrain/checkpoint_io.h"
#include "pipetrain/error.h"
#include "pipetrain/module.h"
#include "pipetrain/pipe.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer_options.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

// The index of the layer a global name ("3.weight") belongs to.
int64_t layer_of(const std::string& name) { return std::stoll(name.substr(0, name.find('.'))); }

// Every rank was seeded alike (TrainerOptions::seed), so the ranks of one pipeline would draw the
// same numbers: a dropout of the second stage kept exactly the elements the first stage's kept,
// where one process draws the two masks apart. A rank at place `place` > 0 of its pipeline
// reseeds the default generators (CPU and CUDA) from the run's seed and its place (splitmix64), as
// Megatron offsets its seed by the pipeline rank; the first place keeps the run's stream, so one
// process, and replicas of it, draw as before.
void draw_apart_from_other_stages(int64_t place) {
  if (place == 0) return;
  uint64_t seed = 0;
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed = generator.current_seed();
  }
  uint64_t z =
      (seed ^ 0x5851f42d4c957f2dULL) + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(place);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  torch::manual_seed(z ^ (z >> 31));
}

// `single` and `ddp` run the whole batch as one micro-batch on one stage, with nothing to
// recompute; CUDA graphs, fused accumulation and the trace apply as given. Asking them for
// micro-batches is refused rather than ignored.
PipeOptions whole_batches(const std::string& strategy, const TrainerOptions& options) {
  PipeOptions pipe = options.pipe();
  if (pipe.chunks() != 1) {
    throw std::invalid_argument(
        "strategy '" + strategy +
        "' runs each batch whole on one stage, so PipeOptions::chunks "
        "(--chunks) " +
        std::to_string(pipe.chunks()) +
        " would mean nothing: leave it at 1, use accumulate_grad_batches "
        "(--accumulate-grad-batches) for smaller steps, or strategy pipe / ddp_pipe to split "
        "batches into micro-batches");
  }
  if (pipe.virtual_stages() != 1) {
    throw std::invalid_argument("strategy '" + strategy +
                                "' runs the whole model as one stage, so PipeOptions::"
                                "virtual_stages (--virtual-stages) " +
                                std::to_string(pipe.virtual_stages()) +
                                " would mean nothing: leave it at 1, or use strategy pipe / "
                                "ddp_pipe");
  }
  pipe.balance({}).chunks(1).checkpoint("never").schedule("gpipe");
  return pipe;
}

std::string join_names(const std::map<std::string, std::pair<double, double>>& totals) {
  std::string names;
  for (const auto& item : totals) names += item.first + '\n';
  return names;
}

// The numbers under `key` in a checkpoint's layout; throws saying what a resume lacks without them.
std::vector<int64_t> layout_numbers(const std::map<std::string, std::string>& layout,
                                    const std::string& key) {
  const auto it = layout.find(key);
  if (it == layout.end()) {
    throw std::invalid_argument("the checkpoint's layout has no '" + key +
                                "', so it does not say which of its processes held which layers: "
                                "resume it under the layout that saved it");
  }
  std::vector<int64_t> numbers;
  std::stringstream text(it->second);
  for (std::string entry; std::getline(text, entry, ',');) numbers.push_back(std::stoll(entry));
  return numbers;
}

// The batch's loss as the user's steps computed it, from its micro-batches' losses: their means
// weighted by their rows, or their sum_over() sums over the counts. Summed in float64, so that a
// batch of one micro-batch gives back its loss exactly; on the device, no host wait.
class BatchLoss {
 public:
  void add_mean(const at::Tensor& loss, int64_t rows) {
    add(loss, static_cast<double>(rows));
    rows_ += rows;
  }
  void add_sum(const at::Tensor& sum, const at::Tensor& count) {
    add(sum, 1.0);
    counts_ = counts_.defined() ? counts_ + count : count;
  }
  // In the dtype the steps returned; undefined where no step ran. A batch whose sum_over() counts
  // add up to 0 gives its sum: nothing of it reaches the gradients unless the sum itself is not
  // finite, which the Trainer's check of this loss must then see.
  at::Tensor value() const {
    if (!total_.defined()) return {};
    const auto mean = counts_.defined() ? at::where(counts_ > 0, total_ / counts_, total_)
                                        : total_ / static_cast<double>(rows_);
    return mean.to(dtype_);
  }

 private:
  // One kernel a micro-batch after the first: the add promotes to total_'s float64.
  void add(const at::Tensor& loss, double weight) {
    total_ = total_.defined() ? total_.add(loss.detach(), weight)
                              : loss.detach().to(torch::kFloat64) * weight;
    dtype_ = loss.scalar_type();
  }
  at::Tensor total_;   // float64: the means times their rows, or the sums
  int64_t rows_ = 0;   // of the means
  at::Tensor counts_;  // of the sums
  at::ScalarType dtype_ = at::kFloat;
};

class PipelineStrategy : public Strategy {
 public:
  PipelineStrategy(std::string name, int64_t stages, int64_t replicas, PipeOptions options,
                   int64_t zero_stage = 0)
      : name_(std::move(name)),
        stages_(stages),
        replicas_(replicas),
        zero_stage_(zero_stage),
        options_(std::move(options)) {}

  int64_t world_size() const override { return stages_ * replicas_; }

  void build_layers(Module& module, const World& world, uint64_t seed) override {
    const auto& specs = module.layer_specs();
    const auto layers = static_cast<int64_t>(specs.size());
    if (options_.balance().empty()) {
      // By parameter count, as the Pipe balances a model built whole.
      const int64_t stages = stages_ * options_.virtual_stages();
      if (layers < stages) {
        throw std::invalid_argument("the model has " + std::to_string(layers) + " layers but " +
                                    std::to_string(stages) +
                                    " stages were asked for: every stage needs at least one "
                                    "layer; describe the model in more layers or use fewer stages");
      }
      std::vector<double> costs;
      for (const int64_t size : layer_sizes(specs, seed))
        costs.push_back(static_cast<double>(size));
      options_.balance(balance_by_cost(costs, stages));
    }
    validate_balance(options_.balance(), layers);
    // Layers built apart cannot share a tensor: their ties go by name.
    auto ties = options_.tied_parameters();
    for (int64_t i = 0; i < layers; ++i) {
      for (const auto& [own, other] : specs[static_cast<size_t>(i)].tied_to) {
        ties.push_back({other, std::to_string(i) + "." + own});
      }
    }
    options_.tied_parameters(ties);
    // The layers of the stages this process's place in its pipeline runs.
    const auto rank_of_stage = stage_ranks(options_, stages_);
    std::vector<bool> held(specs.size(), false);
    int64_t first = 0;
    for (size_t stage = 0; stage < options_.balance().size(); ++stage) {
      const int64_t end = first + options_.balance()[stage];
      if (rank_of_stage.at(stage) == world.rank() % stages_) {
        std::fill(held.begin() + first, held.begin() + end, true);
      }
      first = end;
    }
    module.build_layers(held, seed);
  }

  void setup(Module& module, std::shared_ptr<World> world) override {
    world_ = std::move(world);
    replica_ = world_->rank() / stages_;
    const int64_t stage = world_->rank() % stages_;
    std::vector<int64_t> pipeline_ranks, stage_ranks;
    for (int64_t s = 0; s < stages_; ++s) pipeline_ranks.push_back(replica_ * stages_ + s);
    for (int64_t r = 0; r < replicas_; ++r) stage_ranks.push_back(r * stages_ + stage);
    pipeline_ = replicas_ == 1
                    ? world_
                    : world_->group(pipeline_ranks, "pipeline" + std::to_string(replica_));
    replicas_of_stage_ =
        stages_ == 1 ? world_ : world_->group(stage_ranks, "stage" + std::to_string(stage));
    broadcast_initial_weights(module);
    draw_apart_from_other_stages(stage);
    pipe_ = std::make_unique<Pipe>(module.layers(), options_, pipeline_);
    if (replicas_ > 1) {
      if (zero_stage_ == 1) {
        zero_ = std::make_unique<ZeroPartition>(pipe_->parameters(), replicas_of_stage_);
      }
      // Under ZeRO a bucket holds one owner's gradients: the others' buckets are freed whole
      // before the optimizer step, and are not held through the next forward.
      gradient_sync_ =
          std::make_unique<GradientSync>(pipe_->parameters(), replicas_of_stage_,
                                         zero_ ? zero_->owners() : std::vector<int64_t>{});
      pipe_->set_last_backward_hook([this] {
        if (sync_this_step_) gradient_sync_->arm();
      });
    }
    module.place(
        [this](const at::Tensor& input) {
          if (!current_output_.defined()) {
            throw std::logic_error(
                "forward() runs only inside a step, on the step's batch.data (the Trainer "
                "computes it through the pipeline)");
          }
          if (!is_step_input(input)) {
            throw std::invalid_argument(
                "forward() was given a tensor of shape " + shape_text(input.sizes()) +
                " that is not the step's batch.data: the Trainer computes the model's output for "
                "batch.data alone (through every stage, before the step runs), so forward() takes "
                "nothing else. Put preprocessing into a layer at the front of the Sequential, or "
                "into the data");
          }
          if (current_output_._version() != current_output_version_) {
            throw std::logic_error(
                "forward() was called again in a step after its output was overwritten in place "
                "(chunked_cross_entropy_ writes the logits' gradient over them): under pipe "
                "forward() hands back the same tensor, which no longer holds the logits. Take "
                "what else the step needs from the logits before the in-place loss, or use "
                "chunked_cross_entropy");
          }
          return current_output_;
        },
        pipe_->stage_module());
  }

  BatchShard batch_shard() const override {
    BatchShard shard;
    shard.replica = replica_;
    shard.replicas = replicas_;
    shard.inputs = pipe_->is_first_stage();
    shard.targets = pipe_->is_last_stage();
    return shard;
  }

  at::Tensor training_step(Module& module, const Batch& host_batch, int64_t batch_idx,
                           const StepOptions& options, LoggedMetrics& metrics) override {
    const Batch batch = on_device(host_batch);
    sync_this_step_ = gradient_sync_ && options.sync_gradients;
    batch_loss_ = BatchLoss();
    pipe_->forward_backward_unscaled(
        batch.data, batch.data.size(0), [&](const at::Tensor& output, const MicroBatch& mb) {
          return loss_to_backward(module, batch, batch_idx, mb, output, options, metrics);
        });
    if (sync_this_step_) gradient_sync_->finish();
    if (options.sync_gradients) {
      if (losses_are_sums()) normalize_summed_gradients();
      pipe_->reduce_tied_gradients();
    }
    if (replicas_ > 1) broadcast_buffers();
    return batch_loss_.value();
  }

  void evaluation_step(Module& module, const Batch& host_batch, int64_t batch_idx,
                       const EvaluationStep& step, LoggedMetrics& metrics) override {
    // A replica left without a row of the last global batch (every stage of it sees 0 rows).
    if (host_batch.data.size(0) == 0) return;
    const Batch batch = on_device(host_batch);
    auto evaluate = [&](const Batch& micro) {
      step(micro, batch_idx);
      return at::Tensor();
    };
    pipe_->forward(batch.data, batch.data.size(0),
                   [&](const at::Tensor& output, const MicroBatch& mb) {
                     run_user_step(module, batch, mb, output, &metrics, evaluate);
                   });
  }

  at::Tensor predict_step(Module& module, const Batch& host_batch, int64_t batch_idx) override {
    const Batch batch = on_device(host_batch);
    std::vector<at::Tensor> outputs;
    auto predict = [&](const Batch& micro) { return module.predict_step(micro, batch_idx); };
    // A replica left without a row of the last global batch predicts nothing (and sends rank 0
    // an empty tensor, which it leaves out).
    const bool empty = batch.data.size(0) == 0;
    if (!empty) {
      pipe_->forward(
          batch.data, batch.data.size(0), [&](const at::Tensor& output, const MicroBatch& mb) {
            outputs.push_back(run_user_step(module, batch, mb, output, nullptr, predict));
          });
    }
    const at::Tensor mine = !pipe_->is_last_stage() ? at::Tensor()
                            : empty                 ? torch::empty({0})
                                                    : torch::cat(outputs);
    if (world_->size() == 1) return mine.cpu();
    // Each replica's last stage sends its shard's predictions to rank 0, which puts them back in
    // the batch's order: replica by replica.
    std::vector<at::Tensor> gathered;
    for (int64_t replica = 0; replica < replicas_; ++replica) {
      const int64_t last = replica * stages_ + pipe_->rank_of_stage(pipe_->stages() - 1);
      at::Tensor shard = world_->gather_to_zero(mine, last);
      if (replica == 0 || shard.numel() > 0) gathered.push_back(std::move(shard));
    }
    return world_->is_global_zero() ? torch::cat(gathered) : at::Tensor();
  }

  ReducedMetrics reduce_metrics(const LoggedMetrics& metrics) override {
    ReducedMetrics reduced;
    if (pipe_->is_last_stage()) reduced = reduce_over_replicas(metrics);
    return stages_ == 1 ? reduced : share_along_pipeline(reduced);
  }

  void setup_optimizer(torch::optim::Optimizer& optimizer) override {
    std::vector<at::Tensor> optimized;
    for (const auto& group : optimizer.param_groups()) {
      optimized.insert(optimized.end(), group.params().begin(), group.params().end());
    }
    pipe_->tied_parameters().check_trained_alike(optimized);
    if (zero_) zero_->shard(optimizer);
  }

  void optimizer_step(torch::optim::Optimizer& optimizer) override {
    if (zero_) zero_->drop_others_gradients();  // no optimizer state, no use: memory back first
    optimizer.step();
    if (zero_) zero_->broadcast_parameters();
  }

  // Under ZeRO each replica writes the state of the parameters it owns.
  bool saves_optimizer_state() const override { return replica_ == 0 || zero_; }

  at::Tensor gradient_norm(const std::vector<at::Tensor>& parameters) override {
    // A tied parameter counts once, on the first stage holding it.
    std::vector<at::Tensor> gradients;
    for (const auto& p : parameters) {
      if (p.grad().defined() && !pipe_->tied_parameters().is_extra_copy(p)) {
        gradients.push_back(p.grad());
      }
    }
    auto sum_of_squares = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(device()));
    if (!gradients.empty()) {
#if TORCH_VERSION_MAJOR >= 2
      // One kernel for every gradient's norm, instead of three per gradient.
      sum_of_squares =
          torch::stack(at::_foreach_norm(gradients, 2)).to(torch::kFloat64).pow(2).sum();
#else
      for (const auto& g : gradients) sum_of_squares += g.to(torch::kFloat64).pow(2).sum();
#endif
    }
    // Replicas hold the same (averaged) gradients: the sum runs over the stages of one pipeline.
    return pipeline_->all_reduce_sum_on_device(sum_of_squares).sqrt();
  }

  WeightShard weight_shard(Module& module) override {
    // Each process of the first replica writes its own stages' layers, a tied parameter once, by
    // the stage holding its first name (loading gives it to every name); the other replicas hold
    // the same and write none. Nothing is gathered.
    std::set<std::string> copies;
    for (const auto& tie : pipe_->tied_parameters().ties()) {
      copies.insert(tie.names.begin() + 1, tie.names.end());
    }
    WeightShard shard;
    shard.count = stages_;
    shard.index = replica_ == 0 ? pipeline_->rank() : -1;
    if (shard.index < 0) return shard;
    auto everything = module.layers()->named_parameters();
    for (const auto& b : module.layers()->named_buffers()) everything.insert(b.key(), b.value());
    for (const auto& item : everything) {
      if (holds_layer(layer_of(item.key())) && !copies.count(item.key())) {
        shard.weights[item.key()] = item.value().detach();
      }
    }
    return shard;
  }

  std::map<std::string, std::string> tied_names() const override {
    std::map<std::string, std::string> first_names;
    for (const auto& tie : pipe_->tied_parameters().ties()) {
      for (const auto& name : tie.names) {
        if (name != tie.names.front()) first_names[name] = tie.names.front();
      }
    }
    return first_names;
  }

  void load_weights(Module& module, const StoredWeights& stored) override {
    // A tied parameter was stored once, under its first name: every name loads it.
    auto stored_under = tied_names();
    // The model is checked against what is stored (where built per rank, each process its own
    // layers); each process reads its own layers' tensors.
    auto layers = module.layers();
    WeightSelection selection;
    selection.wanted = [&](const std::string& name) { return holds_layer(layer_of(name)); };
    selection.held_elsewhere = [&](const std::string& name) {
      return held_elsewhere(layers, name);
    };
    selection.stored_under = std::move(stored_under);
    pipetrain::load_weights(layers, stored, selection);
  }

  std::map<std::string, std::string> layout() const override {
    std::map<std::string, std::string> layout{{"stages", std::to_string(pipe_->stages())},
                                              {"balance", format_balance(pipe_->balance())},
                                              {"replicas", std::to_string(replicas_)}};
    // Where ranks run several stages, which rank ran each (otherwise stage s is rank s).
    std::vector<int64_t> ranks;
    bool moved = false;
    for (int64_t stage = 0; stage < pipe_->stages(); ++stage) {
      ranks.push_back(pipe_->rank_of_stage(stage));
      moved |= ranks.back() != stage;
    }
    if (moved) layout["stage_ranks"] = format_balance(ranks);  // "0,1,1,0", as balance
    if (zero_) layout["zero_stage"] = std::to_string(zero_stage_);
    return layout;
  }

  std::vector<int64_t> optimizer_state_ranks(const std::map<std::string, std::string>& saved_layout,
                                             int64_t saved_world_size,
                                             int64_t rank) const override {
    // The same layout: the first replica's rank running this rank's stage; under ZeRO, this
    // rank's own file (the partition is the same).
    if (saved_layout == layout() && saved_world_size == world_size()) {
      return {zero_ ? rank : rank % stages_};
    }
    // Any other: the first replica's ranks whose stages held any of this rank's layers, and where
    // ZeRO shared their state out, the same ranks of every replica.
    const auto balance = layout_numbers(saved_layout, "balance");
    std::vector<int64_t> rank_of_stage;
    if (saved_layout.count("stage_ranks")) {
      rank_of_stage = layout_numbers(saved_layout, "stage_ranks");
    } else {
      for (size_t stage = 0; stage < balance.size(); ++stage) {
        rank_of_stage.push_back(static_cast<int64_t>(stage));
      }
    }
    std::set<int64_t> mine;
    for (const auto& item : pipe_->stage_module()->named_children()) {
      mine.insert(std::stoll(item.key()));
    }
    std::set<int64_t> ranks;
    int64_t first = 0;
    for (size_t stage = 0; stage < balance.size(); ++stage) {
      const auto hit = mine.lower_bound(first);
      if (hit != mine.end() && *hit < first + balance[stage]) ranks.insert(rank_of_stage.at(stage));
      first += balance[stage];
    }
    if (saved_layout.count("zero_stage")) {
      const int64_t saved_replicas = layout_numbers(saved_layout, "replicas").at(0);
      const int64_t pipeline_size = saved_world_size / saved_replicas;
      for (const int64_t first_replica : std::set<int64_t>(ranks)) {
        for (int64_t replica = 1; replica < saved_replicas; ++replica) {
          ranks.insert(replica * pipeline_size + first_replica);
        }
      }
    }
    return {ranks.begin(), ranks.end()};
  }

  void check_data(const DataLoader& loader) const override {
    check_chunks_fit(options_.chunks(), loader.batch_size());
  }

  std::map<std::string, std::string> hyperparameters() const override {
    return {{"stages", std::to_string(stages_)},
            {"replicas", std::to_string(replicas_)},
            {"chunks", std::to_string(options_.chunks())},
            {"schedule",
             options_.schedule_file().empty() ? options_.schedule() : options_.schedule_file()},
            {"virtual_stages", std::to_string(options_.virtual_stages())},
            {"max_in_flight", std::to_string(options_.max_in_flight())},
            {"checkpoint", options_.checkpoint()},
            {"zero_stage", std::to_string(zero_ ? zero_stage_ : 0)}};
  }

  std::string describe() const override {
    std::string text = "strategy " + name_ + ": " + placement() + ", " + pipe_->execution();
    if (zero_) {
      // What rank 0's share came to: whole tensors, so about 1 / replicas.
      const auto percent = static_cast<int64_t>(
          std::lround(100.0 * static_cast<double>(zero_->owned_bytes()) /
                      static_cast<double>(std::max<int64_t>(1, zero_->total_bytes()))));
      text += ", ZeRO stage 1 over " + std::to_string(replicas_) +
              " replicas: rank 0 keeps the optimizer state of " + std::to_string(percent) +
              "% of its stage's parameters";
    }
    return text;
  }

 private:
  // "2 stages, balance 4,4, chunks 3, schedule 1f1b, checkpoint always", "2 replicas", ...
  std::string placement() const {
    std::string text;
    if (replicas_ > 1) {
      text += std::to_string(replicas_) + " replicas";
      if (stages_ == 1) return text;
      text += " x ";
    } else if (stages_ == 1 && options_.chunks() == 1) {
      return "1 process";
    }
    return text + std::to_string(pipe_->stages()) + " stages, balance " +
           format_balance(pipe_->balance()) + ", chunks " + std::to_string(options_.chunks()) +
           ", schedule " +
           (options_.schedule_file().empty() ? options_.schedule()
                                             : "from " + options_.schedule_file()) +
           (options_.virtual_stages() > 1
                ? " over " + std::to_string(options_.virtual_stages()) + " virtual stages per rank"
                : std::string()) +
           ", checkpoint " + options_.checkpoint();
  }
  // Runs one of the user's steps on micro-batch `mb` of `batch`, forward() yielding `output` and
  // log() going to `metrics` weighted by the micro-batch's rows (refused where `metrics` is
  // nullptr: predict_step logs nothing, as in Lightning).
  template <typename Step>
  at::Tensor run_user_step(Module& module, const Batch& batch, const MicroBatch& mb,
                           const at::Tensor& output, LoggedMetrics* metrics, const Step& step) {
    const Batch micro = batch.slice(mb.begin, mb.end);
    current_output_ = output;
    current_output_version_ = output.defined() ? output._version() : 0;
    current_input_ = micro.data;
    module.set_log_target(metrics, mb.size());
    struct Reset {
      PipelineStrategy* self;
      Module& module;
      ~Reset() {
        self->current_output_ = at::Tensor();
        self->current_input_ = at::Tensor();
        module.set_log_target(nullptr, 0);
        module.take_summed_loss();  // a sum_over() of this step means nothing to the next
      }
    } reset{this, module};
    return step(micro);
  }

  // The user's training_step on micro-batch `mb`, as the tensor the pipe backpropagates as it is:
  // how each micro-batch weighs is decided here alone. A mean loss is scaled by the Trainer's
  // share for this batch (replica, accumulation) and the micro-batch's share of the batch; a
  // sum_over() loss stays its sum, its count kept for the optimizer step.
  at::Tensor loss_to_backward(Module& module, const Batch& batch, int64_t batch_idx,
                              const MicroBatch& mb, const at::Tensor& output,
                              const StepOptions& options, LoggedMetrics& metrics) {
    std::optional<Module::SummedLoss> summed;
    const auto loss = run_user_step(module, batch, mb, output, &metrics, [&](const Batch& micro) {
      auto result = module.training_step(micro, batch_idx);
      summed = module.take_summed_loss();
      return result;
    });
    if (window_sums_.has_value() && *window_sums_ != summed.has_value()) {
      throw std::invalid_argument(
          "training_step returned sum_over() for some batches and a mean for others of one "
          "optimizer step: return one kind of loss on every batch");
    }
    window_sums_ = summed.has_value();
    if (!summed) {
      batch_loss_.add_mean(loss, mb.size());
      return loss * options.loss_scale * mb.share_of(batch.data.size(0));
    }
    if (!loss.is_same(summed->result)) {
      throw std::invalid_argument(
          "training_step returned a tensor computed from sum_over()'s result: return the result "
          "itself (scale the sum before giving it to sum_over)");
    }
    batch_loss_.add_sum(summed->sum, summed->count);
    summed_count_ = summed_count_.defined() ? summed_count_ + summed->count : summed->count;
    return summed->sum;
  }

  // Whether this optimizer step's losses were sum_over() sums: learnt from the last stage at the
  // first step (the one host wait it costs), then checked there at every step.
  bool losses_are_sums() {
    const bool mine = pipe_->is_last_stage() && window_sums_.value_or(false);
    if (!sums_losses_) {
      sums_losses_ = pipeline_->any(mine);
    } else if (pipe_->is_last_stage() && window_sums_ && *window_sums_ != *sums_losses_) {
      throw std::invalid_argument(
          "training_step returned sum_over() in some optimizer steps and a mean in others: "
          "return one kind of loss on every batch");
    }
    window_sums_.reset();
    return *sums_losses_;
  }

  // The gradients of the summed losses become the gradient of the global sum over the global
  // count: over micro-batches and accumulated batches (summed here), and replicas (whose average
  // GradientSync took). The count travels on the device: no host wait.
  void normalize_summed_gradients() {
    torch::NoGradGuard no_grad;
    const bool last = pipe_->is_last_stage();
    std::vector<at::Tensor> count{
        last && summed_count_.defined()
            ? summed_count_.reshape({1}).clone()
            : torch::zeros({1}, torch::TensorOptions(torch::kFloat64).device(device()))};
    summed_count_ = at::Tensor();
    if (replicas_ > 1 && last) {
      wait(*replicas_of_stage_, process_group(*replicas_of_stage_)->allreduce(count));
    }
    if (stages_ > 1) wait(*pipeline_, process_group(*pipeline_)->allreduce(count));
    const auto scale = static_cast<double>(replicas_) / count[0];
    for (const auto& p : pipe_->parameters()) {
      if (p.grad().defined()) p.grad().mul_(scale.to(p.grad().scalar_type()));
    }
  }

  // The means of what every replica's last stage logged, weighted by samples. Replicas run the
  // same step code on the same number of batches, so they log the same names.
  ReducedMetrics reduce_over_replicas(const LoggedMetrics& metrics) {
    if (replicas_ == 1) return metrics.reduce();
    // The first replica has a row wherever any replica has one (the rows of a short last
    // global batch go to the first replicas), so its names are all of them: a replica left
    // without a row of a batch may have logged fewer, never others.
    auto totals = metrics.totals();
    const std::string names = join_names(totals);
    const std::string first_names = replicas_of_stage_->broadcast(names);
    std::map<std::string, std::pair<double, double>> all;
    std::istringstream lines(first_names);
    for (std::string name; std::getline(lines, name);) {
      const auto found = totals.find(name);
      all[name] = found == totals.end() ? std::pair<double, double>{0, 0} : found->second;
    }
    if (std::any_of(totals.begin(), totals.end(),
                    [&](const auto& item) { return all.count(item.first) == 0; })) {
      throw std::runtime_error("replicas logged different metrics (rank " +
                               std::to_string(world_->rank()) + " logged: " + names +
                               "; the first replica: " + first_names +
                               "): log the same names on every batch");
    }
    totals = std::move(all);
    auto sums = torch::zeros({2 * static_cast<int64_t>(totals.size())}, torch::kFloat64);
    int64_t i = 0;
    for (const auto& [name, total] : totals) {
      sums[i++] = total.first;
      sums[i++] = total.second;
    }
    std::vector<at::Tensor> tensors{sums.to(device())};
    wait(*replicas_of_stage_, process_group(*replicas_of_stage_)->allreduce(tensors));
    sums = tensors[0].cpu();
    ReducedMetrics reduced;
    i = 0;
    for (const auto& [name, total] : totals) {
      const double weighted = sums[i++].item<double>(), samples = sums[i++].item<double>();
      const auto logged = metrics.options().find(name);
      const auto logged_name = metrics.logged_names().find(name);
      reduced[name] = {
          weighted / samples, logged != metrics.options().end() && logged->second.prog_bar(),
          logged_name == metrics.logged_names().end() ? std::string() : logged_name->second};
    }
    return reduced;
  }

  // The last stage's metrics on every stage of the pipeline (callbacks on every rank decide
  // alike; rank 0 logs them): their names, prog_bar flags and logged names as lines of
  // tab-separated fields (log() refuses tabs and line breaks in names), their values as one
  // float64 tensor, exact.
  ReducedMetrics share_along_pipeline(const ReducedMetrics& metrics) const {
    const int64_t root = pipe_->rank_of_stage(pipe_->stages() - 1);
    std::string names;
    for (const auto& [name, metric] : metrics) {
      names += name + (metric.prog_bar ? "\t1\t" : "\t0\t") + metric.logged_name + '\n';
    }
    std::istringstream lines(pipeline_->broadcast(names, root));
    std::vector<std::pair<std::string, ReducedMetric>> order;
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      std::string name, prog_bar, logged_name;
      std::getline(fields, name, '\t');
      std::getline(fields, prog_bar, '\t');
      std::getline(fields, logged_name);
      order.emplace_back(name, ReducedMetric{0, prog_bar == "1", logged_name});
    }
    ReducedMetrics shared;
    if (order.empty()) return shared;
    auto values = torch::zeros({static_cast<int64_t>(order.size())}, torch::kFloat64);
    if (pipeline_->rank() == root) {
      auto value = values.accessor<double, 1>();
      for (size_t i = 0; i < order.size(); ++i) value[i] = metrics.at(order[i].first).value;
    }
    values = values.to(device());
    pipeline_->broadcast_into(values, root);
    values = values.cpu();
    const auto value = values.accessor<double, 1>();
    for (size_t i = 0; i < order.size(); ++i) {
      order[i].second.value = value[i];
      shared[order[i].first] = order[i].second;
    }
    return shared;
  }

  c10::Device device() const { return world_->device(); }

  // Whether `input` is the step's batch.data (or a view of exactly its elements).
  bool is_step_input(const at::Tensor& input) const {
    if (!input.defined()) return false;
    if (input.unsafeGetTensorImpl() == current_input_.unsafeGetTensorImpl()) return true;
    return input.numel() > 0 && input.data_ptr() == current_input_.data_ptr() &&
           input.sizes().equals(current_input_.sizes()) &&
           input.strides().equals(current_input_.strides()) &&
           input.scalar_type() == current_input_.scalar_type();
  }

  // Replica 0's buffers (BatchNorm's running statistics) become every replica's, as DDP's
  // broadcast_buffers does, so replicas never drift apart and a checkpoint holds what all hold.
  void broadcast_buffers() {
    torch::NoGradGuard no_grad;
    for (const auto& b : pipe_->stage_module()->buffers()) replicas_of_stage_->broadcast_into(b);
  }

  // The batch where the model runs, moved once (Lightning's transfer_batch_to_device).
  Batch on_device(const Batch& batch) const {
    return batch.map([&](const at::Tensor& tensor) { return tensor.to(device()); });
  }

  int64_t first_layer_of(int64_t stage) const {
    int64_t first = 0;
    for (int64_t s = 0; s < stage; ++s) first += pipe_->balance()[s];
    return first;
  }

  // Whether `layer` (its index in the Sequential) is in one of this process's stages.
  bool holds_layer(int64_t layer) const {
    for (int64_t stage = 0; stage < pipe_->stages(); ++stage) {
      const int64_t first = first_layer_of(stage);
      if (layer >= first && layer < first + pipe_->balance()[stage]) {
        return pipe_->rank_of_stage(stage) == pipeline_->rank();
      }
    }
    return false;
  }

  // Rank 0's weights become everyone's, as DDP does, so a rank seeded differently cannot silently
  // train different initial weights. A model built per rank holds its own layers alone: the first
  // replica's become the other replicas' (each layer's seed already makes them equal).
  void broadcast_initial_weights(Module& module) {
    const auto& among = module.layer_specs().empty() ? world_ : replicas_of_stage_;
    if (among->size() == 1) return;
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors = module.layers()->parameters();
    for (const auto& b : module.layers()->buffers()) tensors.push_back(b);
    for (auto& t : tensors) {
      const at::Tensor here = t.to(device());
      among->broadcast_into(here);
      if (!here.is_same(t)) t.copy_(here);
    }
  }

  std::string name_;
  int64_t stages_;
  int64_t replicas_;
  int64_t zero_stage_;   // as asked for; zero_ where there are replicas to share among
  PipeOptions options_;  // as the pipe runs them
  std::shared_ptr<World> world_;
  std::shared_ptr<World> pipeline_;           // this replica's stages
  std::shared_ptr<World> replicas_of_stage_;  // this stage in every replica
  int64_t replica_ = 0;
  std::unique_ptr<Pipe> pipe_;
  std::unique_ptr<GradientSync> gradient_sync_;
  std::unique_ptr<ZeroPartition> zero_;  // ZeRO stage 1: this replica's share of the optimizer
  bool sync_this_step_ = false;
  std::optional<bool> window_sums_;      // whether this optimizer step's losses are sum_over() sums
  std::optional<bool> sums_losses_;      // the same, learnt at the first optimizer step
  at::Tensor summed_count_;              // the sum_over() counts of this optimizer step so far
  BatchLoss batch_loss_;                 // the user's losses of the batch running (last stage)
  at::Tensor current_output_;            // forward()'s answer while a step runs
  uint32_t current_output_version_ = 0;  // its version then: an in-place loss changes it
  at::Tensor current_input_;             // the step's batch.data, the one input forward() takes
};

}  // namespace

namespace {

// ZeRO shares optimizer state out among data-parallel replicas: stage 1 under ddp and ddp_pipe.
void check_zero_stage(const std::string& strategy, const TrainerOptions& options) {
  const int64_t stage = options.zero_stage();
  if (stage == 0) return;
  if (strategy == "single" || strategy == "pipe") {
    throw std::invalid_argument(
        "zero_stage (--zero-stage) " + std::to_string(stage) +
        " shares optimizer state out among data-parallel replicas, which strategy '" + strategy +
        "' does not have: use strategy ddp or ddp_pipe, or leave zero_stage at 0");
  }
  if (stage != 1) {
    throw std::invalid_argument("zero_stage (--zero-stage) " + std::to_string(stage) +
                                " is not supported: 1 shares the optimizer state out among the "
                                "replicas (gradients and parameters stay whole), 0 does not");
  }
}

}  // namespace

std::unique_ptr<Strategy> make_single_strategy(const TrainerOptions& options) {
  check_zero_stage("single", options);
  if (options.devices() * options.num_nodes() != 1) {
    throw std::invalid_argument("strategy 'single' runs on one device, but devices is " +
                                std::to_string(options.devices() * options.num_nodes()) +
                                ": use --devices 1, or --strategy pipe to split the model");
  }
  return std::make_unique<PipelineStrategy>("single", 1, 1, whole_batches("single", options));
}

namespace {

int64_t total_devices(const TrainerOptions& options) {
  if (options.devices() < 1 || options.num_nodes() < 1) {
    throw std::invalid_argument("devices and num_nodes must be at least 1 (got " +
                                std::to_string(options.devices()) + " and " +
                                std::to_string(options.num_nodes()) + ")");
  }
  return options.devices() * options.num_nodes();
}

}  // namespace

std::unique_ptr<Strategy> make_pipe_strategy(const TrainerOptions& options) {
  const int64_t stages = total_devices(options);
  check_zero_stage("pipe", options);
  check_pipe_options(options.pipe(), stages, "devices (" + std::to_string(stages) + ")");
  return std::make_unique<PipelineStrategy>("pipe", stages, 1, options.pipe());
}

std::unique_ptr<Strategy> make_ddp_strategy(const TrainerOptions& options) {
  check_zero_stage("ddp", options);
  return std::make_unique<PipelineStrategy>("ddp", 1, total_devices(options),
                                            whole_batches("ddp", options), options.zero_stage());
}

std::unique_ptr<Strategy> make_ddp_pipe_strategy(const TrainerOptions& options) {
  const int64_t devices = total_devices(options);
  int64_t stages = options.stages();
  if (stages == 0) {
    stages = static_cast<int64_t>(options.pipe().balance().size()) /
             std::max<int64_t>(1, options.pipe().virtual_stages());
  }
  if (stages < 1) {
    throw std::invalid_argument(
        "strategy 'ddp_pipe' needs the number of stages per pipeline: pass --stages (or "
        "--balance)");
  }
  if (devices % stages != 0) {
    throw std::invalid_argument("--stages " + std::to_string(stages) + " does not divide the " +
                                std::to_string(devices) +
                                " devices into whole pipelines: make devices x num_nodes a "
                                "multiple of --stages");
  }
  check_pipe_options(options.pipe(), stages, "--stages " + std::to_string(stages));
  check_zero_stage("ddp_pipe", options);
  return std::make_unique<PipelineStrategy>("ddp_pipe", stages, devices / stages, options.pipe(),
                                            options.zero_stage());
}

}  // namespace pipetrain
