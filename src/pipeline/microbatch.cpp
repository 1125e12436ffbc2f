#include "pipeline/microbatch.h"

#include <stdexcept>
#include <string>

#include "pipe_options.h"

namespace pipetrain {

std::vector<MicroBatch> split_microbatches(int64_t batch_size, int64_t chunks) {
  if (chunks < 1) {
    throw std::invalid_argument("chunks must be at least 1 (got " + std::to_string(chunks) + ")");
  }
  check_chunks_fit(chunks, batch_size);
  std::vector<MicroBatch> microbatches;
  const int64_t base = batch_size / chunks;
  const int64_t larger = batch_size % chunks;
  int64_t begin = 0;
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t size = base + (i < larger ? 1 : 0);
    microbatches.push_back({i, begin, begin + size});
    begin += size;
  }
  return microbatches;
}

}  // namespace pipetrain
