// The progress bar writes to a tmpfile() here, so both of its modes are checked byte for byte: a
// terminal gets '\r'-redrawn lines and one newline per bar, a log file gets only plain lines.
#include "train/progress_bar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

namespace pipetrain::progress_bar_test {
namespace {

// Everything written to `file` so far.
std::string contents(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  return text;
}

// Owns a tmpfile() so that a failing assertion does not leak it.
class TempFile {
 public:
  TempFile() : file_(std::tmpfile()) {}
  ~TempFile() {
    if (file_) std::fclose(file_);
  }
  std::FILE* get() const { return file_; }

 private:
  std::FILE* file_;
};

// A clock that moves only when told, so that elapsed times are known exactly.
class ManualClock {
 public:
  void advance(double seconds) {
    now_ += std::chrono::duration_cast<ProgressBar::Clock::duration>(
        std::chrono::duration<double>(seconds));
  }
  std::function<ProgressBar::Clock::time_point()> reader() const {
    return [this] { return now_; };
  }

 private:
  ProgressBar::Clock::time_point now_{};
};

size_t count(const std::string& text, char c) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), c));
}

// `format` turns each number of `cases` into its text.
void expect_formats(std::string (*format)(double),
                    std::initializer_list<std::pair<double, const char*>> cases) {
  for (const auto& [value, text] : cases) EXPECT_EQ(format(value), text) << "formatting " << value;
}

TEST(FormatDuration, MinutesAndSecondsUnderAnHour) {
  expect_formats(detail::format_duration,
                 {{0, "00:00"}, {3.9, "00:03"}, {61, "01:01"}, {3599.5, "59:59"}});
}

TEST(FormatDuration, HoursFromAnHour) {
  expect_formats(detail::format_duration,
                 {{3600, "1:00:00"}, {3661, "1:01:01"}, {36000 + 62, "10:01:02"}});
}

TEST(FormatDuration, UnknownIsQuestionMark) {
  expect_formats(detail::format_duration,
                 {{-1, "?"}, {std::nan(""), "?"}, {std::numeric_limits<double>::infinity(), "?"}});
}

TEST(FormatRate, IterationsPerSecondOrSecondsPerIteration) {
  expect_formats(detail::format_rate, {{14.2, "14.20it/s"},
                                       {1.0, "1.00it/s"},
                                       {0.4, "2.50s/it"},
                                       {0, "?it/s"},
                                       {std::nan(""), "?it/s"},
                                       {std::numeric_limits<double>::infinity(), "?it/s"}});
}

TEST(FormatMetric, FourSignificantDigits) {
  expect_formats(detail::format_metric, {{0.512, "0.512"},
                                         {0.5123456, "0.5123"},
                                         {1234567, "1.235e+06"},
                                         {2, "2"},
                                         {std::nan(""), "nan"}});
}

TEST(FormatProgress, ElapsedEtaRateThenMetrics) {
  // 45 batches in 3 s: 15 it/s, 19 left: 1.27 s.
  EXPECT_EQ(
      detail::format_progress("Epoch 3", 45, 64, 3.0, {{"train_loss", 0.512}, {"val_loss", 0.61}}),
      "Epoch 3: 45/64 [00:03<00:01, 15.00it/s, train_loss=0.512, val_loss=0.61]");
}

TEST(FormatProgress, NothingDoneYetHasNoRateOrEta) {
  EXPECT_EQ(detail::format_progress("Epoch 0", 0, 64, 0.0, {}), "Epoch 0: 0/64 [00:00<?, ?it/s]");
}

TEST(FormatProgress, UnknownTotalHasNoEta) {
  EXPECT_EQ(detail::format_progress("Validation", 5, -1, 2.0, {}),
            "Validation: 5 [00:02, 2.50it/s]");
}

TEST(FormatProgress, RateLeavesOutBatchesDoneBeforeAResume) {
  // Resumed at batch 40: 5 batches in 2 s, 2.5 it/s; 24 left: 9.6 s.
  EXPECT_EQ(detail::format_progress("Epoch 1", 45, 69, 2.0, {}, 40),
            "Epoch 1: 45/69 [00:02<00:09, 2.50it/s]");
}

