// Activation checkpointing (torchgpipe / FairScale semantics): a recomputed micro-batch runs its
// stage forward without keeping activations and recomputes them during backward. The random
// number generator is put back to its state at the original forward for the recompute, so dropout
// draws the same mask twice and results do not depend on the mode.
#pragma once

#include <ATen/core/Tensor.h>

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

// The state of the default CPU generator, to replay a forward's random draws.
class RngState {
 public:
  static RngState capture();
  static RngState from(at::Tensor cpu_state);
  const at::Tensor& cpu_state() const { return cpu_state_; }
  // Sets the generator to this state.
  void restore() const;
  // Runs `fn` with the generator as captured, then puts the generator back as it was before.
  template <typename Fn>
  auto replay(Fn&& fn) const {
    const auto now = capture();
    restore();
    struct Restore {
      const RngState& state;
      ~Restore() { state.restore(); }
    } guard{now};
    return fn();
  }

 private:
  at::Tensor cpu_state_;
};

}  // namespace pipetrain
