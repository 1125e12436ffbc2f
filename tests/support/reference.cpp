#include "support/reference.h"

#include <ATen/CPUGeneratorImpl.h>

#include "pipetrain/pipe.h"

namespace pipetrain::testing {

at::Tensor train_reference_pipe(Pipe& pipe) {
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(kLearningRate));
  at::Tensor losses = torch::zeros({kSteps}, torch::kFloat64);
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [inputs, targets] = reference_batch(step);
    optimizer.zero_grad();
    auto loss =
        pipe.forward_backward(inputs, kBatchSize, [&](const at::Tensor& out, const MicroBatch& mb) {
          return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
        });
    optimizer.step();
    if (loss.defined()) losses[step] = loss.item<double>();
  }
  return pipe.is_last_stage() ? losses : torch::empty({0}, torch::kFloat64);
}

torch::nn::Sequential make_reference_model(uint64_t seed, double dropout) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 16), torch::nn::Tanh());
  if (dropout > 0) model->push_back(torch::nn::Dropout(dropout));
  model->push_back(torch::nn::Linear(16, 16));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(16, 3));
  return model;
}

std::pair<at::Tensor, at::Tensor> reference_batch(int64_t step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto inputs = torch::randn({kBatchSize, 6}, generator);
  auto targets = torch::randn({kBatchSize, 3}, generator);
  return {inputs, targets};
}

TrainingResult train_single_process(torch::nn::Sequential model, c10::Device device,
                                    c10::ScalarType dtype) {
  model->to(device, dtype);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  TrainingResult result;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [inputs, targets] = reference_batch(step);
    optimizer.zero_grad();
    auto loss =
        torch::mse_loss(model->forward(inputs.to(device, dtype)), targets.to(device, dtype));
    loss.backward();
    optimizer.step();
    result.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model->parameters()) result.parameters.push_back(p.detach().cpu().clone());
  return result;
}

}  // namespace pipetrain::testing