TEST(FitWidth, KeepsTheLastColumnFree) {
  EXPECT_EQ(detail::fit_width("abcdef", 4), "abc");
  EXPECT_EQ(detail::fit_width("abc", 4), "abc");
  EXPECT_EQ(detail::fit_width("abcdef", 0), "abcdef");
}

TEST(ProgressBar, TtyRedrawsOneLineAndEndsItWithANewline) {
  TempFile file;
  ProgressBar bar(/*is_tty=*/true, file.get());
  bar.start("Epoch 0", 3);
  for (int64_t done = 1; done <= 3; ++done) bar.update(done, {{"train_loss", 0.5}});
  bar.finish();
  const std::string text = contents(file.get());

  EXPECT_EQ(text.rfind("\rEpoch 0: 0/3 [", 0), 0u) << text;  // drawn at start
  EXPECT_NE(text.find("\rEpoch 0: 3/3 ["), std::string::npos) << text;
  EXPECT_NE(text.find("train_loss=0.5]"), std::string::npos) << text;
  EXPECT_EQ(count(text, '\n'), 1u) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(ProgressBar, TtyLimitsRedrawsButAlwaysDrawsTheLastBatch) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Epoch 0", 1000);
  for (int64_t done = 1; done <= 1000; ++done) bar.update(done, {});
  const std::string text = contents(file.get());

  // About ten a second: a loop of 1000 fast updates draws a handful of times, not 1000.
  EXPECT_LT(count(text, '\r'), 100u) << text;
  EXPECT_NE(text.find("\rEpoch 0: 1000/1000 ["), std::string::npos) << text;
  EXPECT_EQ(count(text, '\n'), 0u);
}

TEST(ProgressBar, TtyFinishShowsAnUpdateTheLimitSkipped) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Epoch 0", 100);
  bar.update(7, {});  // within 0.1 s of start: not drawn yet
  bar.finish();
  const std::string text = contents(file.get());
  EXPECT_NE(text.find("\rEpoch 0: 7/100 ["), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(ProgressBar, TtyBlanksTheTailOfALongerPreviousLine) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Epoch 0", 2);
  bar.update(2, {{"a_very_long_metric_name", 1.0}});  // the last batch is always drawn
  const size_t long_length = contents(file.get()).size() - contents(file.get()).rfind('\r') - 1;
  bar.update(2, {});
  const std::string text = contents(file.get());
  const std::string redraw = text.substr(text.rfind('\r') + 1);
  const size_t short_length = redraw.find(']') + 1;
  ASSERT_LT(short_length, long_length) << text;
  EXPECT_EQ(redraw.size(), long_length) << text;
  EXPECT_EQ(redraw.find_first_not_of(' ', short_length), std::string::npos) << text;
}

TEST(ProgressBar, TtyStartEndsABarStillOpen) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Epoch 0", 2);
  bar.update(2, {{"train_loss", 1.0}});
  bar.start("Validation", 2);
  bar.finish();
  const std::string text = contents(file.get());
  EXPECT_EQ(count(text, '\n'), 2u) << text;
  EXPECT_NE(text.find("train_loss=1]\n\rValidation: 0/2 ["), std::string::npos) << text;
}

TEST(ProgressBar, TtyPrintClearsTheLinePrintsAndRedraws) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Epoch 1", 4);
  bar.update(4, {});
  bar.print("Metric val_loss improved.");
  bar.finish();
  const std::string text = contents(file.get());

  const std::string bar_line = "Epoch 1: 4/4 [";
  ASSERT_NE(text.find("\r" + bar_line), std::string::npos) << text;
  // The bar's characters are overwritten with spaces before the message.
  const size_t message = text.find("\rMetric val_loss improved.\n");
  ASSERT_NE(message, std::string::npos) << text;
  const size_t blank = text.rfind('\r', message - 1);
  ASSERT_NE(blank, std::string::npos);
  EXPECT_EQ(text.substr(blank + 1, message - blank - 1).find_first_not_of(' '), std::string::npos);
  EXPECT_GE(message - blank - 1, bar_line.size());
  // And the bar comes back below the message, then ends.
  EXPECT_NE(text.find("\n\r" + bar_line, message), std::string::npos) << text;
  EXPECT_EQ(count(text, '\n'), 2u) << text;
}

