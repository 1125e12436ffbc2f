// The Trainer's progress display, as Lightning's TQDMProgressBar: on a terminal, one line redrawn
// in place ("Epoch 3: 45/64 [00:03<00:01, 14.20it/s, train_loss=0.512]"); in a log file or a pipe,
// where carriage returns pile up into unreadable lines, one plain line per logging interval
// instead. Debian packages no C++ progress bar, and this one needs neither torch nor a thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace pipetrain {

// Pure formatting, exposed so tests can pin the text without clocks or terminals.
namespace detail {

// Elapsed or remaining time as tqdm writes it: "MM:SS", "H:MM:SS" from an hour; "?" when unknown
// (negative, NaN or infinite). Seconds are truncated, not rounded.
std::string format_duration(double seconds);
// Batches per second: "14.20it/s", or "2.50s/it" when slower than one a second; "?it/s" when
// unknown (zero, negative, NaN or infinite).
std::string format_rate(double per_second);
// A metric value with 4 significant digits (%.4g): 0.5123, 1.235e+06, nan.
std::string format_metric(double value);
// The whole line: "Epoch 3: 45/64 [00:03<00:01, 14.20it/s, train_loss=0.512]". `total` < 0
// (unknown) drops the total and the ETA: "Validation: 5 [00:02, 2.50it/s]". The rate counts the
// batches done since `initial` (the batch a resumed epoch started from).
std::string format_progress(const std::string& description, int64_t done, int64_t total,
                            double elapsed_seconds, const std::map<std::string, double>& metrics,
                            int64_t initial = 0);
// `line` cut to `width` - 1 characters (a line filling the last column makes terminals wrap, and
// a wrapped line cannot be redrawn with '\r'); `width` 0 leaves it whole.
std::string fit_width(const std::string& line, std::size_t width);

}  // namespace detail

class ProgressBar {
 public:
  using Clock = std::chrono::steady_clock;
  // `out` defaults to stdout; is_tty decides between one redrawn line and plain lines; `now` is
  // the clock elapsed times are read from.
  explicit ProgressBar(bool is_tty, std::FILE* out = stdout,
                       std::function<Clock::time_point()> now = Clock::now);
  static bool stdout_is_tty();

  // A new bar: "Epoch 3" / "Validation" / "Testing" / "Predicting" and the number of batches
  // (-1: unknown). `initial`: batches already done (a resumed epoch), left out of the rate. It
  // ends a bar still open (resume() brings that one back) and, on a TTY, draws the new one at once.
  void start(const std::string& description, int64_t total, int64_t initial = 0);
  // Opens again, at `done` batches, the bar the last start() ended while it was open (an epoch's,
  // after a validation inside it) and draws it on a TTY; its elapsed time and rate still count
  // from its own start, so they are the epoch's. Nothing when start() ended none.
  void resume(int64_t done, const std::map<std::string, double>& metrics);
  // After each batch. TTY: redraws the line, at most ~10 times a second and always on the last
  // batch. Not a TTY: nothing (see log_line).
  void update(int64_t done, const std::map<std::string, double>& metrics);
  // Not a TTY: one plain line with the same content (called each logging interval). TTY: no-op.
  void log_line(int64_t done, const std::map<std::string, double>& metrics);
  // Ends the bar: a TTY line shows its latest state and gets its newline.
  void finish();
  // Prints `message` on its own line without tearing the bar (clear the line, print, redraw).
  void print(const std::string& message);

 private:
  // What a bar counts from.
  struct Bar {
    std::string description;
    int64_t total = -1;
    int64_t initial = 0;
    Clock::time_point started;
  };
  std::string render(int64_t done, const std::map<std::string, double>& metrics) const;
  void draw();
  void write(const std::string& text);

  bool is_tty_;
  std::FILE* out_;
  std::function<Clock::time_point()> now_;
  std::size_t width_ = 0;  // terminal columns; 0: unknown, no cut
  Bar bar_;
  std::optional<Bar> interrupted_;  // the bar the last start() ended while it was open
  int64_t done_ = 0;
  std::map<std::string, double> metrics_;
  Clock::time_point last_draw_;
  bool active_ = false;       // between start() and finish()
  bool dirty_ = false;        // updated since the last draw
  std::size_t last_len_ = 0;  // length of the line on screen, to blank what a shorter one leaves
};

}  // namespace pipetrain
