// Schedules as the Pipe takes them: built by name or read from a file of one's own, and checked
// before any rank runs them (simulated, and their transfers in the order they go), so that a
// malformed one fails with its grid instead of hanging the ranks or mixing up micro-batches.
#pragma once

#include <cstdint>
#include <string>

#include "pipetrain/schedule.h"

namespace pipetrain {

// make_schedule(name, ...), checked.
Schedule checked_schedule(const std::string& name, int64_t ranks, int64_t chunks,
                          int64_t virtual_stages);

// The schedule of PipeOptions::schedule_file (torch.distributed.pipelining's compute-only CSV),
// checked, and checked against the pipe it is to run: one line per rank, `stages` stages, `chunks`
// micro-batches. Throws std::invalid_argument naming the file and what to change.
Schedule read_schedule_file(const std::string& path, int64_t ranks, int64_t stages, int64_t chunks);

// The most micro-batches' activations one stage of `schedule` holds at once.
int64_t max_activations_held(const Schedule& schedule);

}  // namespace pipetrain
