#include "train/training_plan.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "pipeline/activation_memory.h"
#include "pipeline/plan.h"
#include "pipetrain/schedule.h"

namespace pipetrain {
namespace {

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// Layers [begin, end) as one stage.
struct Stage {
  double forward = 0, backward = 0, weight_backward = 0, optimizer = 0;
  int64_t static_bytes = 0;
  StageActivations activations;
};

Stage stage_of(const LayerProfile& profile, int64_t begin, int64_t end, bool last,
               const PlannerOptions& options) {
  Stage stage;
  const auto& layers = profile.layers;
  const int64_t input = begin == 0 ? profile.input_bytes : layers[begin - 1].output_bytes;
  stage.activations.whole = input;
  stage.activations.boundary = input + layers[end - 1].output_bytes;
  for (int64_t i = begin; i < end; ++i) {
    const LayerCost& c = layers[i];
    stage.forward += c.forward_seconds;
    stage.backward += c.backward_seconds;
    stage.weight_backward += c.weight_backward_seconds;
    stage.activations.split += c.split_held_bytes;
    stage.optimizer += c.optimizer_seconds;
    stage.activations.whole += c.activation_bytes;
    stage.activations.workspace = std::max(stage.activations.workspace, c.workspace_bytes);
    stage.static_bytes +=
        c.buffer_bytes + static_cast<int64_t>(static_cast<double>(c.parameter_bytes) *
                                              (2 + options.optimizer_state_per_parameter_byte));
  }
  // The loss keeps the gradient of the model's output (cross-entropy's, of the logits).
  if (last) stage.activations.whole += layers[end - 1].output_bytes;
  // With no input gradient to compute (tokens in), a split backward's first half does nothing
  // and keeps nothing: the weight half is the whole backward.
  if (!layers[begin].input_differentiable) {
    stage.weight_backward = stage.backward;
    stage.activations.split = 0;
  }
  return stage;
}

// The balance of `layers` over `stages` stages whose largest cost(stage, begin, end) is smallest
// among those where fits(stage, begin, end) holds for every stage; empty when none fits.
std::vector<int64_t> bottleneck_balance(
    int64_t layers, int64_t stages, const std::function<double(int64_t, int64_t, int64_t)>& cost,
    const std::function<bool(int64_t, int64_t, int64_t)>& fits) {
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // best[s][j]: the smallest largest cost of the first j layers over stages 0..s-1.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, kNone));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(layers + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t j = s; j <= layers - (stages - s); ++j) {
      for (int64_t i = s - 1; i < j; ++i) {
        if (best[s - 1][i] == kNone || !fits(s - 1, i, j)) continue;
        const double value = std::max(best[s - 1][i], cost(s - 1, i, j));
        if (value < best[s][j]) {
          best[s][j] = value;
          cut[s][j] = i;
        }
      }
    }
  }
  if (best[stages][layers] == kNone) return {};
  std::vector<int64_t> balance(stages);
  for (int64_t s = stages, j = layers; s > 0; --s) {
    balance[s - 1] = j - cut[s][j];
    j = cut[s][j];
  }
  return balance;
}

// The time one micro-batch's activations (or their gradients, as large) take from the rank of
// stage `s` to the next: bytes over the bandwidth of the link between them, the network's where
// the two are on different nodes; free where no bandwidth is given.
double transfer_seconds(int64_t bytes, int64_t s, const PlannerOptions& options) {
  const bool across =
      options.ranks_per_node > 0 && s / options.ranks_per_node != (s + 1) / options.ranks_per_node;
  const double bandwidth =
      across ? options.network_bytes_per_second : options.link_bytes_per_second;
  return bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0.0;
}

