// Tied parameters: one parameter that layers on different stages use, as GPT-2's token embedding
// (the first layer) and its output projection (the last) share one weight. Every rank builds the
// whole Sequential, so each stage holding the parameter keeps a copy; the copies stay identical
// because, before every optimizer step, each gets the sum of all copies' gradients (DeepSpeed's
// allreduce_tied_weight_gradients, Megatron's embedding group). A tie needs no declaration when
// the same tensor is registered in several layers; names can also be declared tied
// (`PipeOptions::tied_parameters`) when the layers hold tensors of their own.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

class World;

// One parameter that several global names ("0.weight", "7.weight") of the whole Sequential refer
// to. The first name, in the Sequential's order, is the one checkpoints store it under.
struct TiedParameter {
  std::vector<std::string> names;
  // The stages whose layers use it, ascending; the ranks running them where a rank runs several
  // (find_tied_parameters' rank_of_stage).
  std::vector<int64_t> stages;
  // The one of `stages` holding the first name, whose values every copy starts from.
  int64_t first_stage = 0;
};

// The parameters of `sequential` reachable under more than one name (the same tensor registered
// in several layers), merged with the `declared` groups of names; `balance` says which stage each
// layer is on, and `rank_of_stage` (empty: rank s runs stage s) which rank runs each stage.
// Throws std::invalid_argument for a declared name the model does not have, or declared names
// whose shapes or dtypes differ.
std::vector<TiedParameter> find_tied_parameters(
    const torch::nn::Sequential& sequential, const std::vector<int64_t>& balance,
    const std::vector<std::vector<std::string>>& declared = {},
    const std::vector<int64_t>& rank_of_stage = {});

// `tensors` without repeats (the same tensor registered twice counts once): what an optimizer
// must be given, or it steps a tied parameter twice.
std::vector<at::Tensor> distinct_tensors(const std::vector<at::Tensor>& tensors);

// Keeps one stage's copies of the tied parameters identical.
class TiedGradients {
 public:
  // `whole` is the whole Sequential, `stage_module` this stage's layers named by their global
  // index ("7"). Gives declared ties' tensors the first name's values. Every stage of `pipeline`
  // constructs one at the same point (a tie spanning stages gets a process group of its stages).
  TiedGradients(std::vector<TiedParameter> ties, const torch::nn::Sequential& whole,
                const torch::nn::Sequential& stage_module, int64_t stage,
                const std::shared_ptr<World>& pipeline);
  ~TiedGradients();

  // Gives every copy of each tied parameter the sum of the gradients of all its copies, over
  // names and stages. A collective among the stages sharing a tie; call it once per optimizer
  // step, after the last backward (and after data-parallel averaging).
  void reduce();
  // Throws std::invalid_argument, on every stage sharing a tie, where its copies would not train
  // as one parameter: some frozen (requires_grad false) and others not, or, where they train, some
  // given to the optimizer (`optimized`) and others not. A collective among the stages sharing
  // each tie: call it on every stage once the optimizer is built, before the first step.
  void check_trained_alike(const std::vector<at::Tensor>& optimized) const;
  // True when this stage holds `parameter` as a copy of a tie whose first name lives on an
  // earlier stage, or as a declared twin of a tensor it also holds: a sum over the whole model
  // (a gradient norm) must skip it.
  bool is_extra_copy(const at::Tensor& parameter) const;
  const std::vector<TiedParameter>& ties() const { return ties_; }

 private:
  struct Local;
  std::vector<TiedParameter> ties_;
  std::vector<Local> local_;  // the ties this stage holds
};

}  // namespace pipetrain
