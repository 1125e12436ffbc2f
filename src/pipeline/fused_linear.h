// Linear layers whose weight gradient is accumulated inside the GEMM that computes it, as
// Megatron's gradient-accumulation fusion does. With micro-batches every backward of a Linear
// computes its weight gradient into a new tensor and then adds it to .grad: a second pass over a
// buffer as large as the weight, per micro-batch. Here backward runs `grad.addmm_(g^T, x)`, so the
// GEMM's epilogue does the accumulation (in fp32 inside cuBLAS, rounded once into .grad).
#pragma once

#include <torch/nn/modules/container/sequential.h>

namespace pipetrain {

// `layer` itself, or, for a torch::nn::Linear, a module sharing its parameters whose backward
// accumulates their gradients in place, outside autograd (whose graph has no edges to them).
torch::nn::AnyModule fuse_gradient_accumulation(const torch::nn::AnyModule& layer);

}  // namespace pipetrain
