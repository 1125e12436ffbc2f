#include "plan_command.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "train/layer_profile.h"
#include "train/training_plan.h"
#include "util/usable_cpus.h"

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
  const int64_t layers = static_cast<int64_t>(profiles.begin()->second.layers.size());
  const int64_t devices = request.devices * request.nodes;
  if (request.stages > 0 && devices % request.stages != 0) {
    throw std::invalid_argument("--stages " + std::to_string(request.stages) +
                                " does not divide the " + std::to_string(devices) +
                                " devices (--devices x --num-nodes) into whole pipelines");
  }
  PlannerOptions options;
  options.ranks_per_node = request.devices;
  options.link_bytes_per_second = request.link_bandwidth;
  options.network_bytes_per_second = request.network_bandwidth;
  options.max_memory = request.max_memory;
  if (!cuda) {
    // CPU ranks share this machine's cores (the planned ones: this machine's), each with the
    // threads its layers were timed with.
    options.cores_per_node = usable_cpus();
    options.threads_per_rank = at::get_num_threads();
  }
  std::vector<TrainingPlan> plans;
  for (int64_t stages = 1; stages <= std::min(devices, layers); ++stages) {
    if (devices % stages != 0 || (request.stages > 0 && stages != request.stages)) continue;
    options.stages = stages;
    options.replicas = devices / stages;
    const auto weighed = weigh_plans(profiles, options);
    plans.insert(plans.end(), weighed.begin(), weighed.end());
  }
  std::stable_sort(plans.begin(), plans.end(), [](const TrainingPlan& a, const TrainingPlan& b) {
    return a.seconds_per_batch() < b.seconds_per_batch();
  });
  const TrainingPlan chosen = choose_plan(plans, options);
  std::ostringstream report;
  report << plan_table(chosen) << "\n"
         << chosen.peak_bytes.size() << " stages x " << chosen.replicas
         << " replicas: " << rows * chosen.replicas << " rows per step (" << rows
         << " per replica), "
         << static_cast<int64_t>(static_cast<double>(rows * chosen.replicas) / chosen.step_seconds)
         << " rows/s\ntrain it with: --devices " << request.devices << " --num-nodes "
         << request.nodes;
  if (chosen.replicas > 1) {
    report << " --strategy ddp_pipe --stages " << chosen.peak_bytes.size() << " --zero-stage "
           << chosen.zero_stage;
  } else {
    report << " --strategy pipe";
  }
  report << " --balance ";
  for (size_t s = 0; s < chosen.balance.size(); ++s) {
    report << (s ? "," : "") << chosen.balance[s];
  }
  if (chosen.virtual_stages > 1) report << " --virtual-stages " << chosen.virtual_stages;
  report << " --chunks " << chosen.chunks << " --schedule " << chosen.schedule << " --checkpoint "
         << checkpoint_mode_names()[static_cast<size_t>(chosen.checkpoint)]
         << "\nthe fastest plans that fit (predicted step, per replica's batch, largest peak):\n";
  // Plans that predict alike (one-stage schedules on one rank, say) are shown once.
  const TrainingPlan* last = nullptr;
  int shown = 0;
  for (const auto& plan : plans) {
    if (shown == 8) break;
    if (!fits(plan, options) || (last != nullptr && last->step_seconds == plan.step_seconds &&
                                 last->max_peak_bytes() == plan.max_peak_bytes())) {
      continue;
    }
    char line[80];
    std::snprintf(line, sizeof line, "%9.2f ms  %9.2f ms  %9.1f MiB  ", plan.step_seconds * 1e3,
                  plan.seconds_per_batch() * 1e3,
                  static_cast<double>(plan.max_peak_bytes()) / (1 << 20));
    report << line << plan.describe() << "\n";
    last = &plan;
    ++shown;
  }
  char links[200];
  std::snprintf(links, sizeof links,
                "%lld devices: %lld node(s) of %lld, transfers at %.3g GB/s within a node "
                "and %.3g GB/s between nodes (0: free); ",
                static_cast<long long>(devices), static_cast<long long>(request.nodes),
                static_cast<long long>(request.devices), request.link_bandwidth / 1e9,
                request.network_bandwidth / 1e9);
  report << links << "layers measured on " << device
         << (cuda ? "" : " with " + std::to_string(at::get_num_threads()) + " threads") << ", "
         << rows << " rows per batch";
  return report.str();
}

void check_plan_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  if (!(in && text << in.rdbuf())) {
    throw std::invalid_argument("cannot read the plan file " + path +
                                " (--plan): give the plan.json of an earlier run, or --plan auto "
                                "to make one");
  }
  plan_from_json(text.str(), path);
}

}  // namespace pipetrain::cli
