// Schedule "auto" inside the Pipe: after a profiled step, every rank's action times are pooled
// and each candidate simulated with them (ScheduleChoice, schedule_choice.h, decides from the
// predictions and, where they tie, from timed steps); a change of schedule drops the cached plans.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "deferred_batch_norm.h"
#include "distributed/p2p.h"
#include "ops/fused_linear.h"
#include "pipe_impl.h"
#include "pipeline/plan.h"
#include "pipeline/tied_parameters.h"
#include "pipeline/trace.h"
#include "pipetrain/balance.h"
#include "pipetrain/error.h"
#include "pipetrain/world.h"
#include "schedule_choice.h"
#include "schedule_file.h"
#include "stage_execution.h"
#include "stage_graphs.h"
#include "stage_value.h"
#include "util/compat.h"

namespace pipetrain {

void Pipe::Impl::choose_schedule(const std::vector<double>& profiled_seconds, int64_t transfers,
                                 int64_t chunks, double step_seconds) {
  std::string said;
  if (choice_->profiling()) {
    if (!choice_->count_profiled_step()) return;
    said = predict_schedules(profiled_seconds, transfers, chunks);
  } else {
    // Every rank's step, averaged, so that all ranks take the same figure.
    said = choice_->tried(world_->all_reduce_sum(step_seconds) / static_cast<double>(world_size_));
  }
  if (rank_ == 0 && !said.empty()) print_line("pipetrain: schedule auto: " + said);
  if (choice_->running() != schedule_name_) {
    schedule_name_ = choice_->running();
    schedule_ = checked_schedule(schedule_name_, world_size_, options_.chunks(), 1);
    plans_.clear();
  }
}

std::string Pipe::Impl::predict_schedules(const std::vector<double>& seconds, int64_t transfers,
                                          int64_t chunks) {
  // Every rank's per-micro-batch F, I (or B) and W by stage, then every rank's seconds handing
  // transfers over and their count, summed into one table that all ranks hold.
  const int64_t n = stages();
  at::Tensor table = torch::zeros({3 * n + 2}, torch::kFloat64);
  for (int kind = 0; kind < 3; ++kind) table[kind * n + rank_] = seconds[kind] / chunks;
  table[3 * n] = seconds[3];
  table[3 * n + 1] = static_cast<double>(transfers);
  table = world_->all_reduce_sum_on_device(table.to(world_->device())).cpu();
  const auto entry = [&](int64_t i) { return table[i].item<double>(); };
  ActionCosts costs;
  costs.message = entry(3 * n + 1) > 0 ? entry(3 * n) / entry(3 * n + 1) : 0.0;
  for (int64_t s = 0; s < n; ++s) {
    const double f = entry(s), i = entry(n + s), w = entry(2 * n + s);
    costs.forward.push_back(f);
    costs.backward.push_back(i + w);  // the first stage's I is its whole backward, its W empty
    costs.weight.push_back(w);
  }
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "per micro-batch F/I/W ms by stage:";
  for (int64_t s = 0; s < n; ++s) {
    line << (s > 0 ? "," : "") << " " << s << ": " << 1e3 * costs.forward[s] << "/"
         << 1e3 * (costs.backward[s] - costs.weight[s]) << "/" << 1e3 * costs.weight[s];
  }
  line << "; per transfer " << 1e3 * costs.message << " ms";
  std::vector<ScheduleChoice::Prediction> predictions;
  for (const std::string& name : ScheduleChoice::candidates()) {
    const Schedule candidate = make_schedule(name, world_size_, chunks);
    const int64_t held = max_activations_held(candidate);
    // The plan each would run, its weight-gradient actions placed as they would be.
    predictions.push_back(
        {name,
         simulate_plan(executed_plan(candidate, options_.fuse_gradient_accumulation(),
                                     recompute_below(checkpoint_mode_, chunks)),
                       costs)
             .step_time,
         held, options_.max_in_flight() == 0 || held <= options_.max_in_flight()});
  }
  return line.str() + "; " + choice_->predicted(predictions);
}

}  // namespace pipetrain
