#include "pipetrain/lr_scheduler.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

namespace pipetrain {

double get_learning_rate(const torch::optim::OptimizerParamGroup& group) {
  return group.options().get_lr();
}

void set_learning_rate(torch::optim::OptimizerParamGroup& group, double lr) {
  group.options().set_lr(lr);
}

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (const auto& group : optimizer_.param_groups()) base_lrs_.push_back(get_learning_rate(group));
}

void LRScheduler::step() {
  ++step_count_;
  apply();
}

void LRScheduler::set_step_count(int64_t count) {
  step_count_ = count;
  apply();
}

std::vector<double> LRScheduler::last_lr() const {
  std::vector<double> lrs;
  for (const auto& group : optimizer_.param_groups()) lrs.push_back(get_learning_rate(group));
  return lrs;
}

void LRScheduler::apply() {
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    set_learning_rate(groups[i], base_lrs_[i] * factor(step_count_));
  }
}

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1) {
    throw std::invalid_argument("StepLR step_size must be at least 1 (got " +
                                std::to_string(step_size) + ")");
  }
}

double StepLR::factor(int64_t count) const {
  return std::pow(gamma_, static_cast<double>(count / step_size_));
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> fn)
    : LRScheduler(optimizer), fn_(std::move(fn)) {}

}  // namespace pipetrain
