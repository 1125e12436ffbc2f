#include "train/training_plan.h"

#include <algorithm>
#include <cmath>
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
  int64_t parameter_bytes = 0, buffer_bytes = 0;
  StageActivations activations;
};

Stage stage_of(const LayerProfile& profile, int64_t begin, int64_t end, bool last) {
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
    stage.parameter_bytes += c.parameter_bytes;
    stage.buffer_bytes += c.buffer_bytes;
    for (const auto& [other, bytes] : c.shared_parameter_bytes) {
      if (other >= begin && other < end) stage.parameter_bytes -= bytes;  // held once
    }
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

// What a rank of `stage` holds throughout: weights, buffers, gradients and the optimizer's state,
// of which ZeRO stage 1 keeps one replica's share.
int64_t static_bytes(const Stage& stage, int64_t zero_stage, const PlannerOptions& options) {
  const double state_share = zero_stage >= 1 ? 1.0 / static_cast<double>(options.replicas) : 1.0;
  return stage.buffer_bytes +
         static_cast<int64_t>(static_cast<double>(stage.parameter_bytes) *
                              (2 + options.optimizer_state_per_parameter_byte * state_share));
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

int64_t node_of(int64_t rank, const PlannerOptions& options) {
  return options.ranks_per_node > 0 ? rank / options.ranks_per_node : 0;
}

// Bytes per second between `ranks`: the network's where they are on more than one node.
double bandwidth_between(const std::vector<int64_t>& ranks, const PlannerOptions& options) {
  for (const int64_t rank : ranks) {
    if (node_of(rank, options) != node_of(ranks.front(), options)) {
      return options.network_bytes_per_second;
    }
  }
  return options.link_bytes_per_second;
}

double seconds_for(double bytes, double bandwidth) { return bandwidth > 0 ? bytes / bandwidth : 0; }

// The time one micro-batch's activations (or their gradients, as large) take from `rank` to
// `next` (stage ranks of a pipeline), in the replica where that crossing is slowest; none within
// a rank.
double transfer_seconds(int64_t bytes, int64_t rank, int64_t next, const PlannerOptions& options) {
  double slowest = 0;
  for (int64_t r = 0; r < options.replicas && rank != next; ++r) {
    const int64_t offset = r * options.stages;
    slowest =
        std::max(slowest, seconds_for(static_cast<double>(bytes),
                                      bandwidth_between({offset + rank, offset + next}, options)));
  }
  return slowest;
}

// The ranks holding stage rank `s`'s stages, one per replica.
std::vector<int64_t> replicas_of(int64_t s, const PlannerOptions& options) {
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < options.replicas; ++r) ranks.push_back(r * options.stages + s);
  return ranks;
}

// Where a node's CPU ranks run more threads than it has cores (PlannerOptions::cores_per_node),
// the simulation's time is stretched to what the cores can compute: every rank's (and every
// replica's) busy time x threads / cores, each rank finishing that much later.
void take_turns_on_shared_cores(Simulation& pipeline, const PlannerOptions& options) {
  if (options.cores_per_node <= 0 || pipeline.step_time <= 0) return;
  const int64_t pipeline_ranks = static_cast<int64_t>(pipeline.busy_time.size());
  const int64_t ranks = pipeline_ranks * options.replicas;
  const int64_t per_node = options.ranks_per_node > 0 ? options.ranks_per_node : ranks;
  double slowest = 0;
  for (int64_t first = 0; first < ranks; first += per_node) {
    double busy = 0;
    for (int64_t rank = first; rank < std::min(ranks, first + per_node); ++rank) {
      busy += pipeline.busy_time[static_cast<size_t>(rank % pipeline_ranks)];
    }
    slowest = std::max(slowest, busy * static_cast<double>(options.threads_per_rank) /
                                    static_cast<double>(options.cores_per_node));
  }
  if (slowest <= pipeline.step_time) return;
  const double stretch = slowest / pipeline.step_time;
  for (auto& finish : pipeline.finish_time) finish *= stretch;
  pipeline.step_time = slowest;
}

TrainingPlan predict(const LayerProfile& profile, const std::vector<int64_t>& balance,
                     const Schedule& schedule, const std::string& schedule_name, int64_t chunks,
                     CheckpointMode mode, int64_t zero_stage, const PlannerOptions& options) {
  const auto stages = static_cast<int64_t>(balance.size());
  const int64_t ranks = options.stages;
  const auto placement = stage_placement(schedule);
  const int64_t recomputed = recompute_below(mode, chunks);
  // A recomputed micro-batch's backward runs its forward again first; the simulation takes one
  // cost per stage, so each backward carries the recomputed share of a forward.
  const double rerun = static_cast<double>(recomputed) / static_cast<double>(chunks);
  const auto replicas = static_cast<double>(options.replicas);
  ActionCosts costs;
  std::vector<StageActivations> activations;
  std::vector<Stage> held(ranks);  // what each rank's stages hold together: parameters, buffers
  TrainingPlan plan;
  plan.balance = balance;
  plan.chunks = chunks;
  plan.schedule = schedule_name;
  plan.virtual_stages = stages / ranks;
  plan.checkpoint = mode;
  plan.replicas = options.replicas;
  plan.zero_stage = zero_stage;
  plan.optimizer_seconds.assign(ranks, 0);
  int64_t begin = 0;
  for (int64_t s = 0; s < stages; ++s) {
    const Stage stage = stage_of(profile, begin, begin + balance[s], s == stages - 1);
    begin += balance[s];
    if (s + 1 < stages) {
      costs.transfer =
          std::max(costs.transfer, transfer_seconds(profile.layers[begin - 1].output_bytes,
                                                    placement[s], placement[s + 1], options));
    }
    costs.forward.push_back(stage.forward);
    costs.backward.push_back(stage.backward + rerun * stage.forward);
    // The simulation takes a split backward's I as B - W: W as measured, within B.
    costs.weight.push_back(std::min(stage.weight_backward, costs.backward.back()));
    activations.push_back(stage.activations);
    plan.stage_seconds.push_back(costs.forward.back() + costs.backward.back());
    Stage& rank = held[placement[s]];
    rank.parameter_bytes += stage.parameter_bytes;
    rank.buffer_bytes += stage.buffer_bytes;
    plan.optimizer_seconds[placement[s]] += stage.optimizer;
  }
  // Parameters shared by layers of two stages of one rank (a V schedule's embedding and head) are
  // held once there.
  std::vector<int64_t> stage_of_layer;
  for (int64_t s = 0; s < stages; ++s) stage_of_layer.insert(stage_of_layer.end(), balance[s], s);
  for (size_t i = 0; i < profile.layers.size(); ++i) {
    for (const auto& [other, bytes] : profile.layers[i].shared_parameter_bytes) {
      const int64_t a = stage_of_layer[i], b = stage_of_layer[static_cast<size_t>(other)];
      if (a != b && placement[a] == placement[b]) held[placement[a]].parameter_bytes -= bytes;
    }
  }
  std::vector<double> all_reduce, optimizer;  // per rank, after its pipeline work
  for (int64_t r = 0; r < ranks; ++r) {
    plan.static_bytes.push_back(static_bytes(held[r], zero_stage, options));
    const double bandwidth = bandwidth_between(replicas_of(r, options), options);
    const auto parameters = static_cast<double>(held[r].parameter_bytes);
    all_reduce.push_back(seconds_for(2 * (replicas - 1) / replicas * parameters, bandwidth));
    optimizer.push_back(zero_stage >= 1
                            ? plan.optimizer_seconds[r] / replicas +
                                  seconds_for((replicas - 1) / replicas * parameters, bandwidth)
                            : plan.optimizer_seconds[r]);
  }
  Simulation pipeline = simulate_plan(executed_plan(schedule, /*fused=*/false, recomputed), costs);
  take_turns_on_shared_cores(pipeline, options);
  // Each rank all-reduces its stages' gradients with its replicas once its last backward is done;
  // the optimizers step side by side once every rank is there (clipping needs the global norm).
  double synced = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    synced = std::max(synced, pipeline.finish_time[r] + all_reduce[r]);
  }
  plan.step_seconds = synced + *std::max_element(optimizer.begin(), optimizer.end());
  plan.pipeline_seconds = pipeline.step_time;
  plan.peak_bytes = peak_activation_bytes(schedule, activations, recomputed);
  for (int64_t r = 0; r < ranks; ++r) plan.peak_bytes[r] += plan.static_bytes[r];
  return plan;
}

