// `pipetrain plan`: profiles a model's layers on the device at hand and prints the fastest plan
// for --devices x --num-nodes devices within --device-memory (or --max-memory) per device, without
// training: how to size a job for machines one does not have. It weighs every way of making the
// devices into pipelines of equal stages (replicas of them, ZeRO stage 0 or 1), each with its
// balance, chunks, schedule and recompute mode; transfers over --link-bandwidth within a node and
// --network-bandwidth between nodes. Plans compare by the time one replica's batch takes.
#pragma once

#include <cstdint>
#include <string>

#include "pipetrain/data.h"
#include "pipetrain/module.h"

namespace pipetrain::cli {

struct PlanRequest {
  int64_t devices = 1;  // per node
  int64_t nodes = 1;
  int64_t stages = 0;  // per pipeline; 0: every count that divides devices x nodes
  double link_bandwidth = 0, network_bandwidth = 0;  // bytes per second; 0: free
  int64_t max_memory = 0;                            // bytes per device; 0: no limit
  std::string accelerator = "auto";
  std::string precision = "32-true";
  int repeats = 3;  // timed runs per layer and micro-batch size
};

// The chosen plan's table, the flags that train it, and the fastest few others, one line each.
// Throws std::invalid_argument when no plan fits, naming the smallest memory any needs, and for a
// --stages that does not divide the devices.
std::string plan_report(const Module& module, const Batch& batch, const PlanRequest& request);

// Reads the plan.json `path` (--plan FILE) as the Trainer will, so that a file it cannot read is
// refused before any rank starts. Throws std::invalid_argument naming the file.
void check_plan_file(const std::string& path);

}  // namespace pipetrain::cli
