// The executor: runs this rank's plan (a schedule lowered by plan.h) action by action. The order
// comes from schedule.h and plan.h, what one compute action does from stage_execution.h; here
// are the transfers, the loss head and the bookkeeping of the micro-batches in flight.
#include "pipetrain/pipe.h"

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "deferred_batch_norm.h"
#include "fused_linear.h"
#include "pipetrain/balance.h"
#include "pipetrain/compat.h"
#include "pipetrain/error.h"
#include "pipetrain/p2p.h"
#include "pipetrain/plan.h"
#include "pipetrain/tied_parameters.h"
#include "pipetrain/trace.h"
#include "pipetrain/world.h"
#include "schedule_choice.h"
#include "stage_execution.h"
#include "stage_graphs.h"
#include "stage_value.h"

namespace pipetrain {
namespace {

// The compute action of `plan` that adds the last weight gradients of a step: the last B or W (of
// the first stage, whose I runs the whole backward, the last I). Null if none.
const PlannedAction* last_weight_gradient_action(const std::vector<PlannedAction>& plan) {
  const PlannedAction* last = nullptr;
  for (const PlannedAction& planned : plan) {
    const Action& action = planned.action;
    const bool adds =
        planned.kind == PlannedAction::Kind::kCompute &&
        (action.phase == Phase::kBackward ||
         action.phase == (action.stage == 0 ? Phase::kInputBackward : Phase::kWeightBackward));
    if (adds) last = &planned;
  }
  return last;
}

// The entry of `map` at `key`, taken out of it.
Packet take(std::map<std::pair<int64_t, int64_t>, Packet>& map, std::pair<int64_t, int64_t> key) {
  auto node = map.extract(key);
  if (node.empty()) {
    throw std::logic_error("stage " + std::to_string(key.first) +
                           " found nothing handed over for micro-batch " +
                           std::to_string(key.second));
  }
  return std::move(node.mapped());
}

// Which tensors crossing a boundary come back with a gradient: every floating one (zeros where
// it had no effect); masks and ids travel without (torchgpipe's rule).
bool has_gradient(const at::Tensor& tensor) { return tensor.is_floating_point(); }

// The packet of a stage's outputs for the next stage.
Packet activation_packet(const StageValue& output) {
  Packet packet;
  packet.label = static_cast<int64_t>(output.packing);
  for (const auto& t : output.tensors) {
    packet.tensors.push_back(t.detach());
    packet.requires_grad.push_back(has_gradient(t));
  }
  return packet;
}

// What the previous stage passed on, as its last layer packed it.
StageValue unpacked(Packet packet) {
  return StageValue::from_label(packet.label, std::move(packet.tensors));
}

// `schedule`, after a unit-cost simulation has shown it runs (every action once, no deadlock) and
// its transfers between ranks come in the order they go: a malformed one fails here, with its
// grid, rather than hanging the ranks or mixing up micro-batches.
Schedule checked(Schedule schedule) {
  simulate(schedule, ActionCosts::uniform(static_cast<int64_t>(stage_placement(schedule).size())));
  check_transfer_order(schedule);
  return schedule;
}

// The most micro-batches' activations one stage of `schedule` holds at once.
int64_t max_activations_held(const Schedule& schedule) {
  const std::vector<int64_t> held = activations_held(schedule);
  return *std::max_element(held.begin(), held.end());
}

Schedule checked_schedule(const std::string& name, int64_t ranks, int64_t chunks,
                          int64_t virtual_stages) {
  return checked(make_schedule(name, ranks, chunks, virtual_stages));
}

// The schedule of PipeOptions::schedule_file, checked against the pipe it is to run.
Schedule read_schedule_file(const std::string& path, int64_t ranks, int64_t stages,
                            int64_t chunks) {
  std::ifstream in(path);
  if (!in) {
    throw std::invalid_argument(
        "cannot read the schedule file '" + path +
        "' (PipeOptions::schedule_file, --schedule-file): " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  Schedule schedule;
  try {
    schedule = checked(parse_schedule_csv(text.str()));
  } catch (const std::exception& e) {
    throw std::invalid_argument("the schedule file '" + path + "': " + error_message(e));
  }
  const auto placement = stage_placement(schedule);
  int64_t microbatches = 0;
  for (const auto& actions : schedule) {
    for (const Action& a : actions) microbatches = std::max(microbatches, a.microbatch + 1);
  }
  const auto says = "the schedule file '" + path + "' ";
  if (static_cast<int64_t>(schedule.size()) != ranks) {
    throw std::invalid_argument(says + "has " + std::to_string(schedule.size()) +
                                " lines (ranks) but " + std::to_string(ranks) +
                                " processes run the pipeline: one line per process");
  }
  if (static_cast<int64_t>(placement.size()) != stages) {
    throw std::invalid_argument(
        says + "runs " + std::to_string(placement.size()) + " stages on " + std::to_string(ranks) +
        " ranks but the pipe has " + std::to_string(stages) +
        ": set the virtual stages (--virtual-stages) to stages / ranks, and the balance to match");
  }
  if (microbatches != chunks) {
    throw std::invalid_argument(says + "runs " + std::to_string(microbatches) +
                                " micro-batches but chunks is " + std::to_string(chunks) +
                                ": set chunks (--chunks) to " + std::to_string(microbatches));
  }
  return schedule;
}

}  // namespace

Pipe::Pipe(torch::nn::Sequential sequential, PipeOptions options, std::shared_ptr<World> world)
    : options_(std::move(options)),
      world_(std::move(world)),
      checkpoint_mode_(parse_checkpoint_mode(options_.checkpoint())) {
  const auto layers = static_cast<int64_t>(sequential->size());
  world_size_ = world_->size();
  rank_ = world_->rank();
  if (options_.virtual_stages() < 1) {
    throw std::invalid_argument(
        "virtual stages (PipeOptions::virtual_stages, --virtual-stages) "
        "must be at least 1 (got " +
        std::to_string(options_.virtual_stages()) + ")");
  }
  const int64_t wanted = world_size_ * options_.virtual_stages();
  if (layers < wanted) {
    throw std::invalid_argument(
        "the model's Sequential has " + std::to_string(layers) + " layers but " +
        std::to_string(wanted) +
        " stages were asked for: every stage needs at least one layer; give the Sequential more "
        "layers (a module's parts as its layers, not one module holding them) or use fewer stages");
  }
  balance_ = options_.balance().empty() ? balance_by_size(sequential, wanted) : options_.balance();
  validate_balance(balance_, layers);
  if (stages() != wanted) {
    throw std::invalid_argument(
        "balance has " + std::to_string(stages()) + " stages but " + std::to_string(world_size_) +
        " processes were started" +
        (options_.virtual_stages() > 1
             ? " with " + std::to_string(options_.virtual_stages()) + " virtual stages each"
             : std::string()) +
        ": give one balance entry per stage (processes x virtual stages)");
  }
  if (options_.chunks() < 1) {
    throw std::invalid_argument("chunks must be at least 1 (got " +
                                std::to_string(options_.chunks()) + ")");
  }
  if (options_.max_memory() < 0) {
    throw std::invalid_argument(
        "max_memory (--max-memory) must be 0 (no limit) or a number of "
        "micro-batches' activations, got " +
        std::to_string(options_.max_memory()));
  }
  schedule_name_ = options_.schedule();
  if (schedule_name_ == "auto") {
    if (options_.virtual_stages() != 1 || !options_.schedule_file().empty()) {
      throw std::invalid_argument(
          "schedule 'auto' chooses among 1f1b, zbh1, zbh2 and gpipe, which run one stage per rank: "
          "leave virtual stages at 1 and the schedule file unset");
    }
    choice_ = std::make_unique<ScheduleChoice>();
    schedule_name_ = choice_->running();
  }
  schedule_ =
      options_.schedule_file().empty()
          ? checked_schedule(schedule_name_, world_size_, options_.chunks(),
                             options_.virtual_stages())
          : read_schedule_file(options_.schedule_file(), world_size_, stages(), options_.chunks());
  rank_of_stage_ = stage_placement(schedule_);
  const int64_t held = max_activations_held(schedule_);
  if (options_.max_memory() != 0 && held > options_.max_memory()) {
    // (Under "auto" this is zbh1, which holds as few as any candidate.)
    throw std::invalid_argument(
        (options_.schedule_file().empty() ? "schedule '" + options_.schedule() + "'"
                                          : "the schedule of '" + options_.schedule_file() + "'") +
        " holds up to " + std::to_string(held) +
        " micro-batches' activations on a stage, more than max_memory (--max-memory) " +
        std::to_string(options_.max_memory()) +
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

Pipe::~Pipe() = default;

bool Pipe::choosing_schedule() const { return choice_ && !choice_->chosen(); }

torch::nn::AnyModule Pipe::defer_batch_norms(const torch::nn::AnyModule& layer, int64_t index) {
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

std::vector<at::Tensor> Pipe::parameters() const {
  return distinct_tensors(stage_module_->parameters());
}

void Pipe::reduce_tied_gradients() {
  try {
    tied_->reduce();
  } catch (const std::exception& e) {
    world_->publish_error(error_message(e));
    throw;
  }
}

const Pipe::LocalStage& Pipe::local_stage(int64_t stage) const {
  for (const LocalStage& local : local_stages_) {
    if (local.index == stage) return local;
  }
  throw std::logic_error("rank " + std::to_string(rank_) + " does not run stage " +
                         std::to_string(stage));
}

StageValue Pipe::rerun_stage(const LocalStage& stage, const StageValue& input, int64_t microbatch,
                             bool with_grad) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> buffers = stage.layers->buffers(), saved;
  for (const auto& b : buffers) saved.push_back(b.clone());
  StageValue output;
  {
    // Deferred BatchNorm layers counted this micro-batch in its first forward.
    struct Recomputing {
      const std::vector<std::shared_ptr<DeferredBatchNormImpl>>& norms;
      explicit Recomputing(const std::vector<std::shared_ptr<DeferredBatchNormImpl>>& n)
          : norms(n) {
        for (const auto& norm : norms) norm->set_recomputing(true);
      }
      ~Recomputing() {
        for (const auto& norm : norms) norm->set_recomputing(false);
      }
    } recomputing(deferred_norms_);
    torch::AutoGradMode grad(with_grad);
    output = run_stage(stage, input, microbatch);
  }
  // Through .data(), which leaves the version counter alone: the recomputed graph (and any other
  // micro-batch's) saved these buffers, which their backward only reads in eval-mode formulas,
  // and BatchNorm's own update inside its kernel bumps no version either.
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].data().copy_(saved[i]);
  return output;
}

void Pipe::check_graphs_fit(const StageValue& input, int64_t microbatch) {
  check_boundary_ = false;
  // Graphs capture one floating tensor in (but on the first stage) and one out (but on the last),
  // whose gradients they take and return.
  std::string why;
  if (!input.is_tensor() || (!is_first_stage() && !input.tensors[0].is_floating_point())) {
    why = "its input is " + input.describe() + " " + c10::toString(input.tensors[0].scalar_type());
  } else {
    const AutocastCacheOff cache_off;  // the capture comes next (stage_graphs.h)
    const StageValue output = RngState::capture().replay(
        [&] { return rerun_stage(local_stages_.at(0), input, microbatch, false); });
    if (!output.is_tensor() || (!is_last_stage() && !output.tensors[0].is_floating_point())) {
      why =
          "it returns " + output.describe() + " " + c10::toString(output.tensors[0].scalar_type());
    }
  }
  if (why.empty()) return;
  drop_graphs("stage " + std::to_string(rank_) + " ",
              why + ", and graphs capture a stage of one floating tensor in and one out");
}

void Pipe::drop_graphs(const std::string& who, const std::string& why) {
  execution_ = eager_execution(deferred_);
  execution_report_ = "eager (not using CUDA graphs: " + why + ")";
  print_line("pipetrain: " + who + "not using CUDA graphs: " + why + "; running eagerly");
}

StageValue Pipe::run_stage(const LocalStage& stage, const StageValue& input, int64_t microbatch) {
  const int64_t s = stage.index;
  const int64_t last_layer = stage.first_layer + balance_[s] - 1;
  StageValue output;
  try {
    torch::nn::AnyValue value = input.pack();
    for (auto& layer : *stage.layers.ptr()) value = layer.any_forward(std::move(value));
    output = StageValue::unpack(std::move(value), last_layer);
  } catch (const std::exception& e) {
    std::ostringstream message;
    message << "stage " << s << " (rank " << world_->global_rank(rank_) << ", layers "
            << stage.first_layer << ".." << last_layer << ") failed on micro-batch " << microbatch
            << " with an input of shape " << input.describe();
    if (s > 0) message << " from stage " << s - 1;
    message << ": " << error_message(e);
    if (s > 0)
      message << "\nCheck the balance (PipeOptions::balance, --balance): stage " << s - 1
              << "'s output must fit stage " << s << "'s first layer.";
    throw std::runtime_error(message.str());
  }
  if (is_last(s) && !output.is_tensor()) {
    throw std::invalid_argument(
        "the Sequential's last layer (" + std::to_string(last_layer) + ") returns " +
        output.describe() +
        ": the model's output, which the loss and the steps take, must be one at::Tensor");
  }
  return output;
}

at::Tensor Pipe::forward_backward(const at::Tensor& input, int64_t batch_size,
                                  const LossFn& loss_fn) {
  // Linear layers inside the stage's blocks that call pipetrain::linear fuse as its own do.
  std::optional<FusedLinearScope> fusing;
  if (options_.fuse_gradient_accumulation()) fusing.emplace(deferred_);
  try {
    return run_schedule(input, batch_size, loss_fn);
  } catch (const std::exception& e) {
    // Queued weight-gradient work holds every queued micro-batch's activations, and must not
    // add to the next step.
    if (deferred_) deferred_->clear();
    for (const auto& norm : deferred_norms_) norm->discard();
    arrived_activations_.clear();
    arrived_gradients_.clear();
    // The other stages will only see this process vanish; tell them why.
    world_->publish_error(error_message(e));
    throw;
  }
}

struct Pipe::Step {
  at::Tensor input;  // the batch, on this rank's device (first stage)
  int64_t batch_size = 0;
  const LossFn* loss_fn = nullptr;
  std::vector<MicroBatch> microbatches;
  int64_t recomputed_below = 0;  // micro-batches below it are recomputed
  std::map<std::pair<int64_t, int64_t>, InFlight> in_flight;  // by (stage, micro-batch)
  // What this rank's stages made for another rank, until the plan's send: by (gradients?,
  // stage that made it, micro-batch), with the CUDA-graph slot whose buffers it is.
  std::map<std::tuple<bool, int64_t, int64_t>, std::pair<Packet, int64_t>> outgoing;
  at::Tensor total_loss;
  // The fused Linear layers' weight gradients wait for the plan's joined action, with the CUDA
  // graph slots whose work waits with them.
  bool join_weight_gradients = false;
  std::vector<int64_t> weight_gradient_slots;
  bool profiling = false;  // schedule "auto": time the compute of each action kind
  // F, B or I, W, and the host's own time handing transfers over (sends, receives posted ahead).
  std::vector<double> seconds{0, 0, 0, 0};
  int64_t transfers = 0;  // sent and received
  const std::vector<PlannedAction>* plan = nullptr;
  size_t next_action = 0;  // in `plan`, after the one running
};

namespace {

using Clock = std::chrono::steady_clock;

// Now, once the device has done what was asked of it.
Clock::time_point synchronized_now(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
  return Clock::now();
}

double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// Adds the time of its scope to a profiled step's `seconds[kind]`, `device` synchronised at both
// ends (so that a compute scope counts its kernels and not a receive it waits for; a host scope
// passes the CPU).
class ProfileTimer {
 public:
  ProfileTimer(bool on, const c10::Device& device, double& seconds)
      : on_(on),
        device_(device),
        seconds_(seconds),
        start_(on ? synchronized_now(device) : Clock::time_point()) {}
  ~ProfileTimer() {
    if (on_) seconds_ += seconds_between(start_, synchronized_now(device_));
  }

 private:
  bool on_;
  c10::Device device_;
  double& seconds_;
  Clock::time_point start_;
};

}  // namespace

at::Tensor Pipe::run_schedule(const at::Tensor& batch_input, int64_t batch_size,
                              const LossFn& loss_fn) {
  Step step;
  // One copy per batch: slicing a host tensor per micro-batch would wait for the GPU each time.
  step.input = batch_input.defined() ? batch_input.to(world_->device()) : batch_input;
  step.batch_size = batch_size;
  step.loss_fn = &loss_fn;
  // A batch smaller than `chunks` (an epoch's last) runs as one-sample micro-batches.
  const int64_t chunks = std::min(options_.chunks(), batch_size);
  step.microbatches = split_microbatches(batch_size, chunks);
  step.recomputed_below = recompute_below(checkpoint_mode_, chunks);
  const std::vector<PlannedAction>& plan = plan_for(chunks);
  execution_->start_step();
  step.join_weight_gradients =
      std::any_of(plan.begin(), plan.end(), [](const PlannedAction& planned) {
        return planned.kind == PlannedAction::Kind::kJoinedWeightGradients;
      });
  const PlannedAction* last_weight_gradients = last_weight_gradient_action(plan);

  // Schedule "auto" times its first full steps' compute (seconds in F, in B or I, and in W), then
  // the whole of the steps that try its finalists.
  const bool choosing = choice_ && !choice_->chosen() && chunks == options_.chunks();
  step.profiling = choosing && choice_->profiling();
  const auto started = choosing ? synchronized_now(world_->device()) : Clock::time_point();
  step.plan = &plan;
  for (const PlannedAction& planned : plan) {
    ++step.next_action;
    if (&planned == last_weight_gradients && last_backward_hook_) last_backward_hook_();
    switch (planned.kind) {
      case PlannedAction::Kind::kReceive:
        run_receive(step, planned);
        break;
      case PlannedAction::Kind::kSend:
        run_send(step, planned);
        break;
      case PlannedAction::Kind::kWeightGradients:
        run_deferred_weight_gradients(step, planned.action);
        break;
      case PlannedAction::Kind::kJoinedWeightGradients: {
        Trace::Span span(options_.trace().get(), "weight gradients");
        execution_->fused_weight_gradients(step.weight_gradient_slots);
        break;
      }
      case PlannedAction::Kind::kCompute:
        switch (planned.action.phase) {
          case Phase::kForward:
            run_forward(step, planned.action);
            break;
          case Phase::kBackward:
          case Phase::kInputBackward:
            run_backward(step, planned.action);
            break;
          case Phase::kWeightBackward:
            run_weight_backward(step, planned.action);
            break;
        }
        break;
    }
  }
  for (const auto& norm : deferred_norms_) norm->commit();
  if (p2p_) p2p_->wait_for_sends();
  if (choosing) {
    choose_schedule(step.seconds, step.transfers, chunks,
                    seconds_between(started, synchronized_now(world_->device())));
  }
  return step.total_loss;
}

const std::vector<PlannedAction>& Pipe::plan_for(int64_t chunks) {
  auto found = plans_.find(chunks);
  if (found != plans_.end()) return found->second;
  Schedule schedule = schedule_;
  if (chunks != options_.chunks()) {
    // A file's schedule is for `chunks` micro-batches alone, and a built one may not take so few
    // (interleaved1f1b's rounds): GPipe over the same stages on the same ranks trains alike.
    schedule = gpipe_schedule_placed(rank_of_stage_, chunks);
    if (options_.schedule_file().empty()) {
      try {
        schedule = checked_schedule(schedule_name_, world_size_, chunks, options_.virtual_stages());
      } catch (const std::invalid_argument&) {
      }
    }
  }
  std::vector<PlannedAction> plan = lower(schedule)[rank_];
  if (deferred_ && can_join_weight_gradients(plan, recompute_below(checkpoint_mode_, chunks))) {
    join_weight_gradients(plan);
  } else if (deferred_) {
    defer_weight_gradients(plan);
  }
  return plans_[chunks] = std::move(plan);
}

void Pipe::choose_schedule(const std::vector<double>& profiled_seconds, int64_t transfers,
                           int64_t chunks, double step_seconds) {
  std::string said;
  if (choice_->profiling()) {
    if (!choice_->count_profiled_step()) return;
    said = predict_schedules(profiled_seconds, transfers, chunks);
  } else {
    // Every rank's step, averaged, so that all ranks take the same figure.
    said = choice_->tried(world_->all_reduce_sum(step_seconds) / static_cast<double>(world_size_));
  }
  if (rank_ == 0 && !said.empty()) print_line("pipetrain: schedule auto: " + said);
  if (choice_->running() != schedule_name_) {
    schedule_name_ = choice_->running();
    schedule_ = checked_schedule(schedule_name_, world_size_, options_.chunks(), 1);
    plans_.clear();
  }
}

std::string Pipe::predict_schedules(const std::vector<double>& seconds, int64_t transfers,
                                    int64_t chunks) {
  // Every rank's per-micro-batch F, I (or B) and W by stage, then every rank's seconds handing
  // transfers over and their count, summed into one table that all ranks hold.
  const int64_t n = stages();
  at::Tensor table = torch::zeros({3 * n + 2}, torch::kFloat64);
  for (int kind = 0; kind < 3; ++kind) table[kind * n + rank_] = seconds[kind] / chunks;
  table[3 * n] = seconds[3];
  table[3 * n + 1] = static_cast<double>(transfers);
  table = world_->all_reduce_sum_on_device(table.to(world_->device())).cpu();
  const auto entry = [&](int64_t i) { return table[i].item<double>(); };
  ActionCosts costs;
  costs.message = entry(3 * n + 1) > 0 ? entry(3 * n) / entry(3 * n + 1) : 0.0;
  for (int64_t s = 0; s < n; ++s) {
    const double f = entry(s), i = entry(n + s), w = entry(2 * n + s);
    costs.forward.push_back(f);
    costs.backward.push_back(i + w);  // the first stage's I is its whole backward, its W empty
    costs.weight.push_back(w);
  }
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "per micro-batch F/I/W ms by stage:";
  for (int64_t s = 0; s < n; ++s) {
    line << (s > 0 ? "," : "") << " " << s << ": " << 1e3 * costs.forward[s] << "/"
         << 1e3 * (costs.backward[s] - costs.weight[s]) << "/" << 1e3 * costs.weight[s];
  }
  line << "; per transfer " << 1e3 * costs.message << " ms";
  std::vector<ScheduleChoice::Prediction> predictions;
  for (const std::string& name : ScheduleChoice::candidates()) {
    const Schedule candidate = make_schedule(name, world_size_, chunks);
    const int64_t held = max_activations_held(candidate);
    // The plan each would run, its weight-gradient actions placed as they would be.
    predictions.push_back(
        {name,
         simulate_plan(executed_plan(candidate, options_.fuse_gradient_accumulation(),
                                     recompute_below(checkpoint_mode_, chunks)),
                       costs)
             .step_time,
         held, options_.max_memory() == 0 || held <= options_.max_memory()});
  }
  return line.str() + "; " + choice_->predicted(predictions);
}

void Pipe::run_receive(Step& step, const PlannedAction& planned) {
  // Only outputs that take a gradient (floating ones) get one back, and outputs without any none
  // at all.
  const auto gradients_come = [](const InFlight& state) {
    return std::any_of(state.output.tensors.begin(), state.output.tensors.end(), has_gradient);
  };
  const Action& action = planned.action;
  const MicroBatch& mb = step.microbatches[action.microbatch];
  if (!planned.gradients()) {
    receive_activation(planned.peer, action.stage, mb);
  } else if (gradients_come(step.in_flight.at({action.stage, action.microbatch}))) {
    Trace::Span span(options_.trace().get(), "recv gradient", mb.index);
    arrived_gradients_[{action.stage, mb.index}] =
        p2p_->recv(planned.peer, Flow::kGradient, mb.size(), action.stage);
  } else {
    return;
  }
  ++step.transfers;

  // Gloo sends a packet's bytes only once its receiver asks for them: asking now for the next one
  // from this peer lets it travel while this rank computes, where asking at its receive would add
  // a round trip. (On a GPU NCCL's receive returns at once anyway, the stream waiting.)
  if (world_->device().is_cuda()) return;
  const std::vector<PlannedAction>& plan = *step.plan;
  for (size_t i = step.next_action; i < plan.size(); ++i) {
    const PlannedAction& next = plan[i];
    if (next.kind != PlannedAction::Kind::kReceive || next.peer != planned.peer ||
        next.gradients() != planned.gradients()) {
      continue;
    }
    // A gradient is known to come once its micro-batch's forward has run here.
    const auto state = step.in_flight.find({next.action.stage, next.action.microbatch});
    if (!next.gradients() || (state != step.in_flight.end() && gradients_come(state->second))) {
      Trace::Span span(options_.trace().get(), "post receive", next.action.microbatch);
      ProfileTimer timer(step.profiling, c10::Device(c10::kCPU), step.seconds[3]);
      p2p_->post_recv(next.peer, next.gradients() ? Flow::kGradient : Flow::kActivation,
                      step.microbatches[next.action.microbatch].size(), next.action.stage);
    }
    return;
  }
}

void Pipe::receive_activation(int64_t peer, int64_t stage, const MicroBatch& mb) {
  Trace::Span span(options_.trace().get(), "recv activation", mb.index);
  arrived_activations_[{stage, mb.index}] = p2p_->recv(peer, Flow::kActivation, mb.size(), stage);
}

void Pipe::run_send(Step& step, const PlannedAction& planned) {
  const Action& action = planned.action;
  auto node = step.outgoing.extract({planned.gradients(), action.stage, action.microbatch});
  if (node.empty()) return;  // no input took a gradient
  auto& [packet, slot] = node.mapped();
  const MicroBatch& mb = step.microbatches[action.microbatch];
  // The stage the tensors are for, whose channel they take.
  const int64_t to_stage = planned.gradients() ? action.stage - 1 : action.stage + 1;
  const Flow flow = planned.gradients() ? Flow::kGradient : Flow::kActivation;
  Trace::Span span(options_.trace().get(),
                   planned.gradients() ? "send gradient" : "send activation", mb.index);
  // The host's own time: on a GPU the tensors travel after the call returns.
  ProfileTimer timer(step.profiling, c10::Device(c10::kCPU), step.seconds[3]);
  ++step.transfers;
  execution_->sending(slot, planned.gradients(),
                      p2p_->send(packet, planned.peer, flow, mb.size(), to_stage));
}

void Pipe::pass_on(Step* step, bool gradients, int64_t stage, const MicroBatch& mb, Packet packet,
                   int64_t slot) {
  const int64_t to_stage = gradients ? stage - 1 : stage + 1;
  if (rank_of_stage(to_stage) != rank_) {
    if (step) {
      step->outgoing[{gradients, stage, mb.index}] = {std::move(packet), slot};
    } else {  // a forward-only pass sends at once
      Trace::Span span(options_.trace().get(), "send activation", mb.index);
      p2p_->send(packet, rank_of_stage(to_stage), Flow::kActivation, mb.size(), to_stage);
    }
    return;
  }
  if (gradients) {
    arrived_gradients_[{to_stage, mb.index}] = std::move(packet);
    return;
  }
  // What a receive would give: leaves, those that take a gradient requiring it.
  for (size_t i = 0; i < packet.tensors.size(); ++i) {
    const bool grad = i < packet.requires_grad.size() && packet.requires_grad[i];
    packet.tensors[i] = packet.tensors[i].detach().requires_grad_(grad);
  }
  arrived_activations_[{to_stage, mb.index}] = std::move(packet);
}

void Pipe::run_forward(Step& step, const Action& action) {
  const LocalStage& stage = local_stage(action.stage);
  const MicroBatch& mb = step.microbatches[action.microbatch];
  InFlight state;
  state.recomputed = action.microbatch < step.recomputed_below;
  state.input = is_first(stage.index)
                    ? StageValue::of(step.input.slice(0, mb.begin, mb.end))
                    : unpacked(take(arrived_activations_, {stage.index, mb.index}));
  if (check_boundary_) check_graphs_fit(state.input, mb.index);
  {
    Trace::Span span(options_.trace().get(), "forward", mb.index);
    ProfileTimer timer(step.profiling, world_->device(), step.seconds[0]);
    execution_->forward(state,
                        [&](const StageValue& input) { return run_stage(stage, input, mb.index); });
    if (is_last(stage.index)) {
      // The loss head runs with autograd even where the stage's own graph is gone (recomputed)
      // or captured; its input is a leaf that collects the gradient the stage's backward needs.
      at::Tensor& output = state.output.tensors[0];
      if (execution_->output_detached(state)) output = output.detach().requires_grad_(true);
      const double share = static_cast<double>(mb.size()) / static_cast<double>(step.batch_size);
      state.loss = (*step.loss_fn)(output, mb) * share;
      step.total_loss =
          step.total_loss.defined() ? step.total_loss + state.loss.detach() : state.loss.detach();
    }
  }
  if (!is_last(stage.index)) {
    pass_on(&step, false, stage.index, mb, activation_packet(state.output), state.slot);
  }
  step.in_flight.emplace(std::make_pair(stage.index, action.microbatch), std::move(state));
}

void Pipe::run_backward(Step& step, const Action& action) {
  Trace* trace = options_.trace().get();
  const LocalStage& stage = local_stage(action.stage);
  const MicroBatch& mb = step.microbatches[action.microbatch];
  const auto key = std::make_pair(stage.index, action.microbatch);
  InFlight& state = step.in_flight.at(key);
  std::vector<at::Tensor> inputs;  // those that take a gradient
  for (const auto& t : state.input.tensors) {
    if (t.requires_grad()) inputs.push_back(t);
  }
  // A stage whose inputs take no gradient (the first) has nothing to hurry: its I runs the whole
  // backward, and its W nothing.
  const bool split = action.phase == Phase::kInputBackward && !inputs.empty();
  // The gradients of the outputs that have one (the floating ones), in their order.
  std::vector<at::Tensor> grad_outputs;
  if (!is_last(stage.index) &&
      std::any_of(state.output.tensors.begin(), state.output.tensors.end(), has_gradient)) {
    grad_outputs = take(arrived_gradients_, {stage.index, mb.index}).tensors;
  }
  Packet input_grads;
  {
    Trace::Span span(trace, action.phase == Phase::kInputBackward ? "input backward" : "backward",
                     mb.index);
    ProfileTimer timer(step.profiling, world_->device(), step.seconds[1]);
    DeferredWeightGradients::Deferral deferral(deferred_.get());  // weight gradients wait
    if (is_last(stage.index) && execution_->output_detached(state)) {
      state.loss.backward();  // the loss head alone, into the output's leaf
      grad_outputs = {state.output.tensors[0].grad()};
    }
    input_grads.tensors = execution_->backward(
        state, grad_outputs, inputs, split,
        [&](const StageValue& input) { return rerun_stage(stage, input, mb.index, true); });
  }
  if (!is_first(stage.index) && !input_grads.tensors.empty()) {
    pass_on(&step, true, stage.index, mb, std::move(input_grads), state.slot);
  }
  if (split) return;  // the rest waits for its W
  // The fused Linear layers' weight gradients: after the last backward (the plan's joined
  // action), or, of a B, in the plan's action after its send; an I that ran the whole backward
  // (nothing to send) computes them now, leaving its W nothing.
  if (step.join_weight_gradients) {
    step.weight_gradient_slots.push_back(state.slot);
  } else if (deferred_ && action.phase == Phase::kBackward) {
    return;  // its weight-gradient action lets it go
  } else {
    if (deferred_) {
      Trace::Span span(trace, "weight gradients", mb.index);
      execution_->fused_weight_gradients({state.slot});
    }
    execution_->release(state.slot);
  }
  if (action.phase == Phase::kBackward) step.in_flight.erase(key);  // else its W lets it go
}

void Pipe::run_deferred_weight_gradients(Step& step, const Action& backward) {
  auto node = step.in_flight.extract(std::make_pair(backward.stage, backward.microbatch));
  const int64_t slot = node.mapped().slot;
  Trace::Span span(options_.trace().get(), "weight gradients", backward.microbatch);
  execution_->fused_weight_gradients({slot});
  execution_->release(slot);
}

void Pipe::run_weight_backward(Step& step, const Action& action) {
  auto node = step.in_flight.extract(std::make_pair(action.stage, action.microbatch));
  Trace::Span span(options_.trace().get(), "weight backward", action.microbatch);
  ProfileTimer timer(step.profiling, world_->device(), step.seconds[2]);
  execution_->weight_backward(node.mapped());
}

}  // namespace pipetrain

namespace pipetrain {

void Pipe::forward(const at::Tensor& input, int64_t batch_size, const OutputFn& on_output) {
  torch::NoGradGuard no_grad;
  try {
    const at::Tensor on_device = input.defined() ? input.to(world_->device()) : input;
    const auto microbatches =
        split_microbatches(batch_size, std::min(options_.chunks(), batch_size));
    // Each micro-batch through this rank's stages in order; a stage's outputs go on as they come.
    for (const LocalStage& stage : local_stages_) {
      for (const MicroBatch& mb : microbatches) {
        if (!is_first(stage.index) && rank_of_stage(stage.index - 1) != rank_) {
          receive_activation(rank_of_stage(stage.index - 1), stage.index, mb);
        }
        const StageValue x = is_first(stage.index)
                                 ? StageValue::of(on_device.slice(0, mb.begin, mb.end))
                                 : unpacked(take(arrived_activations_, {stage.index, mb.index}));
        const StageValue y = run_stage(stage, x, mb.index);
        if (is_last(stage.index)) {
          on_output(y.tensors[0], mb);
        } else {
          pass_on(nullptr, false, stage.index, mb,
                  Packet{y.tensors, {}, static_cast<int64_t>(y.packing)}, -1);
        }
      }
    }
    if (p2p_) p2p_->wait_for_sends();
  } catch (const std::exception& e) {
    arrived_activations_.clear();
    world_->publish_error(error_message(e));
    throw;
  }
}

}  // namespace pipetrain
