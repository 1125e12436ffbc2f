// The model, data and training loop that pipelined runs are compared against: the same Sequential,
// trained in one process on the full batch.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace pipetrain {
class Pipe;
}

namespace pipetrain::testing {

constexpr int64_t kBatchSize = 13;  // odd, so chunks 2, 3 and 8 give uneven micro-batches
constexpr int64_t kSteps = 3;
constexpr double kLearningRate = 0.1;

// 7 layers: Linear(6,16) Tanh Linear(16,16) Tanh [Dropout] Linear(16,16) Tanh Linear(16,3).
torch::nn::Sequential make_reference_model(uint64_t seed, double dropout = 0.0);

// Inputs and targets of step `step`.
std::pair<at::Tensor, at::Tensor> reference_batch(int64_t step);

// kSteps of SGD through `pipe` on the reference batches, MSE loss: the losses, float64 [kSteps],
// where `pipe` runs the last stage, else an empty tensor.
at::Tensor train_reference_pipe(Pipe& pipe);

struct TrainingResult {
  std::vector<double> losses;          // one per step
  std::vector<at::Tensor> parameters;  // after the last step, in Sequential order
};

// kSteps of SGD on the full batch of each step, MSE loss, on `device` in `dtype`; parameters are
// returned on the CPU.
TrainingResult train_single_process(torch::nn::Sequential model,
                                    c10::Device device = c10::Device(c10::DeviceType::CPU),
                                    c10::ScalarType dtype = c10::ScalarType::Float);

}  // namespace pipetrain::testing
