#include "pipe_options.h"

#include <stdexcept>

#include "pipeline/recompute.h"
#include "pipetrain/balance.h"
#include "pipetrain/schedule.h"

namespace pipetrain {

void check_pipe_options(const PipeOptions& options, int64_t ranks, const std::string& ranks_from) {
  if (options.virtual_stages() < 1) {
    throw std::invalid_argument(
        "virtual stages (PipeOptions::virtual_stages, --virtual-stages) must be at least 1 (got " +
        std::to_string(options.virtual_stages()) + ")");
  }
  const int64_t stages = ranks * options.virtual_stages();
  if (!options.balance().empty() && static_cast<int64_t>(options.balance().size()) != stages) {
    throw std::invalid_argument(
        ranks_from +
        (options.virtual_stages() > 1
             ? " with " + std::to_string(options.virtual_stages()) + " virtual stages each"
             : std::string()) +
        " disagrees with balance " + format_balance(options.balance()) + " (" +
        std::to_string(options.balance().size()) +
        " stages): give one balance entry per stage (processes x virtual stages)");
  }
  if (options.chunks() < 1) {
    throw std::invalid_argument("chunks must be at least 1 (got " +
                                std::to_string(options.chunks()) + ")");
  }
  if (options.max_in_flight() < 0) {
    throw std::invalid_argument(
        "max_in_flight (--max-in-flight) must be 0 (no limit) or a number of micro-batches' "
        "activations, got " +
        std::to_string(options.max_in_flight()));
  }
  parse_checkpoint_mode(options.checkpoint());
  if (options.schedule() == "auto") {
    if (options.virtual_stages() != 1 || !options.schedule_file().empty()) {
      throw std::invalid_argument(
          "schedule 'auto' chooses among 1f1b, zbh1, zbh2 and gpipe, which run one stage per rank: "
          "leave virtual stages at 1 and the schedule file unset");
    }
  } else if (options.schedule_file().empty()) {
    make_schedule(options.schedule(), 1, 1, options.virtual_stages());  // a known name
  }
}

void check_chunks_fit(int64_t chunks, int64_t batch_size) {
  if (chunks > batch_size) {
    throw std::invalid_argument(
        "chunks (" + std::to_string(chunks) + ") is larger than the batch size (" +
        std::to_string(batch_size) +
        "): every micro-batch needs at least one sample; lower PipeOptions::chunks (--chunks) "
        "or raise the loader's batch_size (--batch-size)");
  }
}

}  // namespace pipetrain
