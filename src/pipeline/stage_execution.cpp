#include "stage_execution.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "distributed/world_connection.h"
#include "pipetrain/world.h"
#include "stage_graphs.h"

namespace pipetrain {
namespace {

class EagerExecution : public StageExecution {
 public:
  explicit EagerExecution(std::shared_ptr<DeferredWeightGradients> deferred)
      : deferred_(std::move(deferred)) {}

  void forward(InFlight& state, const RunStage& run) override {
    if (!state.recomputed) {
      state.output = run(state.input);
      return;
    }
    // Without its graph: the backward runs the forward again, from the same random state.
    state.rng = RngState::capture(state.input.tensors.at(0).device());
    torch::NoGradGuard no_grad;
    state.output = run(state.input);
    // Under autocast (bf16-mixed) the bf16 weight copies autocast cached here have no path back
    // to the weights: every later forward of the step and the recompute would read them, and the
    // weights would get no gradient. Casts cached before go too, and are made again where used
    // (a fused Linear's step copies, which carry no autograd history anyway, stay).
    at::autocast::clear_cache();
  }

  bool output_detached(const InFlight& state) const override { return state.recomputed; }

  std::vector<at::Tensor> backward(InFlight& state, const std::vector<at::Tensor>& grad_outputs,
                                   const std::vector<at::Tensor>& inputs, bool split,
                                   const RunStage& rerun) override {
    std::vector<at::Tensor> roots, grads, computed;
    if (state.loss.defined() && !output_detached(state)) {
      roots.push_back(state.loss);  // the loss's graph runs through the stage's
    } else if (!grad_outputs.empty()) {
      StageValue output = state.output;
      if (state.recomputed) output = state.rng.replay([&] { return rerun(state.input); });
      // Outputs made without this stage's parameters or inputs (a mask, the data riding along
      // from the first stage) have no graph to go back through.
      size_t next = 0;
      for (const auto& t : output.tensors) {
        if (!t.is_floating_point()) continue;  // no gradient came for it
        const at::Tensor& grad = grad_outputs.at(next++);
        if (t.requires_grad()) {
          roots.push_back(t);
          grads.push_back(grad);
        }
      }
    }
    if (split && !roots.empty()) {
      state.weights = WeightBackward::input_backward(roots, grads, inputs, &computed);
      if (deferred_) state.fused = deferred_->take();
    } else if (!roots.empty()) {
      torch::autograd::backward(roots, grads);
    }
    // A whole backward left the inputs' gradients in their .grad.
    std::vector<at::Tensor> input_grads;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& grad = computed.empty() ? inputs[i].grad() : computed.at(i);
      input_grads.push_back(grad.defined() ? grad : torch::zeros_like(inputs[i]));
    }
    return input_grads;
  }

  void weight_backward(InFlight& state) override {
    state.weights.run();
    if (!state.fused.empty()) DeferredWeightGradients::accumulate(std::move(state.fused));
  }

  void fused_weight_gradients(const std::vector<int64_t>& /*slots*/) override {
    if (deferred_) deferred_->run();
  }

 private:
  std::shared_ptr<DeferredWeightGradients> deferred_;
};

// Which slots hold a micro-batch, and the last send out of each slot's buffers: a slot's graph
// may only overwrite them once the stream has seen that send complete.
struct Slots {
  std::vector<bool> taken;
  std::map<int64_t, WorkPtr> activation_sends, gradient_sends;

  int64_t take() {
    for (size_t i = 0; i < taken.size(); ++i) {
      if (!taken[i]) {
        taken[i] = true;
        return static_cast<int64_t>(i);
      }
    }
    taken.push_back(true);
    return static_cast<int64_t>(taken.size()) - 1;
  }
  void release(int64_t slot) { taken[slot] = false; }
};

class GraphExecution : public StageExecution {
 public:
  GraphExecution(torch::nn::Sequential stage, bool first_stage,
                 std::shared_ptr<DeferredWeightGradients> deferred, std::shared_ptr<World> world)
      : deferred_(std::move(deferred)),
        graphs_(std::move(stage), !first_stage, deferred_.get()),
        first_stage_(first_stage),
        world_(std::move(world)) {}

  // A step ends with every send complete and every micro-batch's work done.
  void start_step() override {
    graphs_.adopt_gradients();
    slots_ = Slots();
  }

  void forward(InFlight& state, const RunStage& /*run*/) override {
    state.slot = slots_.take();
    wait(*world_, slots_.activation_sends[state.slot]);
    state.output = StageValue::of(graphs_.forward(state.slot, state.input.tensors[0]));
  }

  bool output_detached(const InFlight& /*state*/) const override { return true; }

  std::vector<at::Tensor> backward(InFlight& state, const std::vector<at::Tensor>& grad_outputs,
                                   const std::vector<at::Tensor>& /*inputs*/, bool split,
                                   const RunStage& /*rerun*/) override {
    if (split) throw std::logic_error("CUDA graphs capture whole backwards");
    wait(*world_, slots_.gradient_sends[state.slot]);
    const at::Tensor grad_input = graphs_.backward(state.slot, grad_outputs.at(0));
    if (first_stage_) return {};
    return {grad_input.defined() ? grad_input : torch::zeros_like(state.input.tensors[0])};
  }

  void weight_backward(InFlight& /*state*/) override {
    throw std::logic_error("CUDA graphs capture whole backwards: there is no W to run");
  }

  void fused_weight_gradients(const std::vector<int64_t>& slots) override {
    graphs_.weight_backward(slots);
  }

  void release(int64_t slot) override { slots_.release(slot); }

  void sending(int64_t slot, bool gradients, WorkPtr work) override {
    (gradients ? slots_.gradient_sends : slots_.activation_sends)[slot] = std::move(work);
  }

 private:
  std::shared_ptr<DeferredWeightGradients> deferred_;
  StageGraphs graphs_;
  bool first_stage_;
  std::shared_ptr<World> world_;
  Slots slots_;
};

}  // namespace

std::unique_ptr<StageExecution> eager_execution(std::shared_ptr<DeferredWeightGradients> deferred) {
  return std::make_unique<EagerExecution>(std::move(deferred));
}

std::unique_ptr<StageExecution> graph_execution(torch::nn::Sequential stage, bool first_stage,
                                                std::shared_ptr<DeferredWeightGradients> deferred,
                                                std::shared_ptr<World> world) {
  return std::make_unique<GraphExecution>(std::move(stage), first_stage, std::move(deferred),
                                          std::move(world));
}

}  // namespace pipetrain
