// The backward of one micro-batch in two halves, as zero-bubble pipelines split it (Qi et al.,
// 2024; torch.distributed.pipelining's stage_backward_input / stage_backward_weight): first the
// gradients of the stage's inputs alone, which the previous stage waits for; later the gradients
// of everything else autograd would reach (the parameters), which nobody waits for.
//
// The first half runs autograd from the outputs to the inputs, keeping the graph: autograd then
// runs only the nodes on a path to an input, and each computes only the gradients that lead there
// (a Linear's backward gives dX and leaves dW). The second half starts where the paths to the
// parameters leave the input path: at "intermediate" nodes, on the input path, with edges off it.
// A hook on each records the gradients it received in the first half; the second half cuts the
// intermediates' edges along the input path and runs autograd from the intermediates, with what
// they received, down to the parameters. No node of the input path computes a gradient twice, so
// nothing is counted twice, whatever the graph shares (a weight used by two layers of a stage).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace pipetrain {

class WeightBackward {
 public:
  WeightBackward();
  ~WeightBackward();
  WeightBackward(WeightBackward&&) noexcept;
  WeightBackward& operator=(WeightBackward&&) noexcept;

  // The first half: returns the gradients of `roots` (given `grads`; empty: roots are scalar
  // losses) with respect to each of `inputs` (leaves that require grad; undefined where an input
  // had no effect), and leaves the second half in the returned object's run().
  static WeightBackward input_backward(const std::vector<at::Tensor>& roots,
                                       const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& inputs,
                                       std::vector<at::Tensor>* input_grads);

  // The second half: accumulates the gradients of the parameters (and any other leaf autograd
  // reaches from the roots) into their .grad, as a whole backward would have, and lets the graph
  // go. Runs once; a default-constructed object does nothing.
  void run();

 private:
  struct Intermediates;
  std::unique_ptr<Intermediates> pending_;
};

}  // namespace pipetrain
