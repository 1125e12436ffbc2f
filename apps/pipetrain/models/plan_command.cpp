#include "plan_command.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "train/layer_profile.h"
#include "train/training_plan.h"

namespace pipetrain::cli {

std::string plan_report(const Module& module, const Batch& batch, const PlanRequest& request) {
  const bool cuda = request.accelerator == "cuda" ||
                    (request.accelerator == "auto" && torch::cuda::is_available());
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  // CPU ranks share the machine: the launcher gives each cores / ranks threads
  // (OMP_NUM_THREADS), so the layers are timed with as many.
  if (!cuda && std::getenv("OMP_NUM_THREADS") == nullptr) {
    at::set_num_threads(
        std::max<int>(1, at::get_num_threads() / static_cast<int>(request.devices)));
  }
  const int64_t rows = batch.data.size(0);
  const auto profiles =
      profile_module(module, batch.data, device, request.precision, request.repeats);
  PlannerOptions options;
  options.ranks = request.devices * request.nodes;
  options.ranks_per_node = request.devices;
  options.link_bytes_per_second = request.link_bandwidth;
  options.network_bytes_per_second = request.network_bandwidth;
  options.max_memory = request.max_memory;
  const auto plans = weigh_plans(profiles, options);
  const TrainingPlan chosen = choose_plan(plans, options);
  std::ostringstream report;
  report << plan_table(chosen) << "\nother plans, fastest first (predicted step, largest peak):\n";
  int shown = 0;
  for (const auto& plan : plans) {
    if (shown == 8) break;
    char line[64];
    std::snprintf(line, sizeof line, "%9.2f ms  %9.1f MiB  ", plan.step_seconds * 1e3,
                  static_cast<double>(plan.max_peak_bytes()) / (1 << 20));
    report << line << plan.describe()
           << (usable_bytes(options) > 0 && plan.max_peak_bytes() > usable_bytes(options)
                   ? "  (over the limit)"
                   : "")
           << "\n";
    ++shown;
  }
  char links[200];
  std::snprintf(links, sizeof links,
                "%lld stages: %lld node(s) of %lld devices, transfers at %.3g GB/s within a node "
                "and %.3g GB/s between nodes (0: free); ",
                static_cast<long long>(options.ranks), static_cast<long long>(request.nodes),
                static_cast<long long>(request.devices), request.link_bandwidth / 1e9,
                request.network_bandwidth / 1e9);
  report << links << "layers measured on " << device
         << (cuda ? "" : " with " + std::to_string(at::get_num_threads()) + " threads") << ", "
         << rows << " rows per batch";
  return report.str();
}

}  // namespace pipetrain::cli
