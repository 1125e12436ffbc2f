// Schedule "auto" (PipeOptions::schedule): the steps a Pipe spends choosing its schedule, and the
// choice. Its first two full steps run zbh1 (its split backwards time F, I and W apart) with every
// action timed, the second's times counting; the simulator predicts each candidate's step from
// them. Candidates that fit max_in_flight and are predicted within 1% of the fastest are finalists:
// the simulation cannot tell them apart, while what it does not model (a receive's wake-up, a
// send's copy) can. Where there are several, each runs kTrialRounds full steps, in turns, timed
// whole, and the one measured fastest runs from then on (of those within 0.5% of it, the one that
// holds the fewest activations). Every step trains: the schedules compute the same gradients.
// Pure bookkeeping: the Pipe times, simulates and agrees across ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

class ScheduleChoice {
 public:
  // Tried steps per finalist.
  static constexpr int64_t kTrialRounds = 2;
  // 1f1b, zbh1, zbh2, gpipe: one stage per rank, the partition being fixed at construction.
  static const std::vector<std::string>& candidates();

  // What the simulator says of one candidate.
  struct Prediction {
    std::string schedule;
    double seconds = 0;  // its simulated step
    int64_t held = 0;    // the most micro-batches' activations a stage holds at once
    bool fits = true;    // within max_in_flight
  };

  // What the next full step runs.
  const std::string& running() const { return running_; }
  // Whether the next full step times its actions for the simulation.
  bool profiling() const { return phase_ == Phase::kProfiling; }
  bool chosen() const { return phase_ == Phase::kChosen; }

  // Counts a profiled step; true when its times are the ones to simulate with (the first step
  // warms up).
  bool count_profiled_step() { return ++profiled_steps_ >= 2; }
  // Takes the simulator's word on every candidate (in candidates()' order; at least one fits).
  // Returns what to print: each prediction, and the pick or the finalists to try.
  std::string predicted(const std::vector<Prediction>& predictions);
  // A tried step took `seconds` (the same figure on every rank). Returns what to print once the
  // choice is made, else "".
  std::string tried(double seconds);

 private:
  enum class Phase { kProfiling, kTrying, kChosen };
  Phase phase_ = Phase::kProfiling;
  std::string running_ = "zbh1";
  int64_t profiled_steps_ = 0;
  std::vector<Prediction> finalists_;
  std::vector<double> fastest_;  // per finalist, its fastest tried step
  int64_t tried_steps_ = 0;
};

}  // namespace pipetrain
