// Progress display for rank 0. Formatting is kept in pure functions (detail::) so that the text is
// tested without a terminal; the class only decides when to draw and where the cursor is.
#include "train/progress_bar.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <utility>

namespace pipetrain {
namespace detail {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  // Beyond this an int64 overflows; nobody waits that long for a bar.
  if (seconds > 1e15) return "?";
  const auto total = static_cast<int64_t>(seconds);
  const int64_t hours = total / 3600;
  const int64_t minutes = (total % 3600) / 60;
  const int64_t secs = total % 60;
  char buffer[48];
  if (hours > 0) {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld:%02lld", static_cast<long long>(hours),
                  static_cast<long long>(minutes), static_cast<long long>(secs));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%02lld:%02lld", static_cast<long long>(minutes),
                  static_cast<long long>(secs));
  }
  return buffer;
}

std::string format_rate(double per_second) {
  if (!std::isfinite(per_second) || per_second <= 0) return "?it/s";
  char buffer[48];
  // Slow steps (large pipelines) read better as seconds per batch, as tqdm shows them.
  if (per_second < 1) {
    std::snprintf(buffer, sizeof(buffer), "%.2fs/it", 1.0 / per_second);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2fit/s", per_second);
  }
  return buffer;
}

std::string format_metric(double value) {
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

std::string format_progress(const std::string& description, int64_t done, int64_t total,
                            double elapsed_seconds, const std::map<std::string, double>& metrics,
                            int64_t initial) {
  const int64_t counted = done - initial;
  const double rate = (elapsed_seconds > 0 && counted > 0)
                          ? static_cast<double>(counted) / elapsed_seconds
                          : std::nan("");
  std::string line = description + ": " + std::to_string(done);
  if (total >= 0) line += "/" + std::to_string(total);
  line += " [" + format_duration(elapsed_seconds);
  if (total >= 0) {
    const double remaining = static_cast<double>(total - done);
    line += "<" + format_duration(remaining <= 0 ? 0.0 : remaining / rate);
  }
  line += ", " + format_rate(rate);
  for (const auto& [name, value] : metrics) line += ", " + name + "=" + format_metric(value);
  line += "]";
  return line;
}

std::string fit_width(const std::string& line, std::size_t width) {
  if (width == 0 || line.size() < width) return line;
  return line.substr(0, width - 1);
}

}  // namespace detail

namespace {

// Columns of the terminal behind `out`; 0 when it is not one (or will not say).
std::size_t terminal_width(std::FILE* out) {
  winsize size{};
  if (ioctl(fileno(out), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 0;
}

// A terminal redraw costs a write syscall and the terminal's time; 10 a second looks smooth.
constexpr std::chrono::milliseconds kRedrawInterval{100};

}  // namespace

ProgressBar::ProgressBar(bool is_tty, std::FILE* out, std::function<Clock::time_point()> now)
    : is_tty_(is_tty), out_(out), now_(std::move(now)) {
  if (is_tty_) width_ = terminal_width(out_);
}

bool ProgressBar::stdout_is_tty() { return isatty(fileno(stdout)) != 0; }

void ProgressBar::start(const std::string& description, int64_t total, int64_t initial) {
  interrupted_.reset();
  if (active_) {
    interrupted_ = bar_;
    finish();
  }
  bar_ = {description, total, initial, now_()};
  done_ = initial;
  metrics_.clear();
  active_ = true;
  last_len_ = 0;
  if (is_tty_) draw();
}

void ProgressBar::resume(int64_t done, const std::map<std::string, double>& metrics) {
  if (!interrupted_) return;
  if (active_) finish();
  bar_ = *std::exchange(interrupted_, std::nullopt);
  done_ = done;
  metrics_ = metrics;
  active_ = true;
  last_len_ = 0;
  if (is_tty_) draw();
}

void ProgressBar::update(int64_t done, const std::map<std::string, double>& metrics) {
  if (!is_tty_ || !active_) return;
  done_ = done;
  metrics_ = metrics;
  dirty_ = true;
  const bool last = bar_.total >= 0 && done >= bar_.total;
  if (last || now_() - last_draw_ >= kRedrawInterval) draw();
}

void ProgressBar::log_line(int64_t done, const std::map<std::string, double>& metrics) {
  if (is_tty_) return;
  write(render(done, metrics) + "\n");
}

void ProgressBar::finish() {
  if (!active_) return;
  if (is_tty_) {
    // Updates skipped by the redraw limit (or a bar stopped early) still show their last state.
    if (dirty_) draw();
    write("\n");
  }
  active_ = false;
  dirty_ = false;
  last_len_ = 0;
}

void ProgressBar::print(const std::string& message) {
  if (!is_tty_ || !active_) {
    write(message + "\n");
    return;
  }
  // Blank the bar, put the message where it was, and draw the bar again below it.
  write("\r" + std::string(last_len_, ' ') + "\r" + message + "\n");
  last_len_ = 0;
  draw();
}

std::string ProgressBar::render(int64_t done, const std::map<std::string, double>& metrics) const {
  const double elapsed = std::chrono::duration<double>(now_() - bar_.started).count();
  return detail::format_progress(bar_.description, done, bar_.total, elapsed, metrics,
                                 bar_.initial);
}

void ProgressBar::draw() {
  const std::string line = detail::fit_width(render(done_, metrics_), width_);
  std::string text = "\r" + line;
  // A shorter line leaves the tail of the previous one on screen unless it is blanked.
  if (line.size() < last_len_) text += std::string(last_len_ - line.size(), ' ');
  write(text);
  last_len_ = line.size();
  last_draw_ = now_();
  dirty_ = false;
}

void ProgressBar::write(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

}  // namespace pipetrain
