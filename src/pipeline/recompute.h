// Activation checkpointing (torchgpipe / FairScale semantics): a recomputed micro-batch runs its
// stage forward without keeping activations and recomputes them during backward. The random
// number generators (the CPU's, and the CUDA device's the stage runs on: dropout on a GPU draws
// from that one) are put back to their state at the original forward for the recompute, so dropout
// draws the same mask twice and results do not depend on the mode.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

enum class CheckpointMode { kAlways, kExceptLast, kNever };

// "always" | "except_last" | "never"; anything else throws std::invalid_argument listing them.
CheckpointMode parse_checkpoint_mode(const std::string& name);
std::vector<std::string> checkpoint_mode_names();

// Micro-batches with index < recompute_below(...) are recomputed during training.
int64_t recompute_below(CheckpointMode mode, int64_t chunks);

// The state of the default CPU generator and, for a CUDA `device`, of that device's default
// generator, to replay a forward's random draws.
class RngState {
 public:
  static RngState capture(const c10::Device& device = c10::Device(c10::kCPU));
  // The state of the CPU generator and, where `device` is a CUDA device, of its generator too.
  static RngState from(at::Tensor cpu_state, const c10::Device& device = c10::Device(c10::kCPU),
                       at::Tensor device_state = {});
  const at::Tensor& cpu_state() const { return cpu_state_; }
  // The CUDA device's generator's state; undefined where captured on the CPU alone.
  const at::Tensor& device_state() const { return device_state_; }
  // Sets the generators to this state.
  void restore() const;
  // Runs `fn` with the generators as captured, then puts them back as they were before.
  template <typename Fn>
  auto replay(Fn&& fn) const {
    const auto now = capture(device_);
    restore();
    struct Restore {
      const RngState& state;
      ~Restore() { state.restore(); }
    } guard{now};
    return fn();
  }

 private:
  at::Tensor cpu_state_;
  c10::Device device_ = c10::Device(c10::kCPU);
  at::Tensor device_state_;  // a CUDA device's generator, where device_ is one
};

}  // namespace pipetrain
