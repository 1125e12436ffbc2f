#include "models/prepare_progress.h"

#include <unistd.h>

#include "train/progress_bar.h"

namespace pipetrain::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A terminal redraws smoothly at 10 lines a second; a log file wants a line now and then.
constexpr std::chrono::milliseconds kTerminalInterval{100};
constexpr std::chrono::seconds kLogInterval{30};

std::string megabytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(bytes) / 1e6);
  return text;
}

// 1520000 -> "1.52M".
std::string count(double value) {
  char text[32];
  if (value >= 1e6) {
    std::snprintf(text, sizeof(text), "%.2fM", value / 1e6);
  } else if (value >= 1e3) {
    std::snprintf(text, sizeof(text), "%.1fk", value / 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.0f", value);
  }
  return text;
}

}  // namespace

std::string format_prepare_progress(int64_t documents, uint64_t bytes,
                                    std::optional<uint64_t> total_bytes, int64_t tokens,
                                    double seconds) {
  const double per_second = seconds > 0 ? 1 / seconds : 0;
  std::string line = "Tokenizing: " + std::to_string(documents) + " documents, " + megabytes(bytes);
  if (total_bytes) line += "/" + megabytes(*total_bytes);
  line += " MB [" + detail::format_duration(seconds);
  if (total_bytes) {
    const double left = static_cast<double>(*total_bytes) - static_cast<double>(bytes);
    line += "<" +
            detail::format_duration(bytes == 0 ? -1 : left / static_cast<double>(bytes) * seconds);
  }
  if (per_second > 0) {
    line += ", " + megabytes(static_cast<uint64_t>(static_cast<double>(bytes) * per_second)) +
            " MB/s, " + count(static_cast<double>(tokens) * per_second) + " tokens/s";
  }
  return line + "]";
}

PrepareProgress::PrepareProgress(std::optional<uint64_t> total_bytes, std::FILE* out)
    : total_bytes_(total_bytes),
      out_(out),
      is_tty_(isatty(fileno(out)) != 0),
      started_(Clock::now()),
      last_draw_(started_) {}

void PrepareProgress::update(int64_t documents, uint64_t bytes, int64_t tokens) {
  const auto interval =
      is_tty_ ? Clock::duration(kTerminalInterval) : Clock::duration(kLogInterval);
  if (Clock::now() - last_draw_ >= interval) draw(documents, bytes, tokens, is_tty_ ? "" : "\n");
}

void PrepareProgress::finish(int64_t documents, uint64_t bytes, int64_t tokens) {
  if (is_tty_) draw(documents, bytes, tokens, "\n");
}

void PrepareProgress::draw(int64_t documents, uint64_t bytes, int64_t tokens, const char* end) {
  const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  std::string line = format_prepare_progress(documents, bytes, total_bytes_, tokens, seconds);
  if (is_tty_) {
    // A shorter line leaves the tail of the previous one on screen unless it is blanked.
    const std::size_t length = line.size();
    if (length < last_len_) line += std::string(last_len_ - length, ' ');
    line = "\r" + line;
    last_len_ = length;
  }
  line += end;
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
  last_draw_ = Clock::now();
}

}  // namespace pipetrain::cli
