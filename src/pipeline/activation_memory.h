// How much activation memory a schedule makes each rank hold: the byte count behind
// activations_held()'s micro-batch count, with recomputation (activation checkpointing) and split
// backwards taken into account. What a planner weighs against a memory limit.
#pragma once

#include <cstdint>
#include <vector>

#include "pipetrain/schedule.h"

namespace pipetrain {

// One micro-batch on one stage, in bytes.
struct StageActivations {
  int64_t whole = 0;      // held from its forward to its backward when nothing is recomputed
  int64_t boundary = 0;   // held instead when it is recomputed: the stage's input and output
  int64_t workspace = 0;  // on top, while one of its backwards runs (temporaries, weight gradients)
  int64_t split = 0;      // on top, from a split backward's I to its W (what W still needs)
};

// The most activation bytes each rank holds at once (result[rank]) running `schedule` with
// `stages[s]` for stage s, micro-batches below `recomputed` recomputed. Walks each rank's actions
// in order: a forward adds what the micro-batch keeps (whole, or boundary when recomputed); a
// backward (B) runs with its micro-batch's whole activations present (rebuilt first when
// recomputed) plus workspace, then frees them; a split backward's I does the same but keeps them,
// and `split` more, until its W. Throws std::invalid_argument when `stages` does not match the
// schedule's stages.
std::vector<int64_t> peak_activation_bytes(const Schedule& schedule,
                                           const std::vector<StageActivations>& stages,
                                           int64_t recomputed);

}  // namespace pipetrain
