// The planner: from each layer's measured costs (layer_profile.h), the fastest way to train the
// model over a number of pipeline ranks within a memory limit per device. It weighs every
// schedule of one stage per rank, number of micro-batches (chunks) and recompute mode, each with
// the balance that makes its slowest stage fastest within the limit (less a margin), and predicts
// for each plan the step time (the schedule's simulation, simulate_plan, over the stages' summed
// layer times, then the slowest rank's optimizer step) and each rank's peak memory (its weights,
// gradients and optimizer state, plus the activations its schedule holds at once,
// peak_activation_bytes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pipeline/recompute.h"
#include "train/layer_profile.h"

namespace pipetrain {

struct PlannerOptions {
  int64_t ranks = 1;       // pipeline stages, one per rank
  int64_t max_memory = 0;  // bytes per rank; 0: no limit
  // The share of max_memory plans leave free for what the prediction misses (the loss's own
  // temporaries, the allocator's rounding): measured predictions were within 10% on CPU.
  double memory_margin = 0.1;
  // Optimizer state kept per byte of trainable parameters: AdamW's two moments.
  double optimizer_state_per_parameter_byte = 2;
  std::vector<std::string> schedules{"gpipe", "1f1b", "zbh1", "zbh2"};
  // Communication: a micro-batch's activations (and, backwards, their gradients) cross from one
  // stage's rank to the next at this many bytes per second, over the network where the two ranks
  // are on different nodes (ranks r and r + 1 of ranks_per_node each; 0: one node). The schedule's
  // simulation takes the slowest boundary's time for every transfer; 0 bandwidth: free.
  double link_bytes_per_second = 0;
  double network_bytes_per_second = 0;
  int64_t ranks_per_node = 0;
};

struct TrainingPlan {
  std::vector<int64_t> balance;  // layers per stage
  int64_t chunks = 1;
  std::string schedule;
  CheckpointMode checkpoint = CheckpointMode::kNever;
  double step_seconds = 0;                // predicted
  std::vector<int64_t> peak_bytes;        // predicted, per rank
  std::vector<double> stage_seconds;      // one micro-batch's forward and backward, per stage
  std::vector<double> optimizer_seconds;  // the optimizer's step, per stage
  std::vector<int64_t> static_bytes;      // weights, gradients and optimizer state, per rank
  int64_t max_peak_bytes() const;
  // "balance 3,4 chunks 4 schedule 1f1b checkpoint never"
  std::string describe() const;
};

// Every plan weighed, fastest first: for each chunks of `profiles` (profiles[chunks]: the layers
// measured on a micro-batch of 1 / chunks of the batch), schedule and recompute mode, the balance
// whose slowest stage is fastest among those whose predicted memory fits max_memory, or where none
// does, the balance needing least memory. Throws std::invalid_argument for fewer layers than ranks.
std::vector<TrainingPlan> weigh_plans(const std::map<int64_t, LayerProfile>& profiles,
                                      const PlannerOptions& options);

// What a plan may predict per rank: max_memory less the margin; 0 without a limit.
int64_t usable_bytes(const PlannerOptions& options);

// The fastest of `plans` (weigh_plans's) whose every rank fits usable_bytes(options); among plans
// within 1% of it, the one needing least memory. Throws std::invalid_argument when none fits,
// naming the smallest memory a plan needs, that plan, and the limit that would take it.
TrainingPlan choose_plan(const std::vector<TrainingPlan>& plans, const PlannerOptions& options);

// One row per stage: its layers, predicted time per micro-batch, predicted peak memory; then the
// predicted step.
std::string plan_table(const TrainingPlan& plan);

// The plan as plan.json holds it, and back. plan_from_json throws std::invalid_argument naming
// `source` and what is missing or malformed.
std::string plan_to_json(const TrainingPlan& plan);
TrainingPlan plan_from_json(const std::string& text, const std::string& source);

}  // namespace pipetrain
