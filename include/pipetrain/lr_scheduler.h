// Learning-rate schedules as pure functions of how many times they have stepped, so that saving
// and resuming one is saving and restoring a single counter.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
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
  // Each param group's learning rate after `count` steps (what set_step_count(count) sets).
  std::vector<double> lrs_at(int64_t count) const;

 protected:
  // The factor applied to a group's initial learning rate after `count` steps.
  virtual double factor(int64_t count) const = 0;
  // Each param group's learning rate when the scheduler was made, in the optimizer's order.
  const std::vector<double>& base_lrs() const { return base_lrs_; }

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

// The language-model schedule of nanoGPT, llm.c and torchtitan: a linear warmup, then a decay to
// min_lr, which it keeps. With `count` the steps taken (the optimizer step about to run is step
// `count`, from 0) and base a group's initial learning rate:
// - count < warmup_steps: base x (count + 1) / warmup_steps, as llm.c and torchtitan warm up (the
//   first step already moves, and the last warmup step runs at base);
// - warmup_steps <= count <= decay_steps, t = (count - warmup_steps) / (decay_steps -
//   warmup_steps) running from 0 to 1, by `shape`:
//     "constant": base (no decay; min_lr and decay_steps are not used),
//     "cosine":   min + (base - min) x 0.5 x (1 + cos(pi t)), nanoGPT's and llm.c's,
//     "linear":   min + (base - min) x (1 - t);
// - count > decay_steps: min.
// min_lr is an absolute learning rate, that of the first param group; the other groups keep their
// ratio to it (min = base x min_lr / first group's base), so groups that share one learning rate
// (AdamW's decayed and undecayed parameters) share every value of the schedule. The rates are
// those of step_count() from construction on (step 0's, a warmup's smallest, before any step()).
// Made for interval "step" (OptimizerConfig), where step_count() is the optimizer steps taken.
class WarmupDecayLR : public LRScheduler {
 public:
  // Throws std::invalid_argument naming the value for a shape not in shapes(), warmup_steps or
  // decay_steps below 0, a min_lr below 0 or above the first group's learning rate, and (for
  // "cosine" and "linear") decay_steps not above warmup_steps, which leaves nothing to decay over.
  WarmupDecayLR(torch::optim::Optimizer& optimizer, const std::string& shape, int64_t warmup_steps,
                int64_t decay_steps = 0, double min_lr = 0.0);

  // "constant", "cosine", "linear".
  static std::vector<std::string> shapes();

 protected:
  double factor(int64_t count) const override;

 private:
  std::string shape_;
  int64_t warmup_steps_;
  int64_t decay_steps_;
  double min_factor_ = 0.0;  // min_lr over the first group's base
};

// Reads and writes the learning rate of any optimizer torch ships (the options classes differ).
double get_learning_rate(const torch::optim::OptimizerParamGroup& group);
void set_learning_rate(torch::optim::OptimizerParamGroup& group, double lr);

}  // namespace pipetrain
