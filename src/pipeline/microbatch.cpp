#include "pipetrain/microbatch.h"

#include <stdexcept>
#include <string>

namespace pipetrain {

std::vector<MicroBatch> split_microbatches(int64_t batch_size, int64_t chunks) {
  if (chunks < 1) {
    throw std::invalid_argument("chunks must be at least 1 (got " + std::to_string(chunks) + ")");
  }
  if (chunks > batch_size) {
    throw std::invalid_argument("chunks (" + std::to_string(chunks) +
                                ") is larger than the batch size (" + std::to_string(batch_size) +
                                "): every micro-batch needs at least one sample; lower --chunks "
                                "or raise --batch-size");
  }
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