// Which rank runs stage `s` of `plan` over `ranks` ranks: as its schedule places it.
int64_t stage_rank(const TrainingPlan& plan, int64_t s, int64_t ranks) {
  if (plan.virtual_stages == 1) return s;
  return stage_placement(make_schedule(plan.schedule, ranks, plan.chunks, plan.virtual_stages))[s];
}

}  // namespace

int64_t bytes_needed(const TrainingPlan& plan, const PlannerOptions& options) {
  int64_t needed = 0;
  for (size_t r = 0; r < plan.peak_bytes.size(); ++r) {
    const int64_t held = r < plan.static_bytes.size() ? plan.static_bytes[r] : 0;
    const auto activations = static_cast<double>(plan.peak_bytes[r] - held);
    needed = std::max(
        needed, held + static_cast<int64_t>(std::ceil(activations * (1 + options.memory_margin))));
  }
  return needed;
}

bool fits(const TrainingPlan& plan, const PlannerOptions& options) {
  return options.max_memory == 0 || bytes_needed(plan, options) <= options.max_memory;
}

int64_t TrainingPlan::max_peak_bytes() const {
  return peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

std::string TrainingPlan::describe() const {
  std::ostringstream text;
  text << "balance ";
  for (size_t s = 0; s < balance.size(); ++s) text << (s ? "," : "") << balance[s];
  const auto modes = checkpoint_mode_names();
  text << " chunks " << chunks << " schedule " << schedule;
  if (virtual_stages > 1) text << " virtual_stages " << virtual_stages;
  text << " checkpoint " << modes[static_cast<size_t>(checkpoint)];
  if (replicas > 1) text << " replicas " << replicas << " zero_stage " << zero_stage;
  return text.str();
}

std::vector<TrainingPlan> weigh_plans(const std::map<int64_t, LayerProfile>& profiles,
                                      const PlannerOptions& options) {
  const std::vector<int64_t> zero_stages =
      options.replicas > 1 ? options.zero_stages : std::vector<int64_t>{0};
  std::vector<TrainingPlan> plans;
  for (const auto& [chunks, profile] : profiles) {
    const auto layers = static_cast<int64_t>(profile.layers.size());
    if (layers < options.stages) {
      throw std::invalid_argument("a plan over " + std::to_string(options.stages) +
                                  " stages needs at least as many layers; the model has " +
                                  std::to_string(layers));
    }
    for (const auto& name : options.schedules) {
      const int64_t virtual_stages = planned_virtual_stages(name);
      const int64_t stages = options.stages * virtual_stages;
      // Two stages on one rank gain nothing there; and interleaved1f1b takes only chunks it can
      // run in rounds of equal size.
      if (stages > layers || (virtual_stages > 1 && options.stages == 1)) continue;
      Schedule schedule;
      try {
        schedule = make_schedule(name, options.stages, chunks, virtual_stages);
      } catch (const std::invalid_argument&) {
        continue;
      }
      const auto held = activations_held(schedule);  // per stage
      std::vector<int64_t> weighed;  // recompute_below of the modes weighed: one plan each
      for (const CheckpointMode mode :
           {CheckpointMode::kNever, CheckpointMode::kExceptLast, CheckpointMode::kAlways}) {
        if (std::count(weighed.begin(), weighed.end(), recompute_below(mode, chunks)) > 0) continue;
        weighed.push_back(recompute_below(mode, chunks));
        const bool recomputes = recompute_below(mode, chunks) > 0;
        const double rerun =
            static_cast<double>(recompute_below(mode, chunks)) / static_cast<double>(chunks);
        auto stage = [&](int64_t i, int64_t j) { return stage_of(profile, i, j, j == layers); };
        auto time = [&](int64_t, int64_t i, int64_t j) {
          const Stage st = stage(i, j);
          return st.forward * (1 + rerun) + st.backward;
        };
        for (const int64_t zero_stage : zero_stages) {
          // Memory as the stage's held micro-batches take it, each kept whole or, where
          // recomputed, by its boundary with one rebuilt at a time, and with a rank's stages
          // sharing its limit evenly: for the balance only; the plan's figures come from the exact
          // walk (peak_activation_bytes).
          auto memory = [&](int64_t s, int64_t i, int64_t j) {
            const Stage st = stage(i, j);
            const auto& a = st.activations;
            const int64_t activations =
                (recomputes ? held[s] * a.boundary + a.whole : held[s] * a.whole) + a.workspace;
            return static_cast<double>(static_bytes(st, zero_stage, options)) +
                   static_cast<double>(activations) * (1 + options.memory_margin);
          };
          const double limit =
              static_cast<double>(options.max_memory) / static_cast<double>(virtual_stages);
          auto fits_limit = [&](int64_t s, int64_t i, int64_t j) {
            return options.max_memory == 0 || memory(s, i, j) <= limit;
          };
          std::vector<int64_t> balance = bottleneck_balance(layers, stages, time, fits_limit);
          if (balance.empty()) {
            balance = bottleneck_balance(layers, stages, memory,
                                         [](int64_t, int64_t, int64_t) { return true; });
          }
          plans.push_back(
              predict(profile, balance, schedule, name, chunks, mode, zero_stage, options));
        }
      }
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const TrainingPlan& a, const TrainingPlan& b) {
    return a.seconds_per_batch() < b.seconds_per_batch();
  });
  return plans;
}

int64_t planned_virtual_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "zbv" ? 2 : 1;
}

