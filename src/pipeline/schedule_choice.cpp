#include "schedule_choice.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace pipetrain {
namespace {

// Predicted within this share of the fastest: too close for the simulation to call.
constexpr double kPredictedTie = 0.01;
// Measured within this share of the fastest: the one holding fewer activations is as good.
constexpr double kMeasuredTie = 0.005;

}  // namespace

const std::vector<std::string>& ScheduleChoice::candidates() {
  static const std::vector<std::string> names = {"1f1b", "zbh1", "zbh2", "gpipe"};
  return names;
}

std::string ScheduleChoice::predicted(const std::vector<Prediction>& predictions) {
  if (phase_ != Phase::kProfiling) throw std::logic_error("schedule auto predicted twice");
  double fastest = 0;
  for (const Prediction& p : predictions) {
    if (p.fits && (fastest == 0 || p.seconds < fastest)) fastest = p.seconds;
  }
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "predicted step:";
  for (const Prediction& p : predictions) {
    line << " " << p.schedule << " " << 1e3 * p.seconds << " ms (holds " << p.held
         << (p.fits ? "" : ", too many") << ")";
    if (p.fits && p.seconds <= (1 + kPredictedTie) * fastest) finalists_.push_back(p);
  }
  if (finalists_.empty()) throw std::logic_error("schedule auto: no candidate fits");
  running_ = finalists_.front().schedule;
  if (finalists_.size() == 1) {
    phase_ = Phase::kChosen;
    line << "; running " << running_;
    return line.str();
  }
  phase_ = Phase::kTrying;
  fastest_.assign(finalists_.size(), 0.0);
  line << "; within " << 100 * kPredictedTie << "% of each other, so timing " << kTrialRounds
       << " steps of each:";
  for (const Prediction& p : finalists_) line << " " << p.schedule;
  return line.str();
}

std::string ScheduleChoice::tried(double seconds) {
  if (phase_ != Phase::kTrying) throw std::logic_error("schedule auto: no step to try");
  const auto count = static_cast<int64_t>(finalists_.size());
  double& fastest = fastest_[static_cast<size_t>(tried_steps_ % count)];
  fastest = fastest == 0 ? seconds : std::min(fastest, seconds);
  if (++tried_steps_ < kTrialRounds * count) {
    running_ = finalists_[static_cast<size_t>(tried_steps_ % count)].schedule;
    return "";
  }
  const double best = *std::min_element(fastest_.begin(), fastest_.end());
  size_t pick = finalists_.size();
  for (size_t i = 0; i < finalists_.size(); ++i) {
    if (fastest_[i] <= (1 + kMeasuredTie) * best &&
        (pick == finalists_.size() || finalists_[i].held < finalists_[pick].held)) {
      pick = i;
    }
  }
  running_ = finalists_[pick].schedule;
  phase_ = Phase::kChosen;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "measured step (fastest of " << kTrialRounds
       << "):";
  for (size_t i = 0; i < finalists_.size(); ++i) {
    line << " " << finalists_[i].schedule << " " << 1e3 * fastest_[i] << " ms";
  }
  line << "; running " << running_;
  return line.str();
}

}  // namespace pipetrain
