// Learning-rate schedules as pure functions of how many times they have stepped, so that saving
// and resuming one is saving and restoring a single counter.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace pipetrain {

class LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LRScheduler() = default;

  // Advances one interval and sets every param group's learning rate.
  void step();
  int64_t step_count() const { return step_count_; }
  // Restores a saved step_count() and the learning rates it implies.
  void set_step_count(int64_t count);
  std::vector<double> last_lr() const;

 protected:
  // The factor applied to a group's initial learning rate after `count` steps.
  virtual double factor(int64_t count) const = 0;

 private:
  void apply();
  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t step_count_ = 0;
};

// lr = base * gamma^(count / step_size), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double factor(int64_t count) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base * fn(count), as torch.optim.lr_scheduler.LambdaLR.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> fn);

 protected:
  double factor(int64_t count) const override { return fn_(count); }

 private:
  std::function<double(int64_t)> fn_;
};

// Reads and writes the learning rate of any optimizer torch ships (the options classes differ).
double get_learning_rate(const torch::optim::OptimizerParamGroup& group);
void set_learning_rate(torch::optim::OptimizerParamGroup& group, double lr);

}  // namespace pipetrain
