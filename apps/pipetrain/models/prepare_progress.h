// prepare-data's progress on standard error, as the Trainer's bar shows an epoch's (its
// formatting, train/progress_bar.h): on a terminal one line redrawn in place, in a log a plain
// line every 30 seconds.
//   Tokenizing: 12034 documents, 48.2/512.0 MB [00:07<01:07, 6.9 MB/s, 1.52M tokens/s]
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace pipetrain::cli {

// The line, for `documents` and `tokens` done from `bytes` of `total_bytes` (unset: unknown, no
// ETA) in `seconds`.
std::string format_prepare_progress(int64_t documents, uint64_t bytes,
                                    std::optional<uint64_t> total_bytes, int64_t tokens,
                                    double seconds);

class PrepareProgress {
 public:
  explicit PrepareProgress(std::optional<uint64_t> total_bytes, std::FILE* out = stderr);
  // After each batch of documents: draws when it is time to.
  void update(int64_t documents, uint64_t bytes, int64_t tokens);
  // Ends a terminal's line with the final state.
  void finish(int64_t documents, uint64_t bytes, int64_t tokens);

 private:
  void draw(int64_t documents, uint64_t bytes, int64_t tokens, const char* end);

  std::optional<uint64_t> total_bytes_;
  std::FILE* out_;
  bool is_tty_;
  std::chrono::steady_clock::time_point started_, last_draw_;
  std::size_t last_len_ = 0;
};

}  // namespace pipetrain::cli