TrainingPlan predict(const LayerProfile& profile, const std::vector<int64_t>& balance,
                     int64_t chunks, const std::string& schedule_name, CheckpointMode mode,
                     const PlannerOptions& options) {
  const auto ranks = static_cast<int64_t>(balance.size());
  const Schedule schedule = make_schedule(schedule_name, ranks, chunks);
  const int64_t recomputed = recompute_below(mode, chunks);
  // A recomputed micro-batch's backward runs its forward again first; the simulation takes one
  // cost per stage, so each backward carries the recomputed share of a forward.
  const double rerun = static_cast<double>(recomputed) / static_cast<double>(chunks);
  ActionCosts costs;
  std::vector<StageActivations> activations;
  TrainingPlan plan;
  plan.balance = balance;
  plan.chunks = chunks;
  plan.schedule = schedule_name;
  plan.checkpoint = mode;
  int64_t begin = 0;
  for (int64_t s = 0; s < ranks; ++s) {
    const Stage stage = stage_of(profile, begin, begin + balance[s], s == ranks - 1, options);
    begin += balance[s];
    if (s + 1 < ranks) {
      costs.transfer = std::max(
          costs.transfer, transfer_seconds(profile.layers[begin - 1].output_bytes, s, options));
    }
    costs.forward.push_back(stage.forward);
    costs.backward.push_back(stage.backward + rerun * stage.forward);
    // The simulation takes a split backward's I as B - W: W as measured, within B.
    costs.weight.push_back(std::min(stage.weight_backward, costs.backward.back()));
    activations.push_back(stage.activations);
    plan.stage_seconds.push_back(costs.forward.back() + costs.backward.back());
    plan.static_bytes.push_back(stage.static_bytes);
    plan.optimizer_seconds.push_back(stage.optimizer);
  }
  // The ranks step their optimizers side by side once the pipeline has drained.
  plan.step_seconds =
      simulate_plan(executed_plan(schedule, /*fused=*/false, recomputed), costs).step_time +
      *std::max_element(plan.optimizer_seconds.begin(), plan.optimizer_seconds.end());
  plan.peak_bytes = peak_activation_bytes(schedule, activations, recomputed);
  for (int64_t r = 0; r < ranks; ++r) plan.peak_bytes[r] += plan.static_bytes[r];
  return plan;
}

}  // namespace

int64_t usable_bytes(const PlannerOptions& options) {
  return static_cast<int64_t>(static_cast<double>(options.max_memory) *
                              (1 - options.memory_margin));
}

