#include "pipeline/activation_memory.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pipetrain {

std::vector<int64_t> peak_activation_bytes(const Schedule& schedule,
                                           const std::vector<StageActivations>& stages,
                                           int64_t recomputed) {
  const auto placement = stage_placement(schedule);
  if (placement.size() != stages.size()) {
    throw std::invalid_argument("peak_activation_bytes: the schedule has " +
                                std::to_string(placement.size()) + " stages, the costs " +
                                std::to_string(stages.size()));
  }
  std::vector<int64_t> peaks(schedule.size(), 0);
  for (size_t r = 0; r < schedule.size(); ++r) {
    int64_t live = 0, peak = 0;
    for (const Action& a : schedule[r]) {
      const auto s = static_cast<size_t>(a.stage >= 0 ? a.stage : static_cast<int64_t>(r));
      const StageActivations& cost = stages[s];
      const bool recompute = a.microbatch < recomputed;
      const int64_t kept = recompute ? cost.boundary : cost.whole;
      // What a backward adds while it runs: the rebuilt activations of a recomputed micro-batch.
      const int64_t rebuilt = recompute ? cost.whole : 0;
      switch (a.phase) {
        case Phase::kForward:
          live += kept;
          peak = std::max(peak, live);
          break;
        case Phase::kBackward:
          peak = std::max(peak, live + rebuilt + cost.workspace);
          live -= kept;
          break;
        case Phase::kInputBackward:
          peak = std::max(peak, live + rebuilt + cost.workspace);
          live += rebuilt + cost.split;  // what the weight gradients still need waits for them
          peak = std::max(peak, live);
          break;
        case Phase::kWeightBackward:
          peak = std::max(peak, live + cost.workspace);
          live -= kept + rebuilt + cost.split;
          break;
      }
    }
    peaks[r] = peak;
  }
  return peaks;
}

}  // namespace pipetrain
