// The executor: runs this rank's plan (a schedule lowered by plan.h) action by action. The order
// comes from schedule.h and plan.h, what one compute action does from stage_execution.h; here
// are the transfers, the loss head and the bookkeeping of the micro-batches in flight.
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
#include "pipeline/microbatch.h"
#include "pipeline/plan.h"
#include "pipeline/tied_parameters.h"
#include "pipeline/trace.h"
#include "pipetrain/balance.h"
#include "pipetrain/error.h"
#include "pipetrain/world.h"
#include "schedule_choice.h"
#include "schedule_file.h"
#include "stage_execution.h"
#include "stage_graphs.h"
#include "stage_value.h"
#include "util/compat.h"

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

// The first stage's rows of a micro-batch are a view of the step's batch, which a layer may change
// in place (preprocessing at the front of the Sequential). Each run of the stage takes a copy of
// its own: rows changed in place by a forward were what its recomputation ran on again (halved
// twice), and, all views sharing the batch's version counter, another micro-batch's change failed
// autograd's check on the rows this one saved.
StageValue own_copy(const StageValue& input) {
  StageValue copy = input;
  for (auto& t : copy.tensors) t = t.clone();
  return copy;
}

// What the previous stage passed on, as its last layer packed it.
StageValue unpacked(Packet packet) {
  return StageValue::from_label(packet.label, std::move(packet.tensors));
}

}  // namespace