int64_t TrainingPlan::max_peak_bytes() const {
  return peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

std::string TrainingPlan::describe() const {
  std::ostringstream text;
  text << "balance ";
  for (size_t s = 0; s < balance.size(); ++s) text << (s ? "," : "") << balance[s];
  const auto modes = checkpoint_mode_names();
  text << " chunks " << chunks << " schedule " << schedule << " checkpoint "
       << modes[static_cast<size_t>(checkpoint)];
  return text.str();
}

std::vector<TrainingPlan> weigh_plans(const std::map<int64_t, LayerProfile>& profiles,
                                      const PlannerOptions& options) {
  std::vector<TrainingPlan> plans;
  for (const auto& [chunks, profile] : profiles) {
    const auto layers = static_cast<int64_t>(profile.layers.size());
    if (layers < options.ranks) {
      throw std::invalid_argument("a plan over " + std::to_string(options.ranks) +
                                  " ranks needs at least as many layers; the model has " +
                                  std::to_string(layers));
    }
    for (const auto& name : options.schedules) {
      const auto held = activations_held(make_schedule(name, options.ranks, chunks));
      std::vector<int64_t> weighed;  // recompute_below of the modes weighed: one plan each
      for (const CheckpointMode mode :
           {CheckpointMode::kNever, CheckpointMode::kExceptLast, CheckpointMode::kAlways}) {
        if (std::count(weighed.begin(), weighed.end(), recompute_below(mode, chunks)) > 0) continue;
        weighed.push_back(recompute_below(mode, chunks));
        const bool recomputes = recompute_below(mode, chunks) > 0;
        const double rerun =
            static_cast<double>(recompute_below(mode, chunks)) / static_cast<double>(chunks);
        auto stage = [&](int64_t i, int64_t j) {
          return stage_of(profile, i, j, j == layers, options);
        };
        auto time = [&](int64_t, int64_t i, int64_t j) {
          const Stage st = stage(i, j);
          return st.forward * (1 + rerun) + st.backward;
        };
        // Memory as the stage's held micro-batches take it, each kept whole or, where recomputed,
        // by its boundary with one rebuilt at a time: for the balance only; the plan's figures
        // come from the exact walk (peak_activation_bytes).
        auto memory = [&](int64_t s, int64_t i, int64_t j) {
          const Stage st = stage(i, j);
          const auto& a = st.activations;
          const int64_t activations =
              recomputes ? held[s] * a.boundary + a.whole : held[s] * a.whole;
          return static_cast<double>(st.static_bytes + activations + a.workspace);
        };
        std::vector<int64_t> balance;
        if (usable_bytes(options) > 0) {
          balance =
              bottleneck_balance(layers, options.ranks, time, [&](int64_t s, int64_t i, int64_t j) {
                return memory(s, i, j) <= static_cast<double>(usable_bytes(options));
              });
        } else {
          balance = bottleneck_balance(layers, options.ranks, time,
                                       [](int64_t, int64_t, int64_t) { return true; });
        }
        if (balance.empty()) {
          balance = bottleneck_balance(layers, options.ranks, memory,
                                       [](int64_t, int64_t, int64_t) { return true; });
        }
        plans.push_back(predict(profile, balance, chunks, name, mode, options));
      }
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const TrainingPlan& a, const TrainingPlan& b) {
    return a.step_seconds < b.step_seconds;
  });
  return plans;
}

TrainingPlan choose_plan(const std::vector<TrainingPlan>& plans, const PlannerOptions& options) {
  const int64_t usable = usable_bytes(options);
  auto fits = [&](const TrainingPlan& plan) {
    return usable == 0 || plan.max_peak_bytes() <= usable;
  };
  const TrainingPlan* fastest = nullptr;
  for (const auto& plan : plans) {
    if (fits(plan) && (fastest == nullptr || plan.step_seconds < fastest->step_seconds)) {
      fastest = &plan;
    }
  }
  if (fastest == nullptr) {
    const auto smallest = std::min_element(
        plans.begin(), plans.end(),
        [](const auto& a, const auto& b) { return a.max_peak_bytes() < b.max_peak_bytes(); });
    if (smallest == plans.end()) throw std::invalid_argument("no plan to choose from");
    const auto needed = static_cast<int64_t>(static_cast<double>(smallest->max_peak_bytes()) /
                                             (1 - options.memory_margin));
    throw std::invalid_argument(
        "no plan fits max_memory (--max-memory) " + mib(options.max_memory) +
        " MiB per device, of which the planner uses " + mib(usable) +
        " (the rest is its margin for what it does not predict): the smallest any needs is " +
        mib(smallest->max_peak_bytes()) + " MiB (" + smallest->describe() + "), so a limit of " +
        mib(needed) + " MiB would do; raise the limit, or spread the model over more devices");
  }
  const TrainingPlan* chosen = fastest;
  for (const auto& plan : plans) {
    if (fits(plan) && plan.step_seconds <= fastest->step_seconds * 1.01 &&
        plan.max_peak_bytes() < chosen->max_peak_bytes()) {
      chosen = &plan;
    }
  }
  return *chosen;
}

std::string plan_table(const TrainingPlan& plan) {
  std::ostringstream table;
  table << "plan: " << plan.describe() << "\n";
  table << "stage  layers  forward+backward per micro-batch, ms  peak memory, MiB\n";
  int64_t first = 0;
  for (size_t s = 0; s < plan.balance.size(); ++s) {
    char row[128];
    const std::string layers =
        std::to_string(first) + "-" + std::to_string(first + plan.balance[s] - 1);
    const double ms = s < plan.stage_seconds.size() ? plan.stage_seconds[s] * 1e3 : 0.0;
    std::snprintf(row, sizeof row, "%5zu  %6s  %36.2f  %16s\n", s, layers.c_str(), ms,
                  mib(plan.peak_bytes[s]).c_str());
    table << row;
    first += plan.balance[s];
  }
  char step[96];
  std::snprintf(step, sizeof step, "predicted step: %.2f ms", plan.step_seconds * 1e3);
  table << step;
  return table.str();
}

std::string plan_to_json(const TrainingPlan& plan) {
  nlohmann::json json{{"balance", plan.balance},
                      {"chunks", plan.chunks},
                      {"schedule", plan.schedule},
                      {"checkpoint", checkpoint_mode_names()[static_cast<size_t>(plan.checkpoint)]},
                      {"predicted_step_seconds", plan.step_seconds},
                      {"predicted_peak_bytes", plan.peak_bytes},
                      {"stage_seconds", plan.stage_seconds},
                      {"optimizer_seconds", plan.optimizer_seconds},
                      {"static_bytes", plan.static_bytes}};
  return json.dump(2) + "\n";
}

TrainingPlan plan_from_json(const std::string& text, const std::string& source) {
  TrainingPlan plan;
  try {
    const auto json = nlohmann::json::parse(text);
    plan.balance = json.at("balance").get<std::vector<int64_t>>();
    plan.chunks = json.at("chunks").get<int64_t>();
    plan.schedule = json.at("schedule").get<std::string>();
    plan.checkpoint = parse_checkpoint_mode(json.at("checkpoint").get<std::string>());
    plan.step_seconds = json.at("predicted_step_seconds").get<double>();
    plan.peak_bytes = json.at("predicted_peak_bytes").get<std::vector<int64_t>>();
    plan.stage_seconds = json.value("stage_seconds", std::vector<double>{});
    plan.optimizer_seconds = json.value("optimizer_seconds", std::vector<double>{});
    plan.static_bytes = json.value("static_bytes", std::vector<int64_t>{});
  } catch (const std::exception& e) {
    throw std::invalid_argument(source + " is not a plan pipetrain wrote (plan.json): " + e.what());
  }
  if (plan.balance.empty() || plan.peak_bytes.size() != plan.balance.size() || plan.chunks < 1) {
    throw std::invalid_argument(source +
                                " is not a plan pipetrain wrote (plan.json): its balance, chunks "
                                "and predicted peaks do not agree");
  }
  return plan;
}

}  // namespace pipetrain
