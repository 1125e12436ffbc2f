// What training holds in memory on each rank, said before the first step and measured after the
// last: the weights, gradients and optimizer state of the rank's own layers (what ZeRO shares out
// counted where it lives), the limit a fit was given checked against them before any step, and
// the measured peak (the CUDA caching allocator's, or the process's resident set on the CPU).
#pragma once

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pipetrain {

class Module;
class World;

// Bytes on one rank.
struct MemoryFigures {
  int64_t parameters = 0;             // weights and buffers of the rank's layers
  int64_t gradients = 0;              // one per trainable parameter
  int64_t optimizer_state = 0;        // what the optimizer keeps for the parameters it steps
                                      // (the trainable ones: a frozen one gets no state)
  bool optimizer_state_known = true;  // false for an optimizer whose state is not counted
  // The first training step's peak above the weights (StepMemoryMeter); -1 until measured.
  int64_t first_step_peak = -1;
  // What the rank holds at its peak: the weights, the optimizer state and, once measured, the
  // first step's peak (which holds the gradients); until then the gradients alone.
  int64_t total() const {
    return parameters + optimizer_state + (first_step_peak >= 0 ? first_step_peak : gradients);
  }
};

// This rank's figures, from its layers and the optimizer as the strategy set it up (under ZeRO,
// this replica's share). The optimizer's state is counted by its kind before it exists: Adam and
// AdamW two moments (three with amsgrad), SGD a momentum buffer where momentum is on, RMSprop its
// average (and momentum, and centred mean), Adagrad its sum; any other's is not known.
MemoryFigures memory_figures(const Module& module, const torch::optim::Optimizer& optimizer);

// This rank's figures through a fit: said at its start, completed by its first training step.
struct FitMemory {
  MemoryFigures mine;
  bool measured = false;  // the first step's peak is in
};

// Every rank's figures, on every rank (a collective).
std::vector<MemoryFigures> gather_memory_figures(const World& world, const MemoryFigures& mine);

// The table rank 0 prints at the start of fit and after the first step: one row per rank, in MiB.
std::string memory_table(const std::vector<MemoryFigures>& ranks);

// The table's figures in MiB, for callback_metrics: parameter_memory_mib/rank_<r>,
// gradient_memory_mib/rank_<r>, optimizer_state_memory_mib/rank_<r> (where known) and
// first_step_peak_memory_mib/rank_<r> (once measured), beside fit's peak_memory_mib/rank_<r>.
std::map<std::string, double> memory_metrics(const std::vector<MemoryFigures>& ranks);

// Throws std::invalid_argument, naming the rank, its figures and what would make it fit, when a
// rank's total is more than `max_memory` bytes (0: no limit), or its optimizer's state is not
// known.
void check_memory_limit(const std::vector<MemoryFigures>& ranks, int64_t max_memory);

// Bytes of tensors allocated on `device` and still live, at their highest while a meter lives,
// above what was live when it started: what the first training step adds to the weights (its
// activations, gradients, communication buffers and workspace), counted exactly. On the CPU a
// counting allocator stands in for the default one while the meter lives (memory it handed out is
// released through the allocator that made it, also after the meter is gone); on a GPU the CUDA
// caching allocator's own statistics are read, its peak reset at the start.
class StepMemoryMeter {
 public:
  explicit StepMemoryMeter(const c10::Device& device);
  ~StepMemoryMeter();
  StepMemoryMeter(const StepMemoryMeter&) = delete;
  StepMemoryMeter& operator=(const StepMemoryMeter&) = delete;

  // -1 where it could not be measured (another CPU allocator of higher priority is installed).
  int64_t peak() const;
  // Bytes allocated since the meter started and not yet freed; -1 as peak().
  int64_t held() const;

 private:
  int64_t since_start(bool peak) const;  // the peak or the live bytes above the start

  c10::Device device_;
  int64_t start_ = 0;
  c10::Allocator* replaced_ = nullptr;  // the CPU allocator to put back
};

// The most memory this process has held on `device` so far: the CUDA caching allocator's peak of
// allocated bytes, or on the CPU the process's peak resident set.
int64_t peak_memory_bytes(const c10::Device& device);

}  // namespace pipetrain