TrainingPlan choose_plan(const std::vector<TrainingPlan>& plans, const PlannerOptions& options) {
  const TrainingPlan* fastest = nullptr;
  for (const auto& plan : plans) {
    if (fits(plan, options) &&
        (fastest == nullptr || plan.seconds_per_batch() < fastest->seconds_per_batch())) {
      fastest = &plan;
    }
  }
  if (fastest == nullptr) {
    const auto smallest =
        std::min_element(plans.begin(), plans.end(), [&](const auto& a, const auto& b) {
          return bytes_needed(a, options) < bytes_needed(b, options);
        });
    if (smallest == plans.end()) throw std::invalid_argument("no plan to choose from");
    char margin[16];
    std::snprintf(margin, sizeof margin, "%.0f%%", options.memory_margin * 100);
    throw std::invalid_argument(
        "no plan fits " + mib(options.max_memory) +
        " MiB per device (--device-memory, --max-memory, PlanOptions::max_memory): the smallest "
        "any needs is " +
        mib(bytes_needed(*smallest, options)) + " MiB (" + smallest->describe() +
        "; its predicted peak " + mib(smallest->max_peak_bytes()) + " MiB and " + margin +
        " of its activations as a margin for what the prediction misses), so a limit of " +
        mib(bytes_needed(*smallest, options)) +
        " MiB would do; raise the limit, or spread the model over more devices");
  }
  const TrainingPlan* chosen = fastest;
  for (const auto& plan : plans) {
    if (fits(plan, options) && plan.seconds_per_batch() <= fastest->seconds_per_batch() * 1.01 &&
        plan.max_peak_bytes() < chosen->max_peak_bytes()) {
      chosen = &plan;
    }
  }
  return *chosen;
}

