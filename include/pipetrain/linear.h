// `pipetrain::linear`: at::linear for the Linear layers inside a block of one's own.
//
// With PipeOptions::fuse_gradient_accumulation (--fuse-gradient-accumulation) a stage's own
// torch::nn::Linear layers are swapped for ones that add their weight and bias gradients inside
// the GEMM that computes them. A Linear held inside another module cannot be swapped (the block
// keeps its own handle to it), so a block that wants the same calls
//
//   pipetrain::linear(x, fc->weight, fc->bias)
//
// where it would call fc(x). It computes what at::linear computes; while a pipe step runs on a
// stage that fuses, it also accumulates the gradients in place (no gradient hook fires on those
// parameters), and puts that work off where the stage's schedule does. Under autocast
// (bf16-mixed) the GEMMs run in bf16, as autocast's linear would, and the weight gradient goes
// straight into the fp32 .grad (on CUDA the GEMM writes fp32 itself, unrounded to bf16).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace pipetrain {

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                  const at::Tensor& bias = at::Tensor());

// Several Linear layers reading one input (attention's q, k and v projections; SwiGLU's gate and
// up): linear(input, weights[i], biases[i]) for each (`biases` empty, or one per weight, undefined
// for none). While a stage fuses, the input's gradient, the sum of the layers', is added up inside
// the GEMMs that compute it, where autograd would add the layers' gradients in passes of their own.
std::vector<at::Tensor> linears(const at::Tensor& input, const std::vector<at::Tensor>& weights,
                                const std::vector<at::Tensor>& biases = {});

}  // namespace pipetrain