TEST(ProgressBar, TtyLogLineIsANoOp) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Epoch 0", 4);
  const std::string before = contents(file.get());
  bar.log_line(2, {{"train_loss", 0.5}});
  EXPECT_EQ(contents(file.get()), before);
}

TEST(ProgressBar, PlainOutputHasOnlyLogLines) {
  TempFile file;
  ProgressBar bar(/*is_tty=*/false, file.get());
  bar.start("Epoch 2", 4);
  bar.update(1, {{"train_loss", 0.9}});
  bar.update(2, {{"train_loss", 0.8}});
  bar.log_line(2, {{"train_loss", 0.8}});
  bar.update(3, {{"train_loss", 0.7}});
  bar.update(4, {{"train_loss", 0.6}});
  bar.log_line(4, {{"train_loss", 0.6}});
  bar.finish();
  const std::string text = contents(file.get());

  EXPECT_EQ(count(text, '\r'), 0u) << text;
  EXPECT_EQ(count(text, '\n'), 2u) << text;
  const size_t second_line = text.find('\n') + 1;
  EXPECT_EQ(text.rfind("Epoch 2: 2/4 [", 0), 0u) << text;
  EXPECT_NE(text.find(", train_loss=0.8]\n"), std::string::npos) << text;
  EXPECT_EQ(text.compare(second_line, 14, "Epoch 2: 4/4 ["), 0) << text;
  EXPECT_NE(text.find(", train_loss=0.6]\n"), std::string::npos) << text;
}

// A validation inside an epoch shows a bar of its own; the epoch's bar then goes on with the
// epoch's elapsed time (5 s of training, 3 of validation, 2 more of training: 10 s for 6 batches),
// not a clock restarted after the validation.
TEST(ProgressBar, EpochElapsedTimeGoesOnAcrossAValidationInsideIt) {
  TempFile file;
  ManualClock clock;
  ProgressBar bar(/*is_tty=*/false, file.get(), clock.reader());
  bar.start("Epoch 0", 10);
  clock.advance(5);
  bar.log_line(4, {});
  bar.start("Validation", 2);
  clock.advance(3);
  bar.log_line(2, {});
  bar.finish();
  bar.resume(4, {});
  clock.advance(2);
  bar.log_line(6, {});
  bar.finish();
  EXPECT_EQ(contents(file.get()),
            "Epoch 0: 4/10 [00:05<00:07, 1.25s/it]\n"
            "Validation: 2/2 [00:03<00:00, 1.50s/it]\n"
            "Epoch 0: 6/10 [00:10<00:06, 1.67s/it]\n");
}

TEST(ProgressBar, TtyResumeRedrawsTheEpochsBarWithItsElapsedTime) {
  TempFile file;
  ManualClock clock;
  ProgressBar bar(/*is_tty=*/true, file.get(), clock.reader());
  bar.start("Epoch 0", 10, /*initial=*/2);
  clock.advance(4);
  bar.update(4, {});
  bar.start("Validation", 2);
  clock.advance(4);
  bar.update(2, {});
  bar.finish();
  bar.resume(4, {{"train_loss", 0.5}});
  const std::string text = contents(file.get());
  // 2 batches since the resumed epoch's first, in 8 s.
  EXPECT_NE(text.find("\n\rEpoch 0: 4/10 [00:08<00:24, 4.00s/it, train_loss=0.5]"),
            std::string::npos)
      << text;
  bar.finish();
  EXPECT_EQ(contents(file.get()).back(), '\n');
}

TEST(ProgressBar, ResumeWithoutAnInterruptedBarDoesNothing) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.start("Validation", 2);
  bar.finish();
  const std::string before = contents(file.get());
  bar.resume(1, {});
  EXPECT_EQ(contents(file.get()), before);
}

TEST(ProgressBar, PlainPrintIsJustTheMessage) {
  TempFile file;
  ProgressBar bar(false, file.get());
  bar.start("Epoch 0", 4);
  bar.print("hello");
  bar.finish();
  EXPECT_EQ(contents(file.get()), "hello\n");
}

TEST(ProgressBar, PrintWithoutABarIsJustTheMessage) {
  TempFile file;
  ProgressBar bar(true, file.get());
  bar.print("before any bar");
  EXPECT_EQ(contents(file.get()), "before any bar\n");
}

}  // namespace
}  // namespace pipetrain::progress_bar_test
