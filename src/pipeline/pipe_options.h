// What makes PipeOptions valid, decided here alone: the strategy asks before any process starts
// (a usage error, exit 2), and the Pipe asks again where it is built (a program driving it
// without a Trainer), so both refuse the same options with the same words.
#pragma once

#include <cstdint>
#include <string>

#include "pipetrain/pipe.h"

namespace pipetrain {

// Throws std::invalid_argument naming the option and what to change when `options` cannot run on
// `ranks` processes: virtual stages below 1, a balance of another number of stages, chunks below
// 1, a negative max_in_flight, an unknown checkpoint mode or schedule, schedule "auto" with virtual
// stages or a schedule file. `ranks_from` says where `ranks` came from, e.g. "devices (2)".
void check_pipe_options(const PipeOptions& options, int64_t ranks, const std::string& ranks_from);

// Throws std::invalid_argument when a batch of `batch_size` rows cannot be cut into `chunks`
// micro-batches of at least one row each.
void check_chunks_fit(int64_t chunks, int64_t batch_size);

}  // namespace pipetrain
