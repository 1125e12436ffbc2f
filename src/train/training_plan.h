// The planner: from each layer's measured costs (layer_profile.h), the fastest way to train the
// model over a number of pipeline stages (and data-parallel replicas of that pipeline) within a
// memory limit per device. It weighs every schedule (interleaved1f1b and zbv with two stages per
// rank), number of micro-batches (chunks), recompute mode and, with replicas, ZeRO stage, each with
// the balance that makes its slowest stage fastest within the limit (less a margin), and predicts
// for each plan the step time and each rank's peak memory (its weights, gradients and optimizer
// state, plus the activations its schedule holds at once, peak_activation_bytes).
//
// The step, as predicted: the schedule's simulation (simulate_plan) over the stages' summed layer
// times, each micro-batch's activations crossing a boundary in bytes / bandwidth; then, with
// replicas, each stage's gradient all-reduce among its replicas (a ring: 2 (R-1)/R of the
// gradients' bytes over the slowest link the group spans), started when its rank's last backward
// ends; then, once every rank is there (clipping takes the global norm), the slowest rank's
// optimizer step (under ZeRO 1, its share: 1/R of the stage's, followed by the parameters'
// exchange, (R-1)/R of their bytes). Latency and links shared by several transfers are not
// modelled.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pipeline/recompute.h"
#include "train/layer_profile.h"

namespace pipetrain {

struct PlannerOptions {
  int64_t stages = 1;    // pipeline stages, one per rank
  int64_t replicas = 1;  // copies of the pipeline; rank replica x stages + stage holds a stage
  // ZeRO stages weighed where there are replicas (TrainerOptions::zero_stage).
  std::vector<int64_t> zero_stages{0, 1};
  int64_t max_memory = 0;  // bytes per rank; 0: no limit
  // What a plan keeps free on top of its predicted activations, as a share of them, for what the
  // prediction misses (the loss's own temporaries, the allocator's rounding); weights, gradients
  // and optimizer state are counted exactly. Measured predictions of the whole were within 4% on
  // CPU and 4-7% over on one GPU.
  double memory_margin = 0.1;
  // Optimizer state kept per byte of trainable parameters: AdamW's two moments.
  double optimizer_state_per_parameter_byte = 2;
  // Weighed with one stage per rank, interleaved1f1b and zbv with two (planned_virtual_stages).
  std::vector<std::string> schedules{"gpipe", "1f1b", "zbh1", "zbh2", "interleaved1f1b", "zbv"};
  // Communication: bytes per second one way between two ranks of a node (link) and of different
  // nodes (network); ranks_per_node consecutive ranks make a node (0: one node). A micro-batch's
  // activations (and, backwards, their gradients) cross from one stage's rank to the next; the
  // schedule's simulation takes the slowest boundary's time for every transfer. 0 bandwidth: free.
  double link_bytes_per_second = 0;
  double network_bytes_per_second = 0;
  int64_t ranks_per_node = 0;
  // CPU ranks: the cores a node's ranks share, and the threads each computes with (0 cores: each
  // rank computes on a device of its own). Where a node's ranks run more threads than it has
  // cores they take turns: a step's forwards and backwards last at least the node's compute
  // (every rank's, replicas' too) x threads / cores, however the schedule overlaps them.
  int64_t cores_per_node = 0;
  int64_t threads_per_rank = 1;
};

struct TrainingPlan {
  std::vector<int64_t> balance;  // layers per stage: ranks x virtual_stages of them
  int64_t chunks = 1;
  std::string schedule;
  int64_t virtual_stages = 1;  // stages per rank
  CheckpointMode checkpoint = CheckpointMode::kNever;
  int64_t replicas = 1;
  int64_t zero_stage = 0;
  double step_seconds = 0;                // predicted
  double pipeline_seconds = 0;            // of it, the forwards and backwards (the schedule's)
  std::vector<int64_t> peak_bytes;        // predicted, per rank of a pipeline
  std::vector<double> stage_seconds;      // one micro-batch's forward and backward, per stage
  std::vector<double> optimizer_seconds;  // the optimizer's step over the rank's parameters
  std::vector<int64_t> static_bytes;      // weights, gradients and optimizer state, per rank
  int64_t max_peak_bytes() const;
  // The step over the replicas: the time one replica's batch takes, by which plans of different
  // replica counts compare (each replica reads batch_size rows).
  double seconds_per_batch() const { return step_seconds / static_cast<double>(replicas); }
  // "balance 3,4 chunks 4 schedule 1f1b checkpoint never" (" virtual_stages 2" after the
  // schedule where it has them), then " replicas 2 zero_stage 1" with replicas.
  std::string describe() const;
};

// Every plan weighed, fastest first (seconds_per_batch): for each chunks of `profiles`
// (profiles[chunks]: the layers measured on a micro-batch of 1 / chunks of a replica's batch),
// schedule, recompute mode and ZeRO stage, the balance whose slowest stage is fastest among those
// whose predicted memory fits max_memory, or where none does, the balance needing least memory.
// Throws std::invalid_argument for fewer layers than stages.
std::vector<TrainingPlan> weigh_plans(const std::map<int64_t, LayerProfile>& profiles,
                                      const PlannerOptions& options);

// The stages per rank the planner weighs `schedule` with: 2 for interleaved1f1b and zbv, else 1.
int64_t planned_virtual_stages(const std::string& schedule);

// The limit a plan needs per device: on its largest rank, the weights, gradients and optimizer
// state plus the predicted activations and the margin on them.
int64_t bytes_needed(const TrainingPlan& plan, const PlannerOptions& options);

// Whether `plan` fits options.max_memory (bytes_needed within it; always without a limit).
bool fits(const TrainingPlan& plan, const PlannerOptions& options);

// The fastest of `plans` (weigh_plans's; by seconds_per_batch) that fits; among plans within 1% of
// it, the one needing least memory. Throws
// std::invalid_argument when none fits, naming the smallest memory a plan needs, that plan, and the
// limit that would take it.
TrainingPlan choose_plan(const std::vector<TrainingPlan>& plans, const PlannerOptions& options);

// One row per stage: its layers, predicted time per micro-batch, predicted peak memory; then the
// predicted step.
std::string plan_table(const TrainingPlan& plan);

// The plan as plan.json holds it, and back. plan_from_json throws std::invalid_argument naming
// `source` and what is missing or malformed.
std::string plan_to_json(const TrainingPlan& plan);
TrainingPlan plan_from_json(const std::string& text, const std::string& source);

}  // namespace pipetrain
