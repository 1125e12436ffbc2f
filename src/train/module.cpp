#include "pipetrain/module.h"

#include <torch/torch.h>

#include <stdexcept>

namespace pipetrain {

void LoggedMetrics::add(const std::string& name, const at::Tensor& value, int64_t samples) {
  if (value.numel() != 1) {
    throw std::invalid_argument("log('" + name + "') needs a scalar, got a tensor of " +
                                std::to_string(value.numel()) + " elements");
  }
  const auto weighted = value.detach().to(torch::kFloat64).reshape({}) * samples;
  auto& sum = sums_[name];
  sum.weighted = sum.weighted.defined() ? sum.weighted + weighted : weighted;
  sum.samples += samples;
}

std::map<std::string, double> LoggedMetrics::means() const {
  std::map<std::string, double> means;
  for (const auto& [name, sum] : sums_) {
    means[name] = sum.weighted.item<double>() / static_cast<double>(sum.samples);
  }
  return means;
}

Module::Module(torch::nn::Sequential layers)
    : layers_(std::move(layers)),
      local_layers_(layers_),
      forward_([this](const at::Tensor& x) { return layers_->forward(x); }) {}

at::Tensor Module::forward(const at::Tensor& input) { return forward_(input); }

std::vector<at::Tensor> Module::parameters() const { return local_layers_->parameters(); }

void Module::log(const std::string& name, const at::Tensor& value) {
  if (log_target_) log_target_->add(name, value, log_samples_);
}

void Module::log(const std::string& name, double value) {
  log(name, torch::tensor(value, torch::kFloat64));
}

void Module::place(ForwardFn forward, torch::nn::Sequential local_layers) {
  forward_ = std::move(forward);
  local_layers_ = std::move(local_layers);
}

void Module::set_log_target(LoggedMetrics* metrics, int64_t samples) {
  log_target_ = metrics;
  log_samples_ = samples;
}

}  // namespace pipetrain
