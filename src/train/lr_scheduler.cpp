#include "pipetrain/lr_scheduler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace pipetrain {
namespace {

// A rate as a user wrote it ("6e-05", "0.0006"), not std::to_string's fixed six decimals.
std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

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

std::vector<double> LRScheduler::lrs_at(int64_t count) const {
  std::vector<double> lrs;
  for (const double base : base_lrs_) lrs.push_back(base * factor(count));
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

std::vector<std::string> WarmupDecayLR::shapes() { return {"constant", "cosine", "linear"}; }

WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer, const std::string& shape,
                             int64_t warmup_steps, int64_t decay_steps, double min_lr)
    : LRScheduler(optimizer),
      shape_(shape),
      warmup_steps_(warmup_steps),
      decay_steps_(decay_steps) {
  const auto names = shapes();
  if (std::find(names.begin(), names.end(), shape) == names.end()) {
    throw std::invalid_argument("WarmupDecayLR shape '" + shape +
                                "' is not one of constant, cosine, linear");
  }
  if (warmup_steps < 0 || decay_steps < 0) {
    throw std::invalid_argument("WarmupDecayLR warmup_steps (" + std::to_string(warmup_steps) +
                                ") and decay_steps (" + std::to_string(decay_steps) +
                                ") must be at least 0");
  }
  if (shape != "constant" && decay_steps <= warmup_steps) {
    throw std::invalid_argument("WarmupDecayLR " + shape + " decays from the end of warmup (step " +
                                std::to_string(warmup_steps) + ") to decay_steps (" +
                                std::to_string(decay_steps) +
                                "), which must be later: raise decay_steps or lower warmup_steps");
  }
  const double base = base_lrs().empty() ? 0.0 : base_lrs().front();
  if (!(min_lr >= 0 && min_lr <= base)) {
    throw std::invalid_argument("WarmupDecayLR min_lr " + number(min_lr) +
                                " must be between 0 and the learning rate " + number(base));
  }
  min_factor_ = base > 0 ? min_lr / base : 0.0;
  // Step 0 runs at the schedule's first value, not at the optimizer's own rate.
  set_step_count(0);
}

double WarmupDecayLR::factor(int64_t count) const {
  if (count < warmup_steps_) {
    return static_cast<double>(count + 1) / static_cast<double>(warmup_steps_);
  }
  if (shape_ == "constant") return 1.0;
  if (count >= decay_steps_) return min_factor_;
  const double t = static_cast<double>(count - warmup_steps_) /
                   static_cast<double>(decay_steps_ - warmup_steps_);
  const double remaining = shape_ == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * t)) : 1.0 - t;
  return min_factor_ + (1.0 - min_factor_) * remaining;
}

}  // namespace pipetrain