std::string plan_table(const TrainingPlan& plan) {
  std::ostringstream table;
  table << "plan: " << plan.describe() << "\n";
  table << "stage  rank  layers  forward+backward per micro-batch, ms  rank's peak memory, MiB\n";
  const auto ranks = static_cast<int64_t>(plan.peak_bytes.size());
  int64_t first = 0;
  for (size_t s = 0; s < plan.balance.size(); ++s) {
    const int64_t rank = stage_rank(plan, static_cast<int64_t>(s), ranks);
    char row[128];
    const std::string layers =
        std::to_string(first) + "-" + std::to_string(first + plan.balance[s] - 1);
    const double ms = s < plan.stage_seconds.size() ? plan.stage_seconds[s] * 1e3 : 0.0;
    std::snprintf(row, sizeof row, "%5zu  %4lld  %6s  %36.2f  %23s\n", s,
                  static_cast<long long>(rank), layers.c_str(), ms,
                  mib(plan.peak_bytes[rank]).c_str());
    table << row;
    first += plan.balance[s];
  }
  char step[160];
  std::snprintf(step, sizeof step,
                "predicted step: %.2f ms (the pipeline %.2f ms, then gradients synced and the "
                "optimizer's step)",
                plan.step_seconds * 1e3, plan.pipeline_seconds * 1e3);
  table << step;
  return table.str();
}

std::string plan_to_json(const TrainingPlan& plan) {
  nlohmann::json json{{"balance", plan.balance},
                      {"chunks", plan.chunks},
                      {"schedule", plan.schedule},
                      {"virtual_stages", plan.virtual_stages},
                      {"checkpoint", checkpoint_mode_names()[static_cast<size_t>(plan.checkpoint)]},
                      {"replicas", plan.replicas},
                      {"zero_stage", plan.zero_stage},
                      {"predicted_step_seconds", plan.step_seconds},
                      {"predicted_pipeline_seconds", plan.pipeline_seconds},
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
    plan.virtual_stages = json.value("virtual_stages", int64_t{1});
    plan.replicas = json.value("replicas", int64_t{1});
    plan.zero_stage = json.value("zero_stage", int64_t{0});
    plan.step_seconds = json.at("predicted_step_seconds").get<double>();
    plan.pipeline_seconds = json.value("predicted_pipeline_seconds", plan.step_seconds);
    plan.peak_bytes = json.at("predicted_peak_bytes").get<std::vector<int64_t>>();
    plan.stage_seconds = json.value("stage_seconds", std::vector<double>{});
    plan.optimizer_seconds = json.value("optimizer_seconds", std::vector<double>{});
    plan.static_bytes = json.value("static_bytes", std::vector<int64_t>{});
  } catch (const std::exception& e) {
    throw std::invalid_argument(source + " is not a plan pipetrain wrote (plan.json): " + e.what());
  }
  if (plan.balance.empty() || plan.virtual_stages < 1 ||
      plan.peak_bytes.size() * plan.virtual_stages != plan.balance.size() || plan.chunks < 1 ||
      plan.replicas < 1 || plan.zero_stage < 0 || plan.zero_stage > 1) {
    throw std::invalid_argument(source +
                                " is not a plan pipetrain wrote (plan.json): its balance, chunks, "
                                "virtual_stages, replicas, zero_stage and predicted peaks do not "
                                "agree");
  }
  return plan;
}

}  // namespace pipetrain
