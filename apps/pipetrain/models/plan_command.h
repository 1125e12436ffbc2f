// `pipetrain plan`: profiles a model's layers on the device at hand and prints the fastest plan
// (balance, chunks, schedule, recompute mode) over --devices x --num-nodes pipeline stages within
// --max-memory per device, without training: how to size a job for machines one does not have,
// its transfers over --link-bandwidth within a node and --network-bandwidth between nodes.
#pragma once

#include <cstdint>
#include <string>

#include "pipetrain/data.h"
#include "pipetrain/module.h"

namespace pipetrain::cli {

struct PlanRequest {
  int64_t devices = 1;  // per node: the stages are devices x nodes
  int64_t nodes = 1;
  double link_bandwidth = 0, network_bandwidth = 0;  // bytes per second; 0: free
  int64_t max_memory = 0;                            // bytes per device; 0: no limit
  std::string accelerator = "auto";
  std::string precision = "32-true";
  int repeats = 3;  // timed runs per layer and micro-batch size
};

// The chosen plan's table and the fastest few others, one line each. Throws std::invalid_argument
// when no plan fits, naming the smallest memory any needs.
std::string plan_report(const Module& module, const Batch& batch, const PlanRequest& request);

}  // namespace pipetrain::cli