StageValue Pipe::Impl::rerun_stage(const LocalStage& stage, const StageValue& input,
                                   int64_t microbatch, bool with_grad) {
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

void Pipe::Impl::check_graphs_fit(const StageValue& input, int64_t microbatch) {
  check_boundary_ = false;
  // Graphs capture one floating tensor in (but on the first stage) and one out (but on the last),
  // whose gradients they take and return.
  std::string why;
  if (!input.is_tensor() || (!is_first_stage() && !input.tensors[0].is_floating_point())) {
    why = "its input is " + input.describe() + " " + c10::toString(input.tensors[0].scalar_type());
  } else {
    const AutocastCacheOff cache_off;  // the capture comes next (stage_graphs.h)
    const StageValue output = RngState::capture(world_->device()).replay([&] {
      return rerun_stage(local_stages_.at(0), input, microbatch, false);
    });
    if (!output.is_tensor() || (!is_last_stage() && !output.tensors[0].is_floating_point())) {
      why =
          "it returns " + output.describe() + " " + c10::toString(output.tensors[0].scalar_type());
    }
  }
  if (why.empty()) return;
  drop_graphs("stage " + std::to_string(rank_) + " ",
              why + ", and graphs capture a stage of one floating tensor in and one out");
}

void Pipe::Impl::drop_graphs(const std::string& who, const std::string& why) {
  execution_ = eager_execution(deferred_);
  execution_report_ = "eager (not using CUDA graphs: " + why + ")";
  print_line("pipetrain: " + who + "not using CUDA graphs: " + why + "; running eagerly");
}

StageValue Pipe::Impl::run_stage(const LocalStage& stage, const StageValue& input,
                                 int64_t microbatch) {
  const int64_t s = stage.index;
  const int64_t last_layer = stage.first_layer + balance_[s] - 1;
  int64_t layer_index = stage.first_layer;  // the layer running
  StageValue output;
  try {
    torch::nn::AnyValue value = input.pack();
    for (auto& layer : *stage.layers.ptr()) {
      value = layer.any_forward(std::move(value));
      ++layer_index;
    }
    output = StageValue::unpack(std::move(value), last_layer);
  } catch (const std::exception& e) {
    std::ostringstream message;
    message << "stage " << s << " (rank " << world_->global_rank(rank_) << ", layers "
            << stage.first_layer << ".." << last_layer << ") failed on micro-batch " << microbatch
            << " (stage input " << input.describe();
    if (s > 0) message << " from stage " << s - 1;
    message << "): ";
    if (layer_index > last_layer) {
      message << "its output: " << error_message(e);
    } else {
      const auto& layer = *(stage.layers->begin() + (layer_index - stage.first_layer));
      message << "layer " << layer_index << " (" << layer.ptr()->name()
              << ") threw: " << error_message(e);
    }
    // Only where the stage's first layer rejects what the previous stage sent can the cut
    // between them be at fault; an error deeper in a stage is the layer's own.
    if (s > 0 && layer_index == stage.first_layer) {
      message << "\nIf that is a shape mismatch, check the balance (PipeOptions::balance, "
                 "--balance): stage "
              << s - 1 << "'s output must fit stage " << s << "'s first layer.";
    }
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

at::Tensor Pipe::Impl::forward_backward(const at::Tensor& input, int64_t batch_size,
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

struct Pipe::Impl::Step {
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

at::Tensor Pipe::Impl::run_schedule(const at::Tensor& batch_input, int64_t batch_size,
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

const std::vector<PlannedAction>& Pipe::Impl::plan_for(int64_t chunks) {
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

void Pipe::Impl::run_receive(Step& step, const PlannedAction& planned) {
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

void Pipe::Impl::receive_activation(int64_t peer, int64_t stage, const MicroBatch& mb) {
  Trace::Span span(options_.trace().get(), "recv activation", mb.index);
  arrived_activations_[{stage, mb.index}] = p2p_->recv(peer, Flow::kActivation, mb.size(), stage);
}

void Pipe::Impl::run_send(Step& step, const PlannedAction& planned) {
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

void Pipe::Impl::pass_on(Step* step, bool gradients, int64_t stage, const MicroBatch& mb,
                         Packet packet, int64_t slot) {
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

void Pipe::Impl::run_forward(Step& step, const Action& action) {
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
    execution_->forward(state, [&](const StageValue& input) {
      return run_stage(stage, is_first(stage.index) ? own_copy(input) : input, mb.index);
    });
    if (is_last(stage.index)) {
      // The loss head runs with autograd even where the stage's own graph is gone (recomputed)
      // or captured; its input is a leaf that collects the gradient the stage's backward needs.
      at::Tensor& output = state.output.tensors[0];
      if (execution_->output_detached(state)) output = output.detach().requires_grad_(true);
      state.loss = (*step.loss_fn)(output, mb);  // weighed as the caller chose (pipe.h)
      step.total_loss =
          step.total_loss.defined() ? step.total_loss + state.loss.detach() : state.loss.detach();
    }
  }
  if (!is_last(stage.index)) {
    pass_on(&step, false, stage.index, mb, activation_packet(state.output), state.slot);
  }
  step.in_flight.emplace(std::make_pair(stage.index, action.microbatch), std::move(state));
}

void Pipe::Impl::run_backward(Step& step, const Action& action) {
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
    input_grads.tensors =
        execution_->backward(state, grad_outputs, inputs, split, [&](const StageValue& input) {
          return rerun_stage(stage, is_first(stage.index) ? own_copy(input) : input, mb.index,
                             true);
        });
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

void Pipe::Impl::run_deferred_weight_gradients(Step& step, const Action& backward) {
  auto node = step.in_flight.extract(std::make_pair(backward.stage, backward.microbatch));
  const int64_t slot = node.mapped().slot;
  Trace::Span span(options_.trace().get(), "weight gradients", backward.microbatch);
  execution_->fused_weight_gradients({slot});
  execution_->release(slot);
}

void Pipe::Impl::run_weight_backward(Step& step, const Action& action) {
  auto node = step.in_flight.extract(std::make_pair(action.stage, action.microbatch));
  Trace::Span span(options_.trace().get(), "weight backward", action.microbatch);
  ProfileTimer timer(step.profiling, world_->device(), step.seconds[2]);
  execution_->weight_backward(node.mapped());
}

void Pipe::Impl::forward(const at::Tensor& input, int64_t batch_size, const OutputFn& on_output) {
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
