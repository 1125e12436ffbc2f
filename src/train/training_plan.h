// The planner: from each layer's measured costs (layer_profile.h), the fastest way to train the
// model over a number of pipeline ranks within a memory limit per device. It weighs every
// schedule of one stage per rank, number of micro-batches (chunks) and recompute mode, each with
// the balance that makes its slowest stage fastest within the limit, and predicts for each plan
// the step time (the schedule's simulation, simulate_plan, over the stages' summed layer times,
// then the slowest rank's optimizer step) and each rank's peak memory (its weights, gradients and
// optimizer state, plus the activations its schedule holds at once, peak_activation_bytes).
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
  int64_t batch_rows = 1;  // the batch one pipeline trains per step
  int64_t max_memory = 0;  // bytes per rank; 0: no limit
  // Optimizer state kept per byte of trainable parameters: AdamW's two moments.
  double optimizer_state_per_parameter_byte = 2;
  std::vector<std::string> schedules{"gpipe", "1f1b", "zbh1", "zbh2"};
  double transfer_seconds = 0;  // from a send between ranks to its tensors' arrival
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
// measured on a micro-batch of batch_rows / chunks rows), schedule and recompute mode, the balance
// whose slowest stage is fastest among those whose predicted memory fits max_memory, or where none
// does, the balance needing least memory. Throws std::invalid_argument for fewer layers than ranks.
std::vector<TrainingPlan> weigh_plans(const std::map<int64_t, LayerProfile>& profiles,
                                      const PlannerOptions& options);

// The fastest of `plans` (weigh_plans's) whose every rank fits `max_memory` (0: any); among plans
// within 1% of it, the one needing least memory. Throws std::invalid_argument when none fits,
// naming the smallest memory a plan needs and that plan.
TrainingPlan choose_plan(const std::vector<TrainingPlan>& plans, int64_t max_memory);

// One row per stage: its layers, predicted time per micro-batch, predicted peak memory; then the
// predicted step.
std::string plan_table(const TrainingPlan& plan);

}  // namespace pipetrain
