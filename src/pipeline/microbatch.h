// How a batch is cut into micro-batches along dim 0. Always exactly `chunks` pieces whose sizes
// differ by at most one (the first batch_size % chunks get one sample more), so a schedule built
// for `chunks` micro-batches is the schedule that runs.
#pragma once

#include <cstdint>
#include <vector>

#include "pipetrain/pipe.h"  // MicroBatch

namespace pipetrain {

// Throws std::invalid_argument when chunks < 1 or chunks > batch_size.
std::vector<MicroBatch> split_microbatches(int64_t batch_size, int64_t chunks);

}  // namespace pipetrain
