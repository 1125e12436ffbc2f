#include "pipetrain/module.h"

#include <torch/torch.h>

#include <stdexcept>

#include "pipetrain/tied_parameters.h"

namespace pipetrain {

void LoggedMetrics::add(const std::string& name, const at::Tensor& value, int64_t samples,
                        const LogOptions& options) {
  if (value.numel() != 1) {
    throw std::invalid_argument("log('" + name + "') needs a scalar, got a tensor of " +
                                std::to_string(value.numel()) + " elements");
  }
  const auto weighted = value.detach().to(torch::kFloat64).reshape({}) * samples;
  auto& sum = sums_[name];
  sum.weighted = sum.weighted.defined() ? sum.weighted + weighted : weighted;
  sum.samples += samples;
  options_[name] = options;
}

void LoggedMetrics::merge(const LoggedMetrics& other) {
  for (const auto& [name, sum] : other.sums_) {
    auto& mine = sums_[name];
    mine.weighted = mine.weighted.defined() ? mine.weighted + sum.weighted : sum.weighted;
    mine.samples += sum.samples;
    options_[name] = other.options_.at(name);
  }
}

std::map<std::string, double> LoggedMetrics::means() const {
  std::map<std::string, double> means;
  for (const auto& [name, sum] : sums_) {
    means[name] = sum.weighted.item<double>() / static_cast<double>(sum.samples);
  }
  return means;
}

std::map<std::string, std::pair<double, int64_t>> LoggedMetrics::totals() const {
  std::map<std::string, std::pair<double, int64_t>> totals;
  for (const auto& [name, sum] : sums_) totals[name] = {sum.weighted.item<double>(), sum.samples};
  return totals;
}

ReducedMetrics LoggedMetrics::reduce() const {
  ReducedMetrics reduced;
  for (const auto& [name, mean] : means()) reduced[name] = {mean, options_.at(name).prog_bar()};
  return reduced;
}

namespace {

// Lightning's defaults: training steps log per step, evaluation steps per epoch.
bool logs_on_step(const LogOptions& options, bool training) {
  return options.on_step().value_or(training);
}
bool logs_on_epoch(const LogOptions& options, bool training) {
  return options.on_epoch().value_or(!training);
}

}  // namespace

LoggedMetrics LoggedMetrics::step_view(bool training) const {
  LoggedMetrics view;
  for (const auto& [name, sum] : sums_) {
    const auto& options = options_.at(name);
    if (!logs_on_step(options, training)) continue;
    const auto key = logs_on_epoch(options, training) ? name + "_step" : name;
    view.sums_[key] = sum;
    view.options_[key] = options;
  }
  return view;
}

LoggedMetrics LoggedMetrics::epoch_view(bool training) const {
  LoggedMetrics view;
  for (const auto& [name, sum] : sums_) {
    const auto& options = options_.at(name);
    if (!logs_on_epoch(options, training)) continue;
    const auto key = logs_on_step(options, training) ? name + "_epoch" : name;
    view.sums_[key] = sum;
    view.options_[key] = options;
  }
  return view;
}

Module::Module(torch::nn::Sequential layers)
    : layers_(std::move(layers)),
      local_layers_(layers_),
      forward_([this](const at::Tensor& x) { return layers_->forward(x); }) {}

void Module::validation_step(const Batch&, int64_t) {}

void Module::test_step(const Batch&, int64_t) {}

at::Tensor Module::predict_step(const Batch& batch, int64_t) { return forward(batch.data); }

at::Tensor Module::forward(const at::Tensor& input) { return forward_(input); }

std::vector<at::Tensor> Module::parameters() const {
  return distinct_tensors(local_layers_->parameters());
}

void Module::log(const std::string& name, const at::Tensor& value, const LogOptions& options) {
  if (log_target_) log_target_->add(name, value, log_samples_, options);
}

void Module::log(const std::string& name, double value, const LogOptions& options) {
  log(name, torch::tensor(value, torch::kFloat64), options);
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
