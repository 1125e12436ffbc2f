// Pipe: builds this rank's stages from the Sequential (balance, schedule, placement, fusion,
// ties, how the stages execute) and answers what they are. Running them is the executor's
// (pipe_executor.cpp); choosing a schedule by timing it, pipe_schedule_choice.cpp.
#include "pipetrain/pipe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "deferred_batch_norm.h"
#include "distributed/p2p.h"
#include "ops/fused_linear.h"
#include "pipe_impl.h"
#include "pipe_options.h"
#include "pipeline/plan.h"
#include "pipeline/tied_parameters.h"
#include "pipeline/trace.h"
#include "pipetrain/balance.h"
#include "pipetrain/error.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/world.h"
#include "schedule_choice.h"
#include "schedule_file.h"
#include "stage_execution.h"
#include "stage_graphs.h"
#include "stage_value.h"
#include "util/compat.h"

namespace pipetrain {

Pipe::Pipe(torch::nn::Sequential sequential, PipeOptions options, std::shared_ptr<World> world)
    : impl_(std::make_unique<Impl>(std::move(sequential), std::move(options), std::move(world))) {}

Pipe::~Pipe() = default;

at::Tensor Pipe::forward_backward(const at::Tensor& input, int64_t batch_size,
                                  const LossFn& loss_fn) {
  // A micro-batch's mean weighs its share of the batch: the gradients of the batch's mean.
  return impl_->forward_backward(
      input, batch_size, [&](const at::Tensor& output, const MicroBatch& microbatch) {
        return loss_fn(output, microbatch) * microbatch.share_of(batch_size);
      });
}

at::Tensor Pipe::forward_backward_unscaled(const at::Tensor& input, int64_t batch_size,
                                           const LossFn& contribution) {
  return impl_->forward_backward(input, batch_size, contribution);
}

void Pipe::forward(const at::Tensor& input, int64_t batch_size, const OutputFn& on_output) {
  impl_->forward(input, batch_size, on_output);
}

void Pipe::reduce_tied_gradients() { impl_->reduce_tied_gradients(); }
const TiedGradients& Pipe::tied_parameters() const { return *impl_->tied_; }
void Pipe::set_last_backward_hook(std::function<void()> hook) {
  impl_->last_backward_hook_ = std::move(hook);
}
const torch::nn::Sequential& Pipe::stage_module() const { return impl_->stage_module_; }
std::vector<at::Tensor> Pipe::parameters() const { return impl_->parameters(); }
const std::string& Pipe::execution() const { return impl_->execution_report_; }
const std::string& Pipe::schedule() const { return impl_->schedule_name_; }
bool Pipe::choosing_schedule() const { return impl_->choosing_schedule(); }
int64_t Pipe::stages() const { return impl_->stages(); }
int64_t Pipe::rank_of_stage(int64_t stage) const { return impl_->rank_of_stage(stage); }
bool Pipe::is_first_stage() const { return impl_->is_first_stage(); }
bool Pipe::is_last_stage() const { return impl_->is_last_stage(); }
const std::vector<int64_t>& Pipe::balance() const { return impl_->balance_; }

namespace {

// The schedule a Pipe of `options` over `ranks` processes starts with (`auto`: its first pick).
Schedule starting_schedule(const PipeOptions& options, const std::string& name, int64_t ranks,
                           int64_t stages) {
  return options.schedule_file().empty()
             ? checked_schedule(name, ranks, options.chunks(), options.virtual_stages())
             : read_schedule_file(options.schedule_file(), ranks, stages, options.chunks());
}

}  // namespace

std::vector<int64_t> stage_ranks(const PipeOptions& options, int64_t ranks) {
  check_pipe_options(options, ranks, std::to_string(ranks) + " processes");
  const std::string name =
      options.schedule() == "auto" ? ScheduleChoice().running() : options.schedule();
  const auto stages = options.balance().empty() ? ranks * options.virtual_stages()
                                                : static_cast<int64_t>(options.balance().size());
  return stage_placement(starting_schedule(options, name, ranks, stages));
}

Pipe::Impl::Impl(torch::nn::Sequential sequential, PipeOptions options,
                 std::shared_ptr<World> world)
    : options_(std::move(options)),
      world_(std::move(world)),
      checkpoint_mode_(parse_checkpoint_mode(options_.checkpoint())) {
  const auto layers = static_cast<int64_t>(sequential->size());
  world_size_ = world_->size();
  rank_ = world_->rank();
  check_pipe_options(options_, world_size_, std::to_string(world_size_) + " processes");
  const int64_t wanted = world_size_ * options_.virtual_stages();
  if (layers < wanted) {
    throw std::invalid_argument(
        "the model's Sequential has " + std::to_string(layers) + " layers but " +
        std::to_string(wanted) +
        " stages were asked for: every stage needs at least one layer; give the Sequential more "
        "layers (a module's parts as its layers, not one module holding them) or use fewer stages");
  }
  if (options_.balance().empty()) {
    for (int64_t i = 0; i < layers; ++i) {
      if (!is_held(sequential, i)) {
        throw std::invalid_argument(
            "the Sequential was built per rank (layer " + std::to_string(i) +
            " is held by another process), so its parameters cannot be counted here: give "
            "PipeOptions::balance (the Trainer finds it from the layers' specs)");
      }
    }
  }
  balance_ = options_.balance().empty() ? balance_by_size(sequential, wanted) : options_.balance();
  validate_balance(balance_, layers);
  schedule_name_ = options_.schedule();
  if (schedule_name_ == "auto") {
    choice_ = std::make_unique<ScheduleChoice>();
    schedule_name_ = choice_->running();
  }
  schedule_ = starting_schedule(options_, schedule_name_, world_size_, stages());
  rank_of_stage_ = stage_placement(schedule_);
  const int64_t held = max_activations_held(schedule_);
  if (options_.max_in_flight() != 0 && held > options_.max_in_flight()) {
    // (Under "auto" this is zbh1, which holds as few as any candidate.)
    throw std::invalid_argument(
        (options_.schedule_file().empty() ? "schedule '" + options_.schedule() + "'"
                                          : "the schedule of '" + options_.schedule_file() + "'") +
        " holds up to " + std::to_string(held) +
        " micro-batches' activations on a stage, more than max_in_flight (--max-in-flight) " +
        std::to_string(options_.max_in_flight()) +
        ": raise it, lower chunks, or choose 1f1b or zbh1 (they hold min(ranks, chunks))");
  }
  bool splits_backward = false;  // the schedule has I and W actions
  for (const auto& actions : schedule_) {
    for (const Action& action : actions) {
      splits_backward = splits_backward || action.phase == Phase::kInputBackward;
    }
  }
  // Fused Linear layers put their weight gradients off: after the last backward (see
  // can_join_weight_gradients), or else until the input's gradient is sent on. The first stage
  // sends none, so on a rank of it alone they would only keep their inputs alive longer
  // (defers_weight_gradients).
  const int64_t recomputed = recompute_below(checkpoint_mode_, options_.chunks());
  if (options_.fuse_gradient_accumulation() &&
      defers_weight_gradients(lower(schedule_), rank_, recomputed)) {
    deferred_ = std::make_shared<DeferredWeightGradients>();
  }
  // The program the ranks will run, weight-gradient actions placed, must finish too.
  simulate_plan(executed_plan(schedule_, options_.fuse_gradient_accumulation(), recomputed),
                ActionCosts::uniform(stages(), 1.0, 2.0, 1.0));
  if (options_.deferred_batch_norm() && options_.cuda_graphs()) {
    throw std::invalid_argument(
        "PipeOptions::deferred_batch_norm (--deferred-batch-norm) and cuda_graphs (--cuda-graphs) "
        "cannot be combined: a graph's warm-up runs would count micro-batches twice; turn one off");
  }
  for (int64_t s = 0, first_layer = 0; s < stages(); first_layer += balance_[s++]) {
    if (rank_of_stage(s) != rank_) continue;
    LocalStage local{s, first_layer, torch::nn::Sequential()};
    for (int64_t i = first_layer; i < first_layer + balance_[s]; ++i) {
      if (!is_held(sequential, i)) {
        throw std::invalid_argument("layer " + std::to_string(i) + " of stage " +
                                    std::to_string(s) + " runs on rank " + std::to_string(rank_) +
                                    ", which did not build it: build each rank's layers from the "
                                    "balance and placement this Pipe runs (stage_ranks)");
      }
      auto layer = *(sequential->begin() + i);
      if (options_.fuse_gradient_accumulation()) {
        layer = fuse_gradient_accumulation(layer, deferred_);
      }
      if (options_.deferred_batch_norm()) layer = defer_batch_norms(layer, i);
      local.layers->push_back(std::to_string(i), layer);
      stage_module_->push_back(std::to_string(i), layer);
    }
    local_stages_.push_back(std::move(local));
  }
  // Only this rank's layers go to the device; the rest of the Sequential stays where it was built.
  if (world_->device() != c10::Device(c10::DeviceType::CPU)) stage_module_->to(world_->device());
  tied_ = std::make_unique<TiedGradients>(
      find_tied_parameters(sequential, balance_, options_.tied_parameters(), rank_of_stage_),
      sequential, stage_module_, rank_, world_);
  if (world_size_ > 1) p2p_ = std::make_unique<PeerToPeer>(world_);
  execution_ = eager_execution(deferred_);
  if (options_.cuda_graphs()) {
    std::string why;
    if (!world_->device().is_cuda() || !StageGraphs::supported()) {
      why = "they need a CUDA device";
    } else if (local_stages_.size() > 1) {
      why = "this rank runs " + std::to_string(local_stages_.size()) +
            " stages (virtual stages), and graphs capture one stage per rank";
    } else if (checkpoint_mode_ != CheckpointMode::kNever) {
      why = "checkpoint '" + options_.checkpoint() +
            "' recomputes forwards outside any graph (use never)";
    } else if (choice_) {
      why = "schedule 'auto' times its first steps' actions eagerly";
    } else if (splits_backward) {
      why = "schedule '" + schedule_name_ +
            "' splits each backward into I and W, and graphs capture whole backwards (use 1f1b or "
            "gpipe)";
    }
    if (why.empty()) {
      execution_ = graph_execution(stage_module_, is_first_stage(), deferred_, world_);
      execution_report_ = "CUDA graphs";
      check_boundary_ = true;
    } else {
      execution_report_ = "eager (not using CUDA graphs: " + why + ")";
    }
  }
}

Pipe::Impl::~Impl() = default;

bool Pipe::Impl::choosing_schedule() const { return choice_ && !choice_->chosen(); }

torch::nn::AnyModule Pipe::Impl::defer_batch_norms(const torch::nn::AnyModule& layer,
                                                   int64_t index) {
  std::vector<DeferredBatchNorm> swapped;
  auto result = defer_batch_norm(layer, swapped);
  for (const auto& norm : swapped) deferred_norms_.push_back(norm.ptr());
  if (!swapped.empty()) return result;
  for (const auto& inner : layer.ptr()->modules(/*include_self=*/false)) {
    if (std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(inner) ||
        std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(inner) ||
        std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(inner)) {
      throw std::invalid_argument(
          "PipeOptions::deferred_batch_norm (--deferred-batch-norm) defers the BatchNorm layers of "
          "the Sequential itself, but layer " +
          std::to_string(index) +
          " holds one inside: make each BatchNorm a layer of the Sequential of its own");
    }
  }
  return result;
}

std::vector<at::Tensor> Pipe::Impl::parameters() const {
  return distinct_tensors(stage_module_->parameters());
}

void Pipe::Impl::reduce_tied_gradients() {
  try {
    tied_->reduce();
  } catch (const std::exception& e) {
    world_->publish_error(error_message(e));
    throw;
  }
}

const Pipe::Impl::LocalStage& Pipe::Impl::local_stage(int64_t stage) const {
  for (const LocalStage& local : local_stages_) {
    if (local.index == stage) return local;
  }
  throw std::logic_error("rank " + std::to_string(rank_) + " does not run stage " +
                         std::to_string(stage));
}

}  // namespace pipetrain
