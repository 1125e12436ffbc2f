// Does the executor run the plan the simulator predicts? Two stages whose layers take KNOWN times:
// each layer's forward, input-gradient and weight-gradient halves wait for a fixed time per row
// (and compute a tiny elementwise product, so that tensors, autograd and the B/I/W split are the
// real ones). The two processes then need no CPU for their "compute", so the step time does not
// move with this machine's two busy cores, and the simulator can be fed the costs: the known ones,
// or those the actions took as each Pipe's Trace timed them (the layers' call costs included, as
// auto's profile sees them). Measured against the latter, what is left is the executor's own
// cost (receives, sends, bookkeeping between actions); the bubble is in the simulation.
//
// For m in {1, 2, 4, 8, 16} and every schedule ("auto" too): measured step, both simulated steps
// and their ratios, the gain over 1F1B measured and simulated, and whether the schedule auto ran
// is the fastest measured of those it chooses from. Run it as efficiency_bench (it starts its two
// stages itself):
//
//   build/bench/known_costs_bench
//
// KNOWN_COSTS_CHUNKS=16 runs one m alone; KNOWN_COSTS_TRACES=DIR writes each configuration's
// timed steps as Chrome traces, DIR/m16_interleaved1f1b.json and the like (trace.h).
#include <sys/prctl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "pipeline/plan.h"
#include "pipeline/recompute.h"
#include "pipeline/trace.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/pipe.h"
#include "pipetrain/schedule.h"
#include "pipetrain/world.h"

namespace {

using namespace pipetrain::bench;  // the helpers every benchmark here shares
using Clock = std::chrono::steady_clock;

constexpr int64_t kStages = 2;
constexpr int64_t kLayers = 8;  // 4 per rank: 2 per stage where a rank holds 2 stages
constexpr int64_t kWidth = 16;
constexpr int64_t kBatch = 64;
// One layer's time for the WHOLE batch; a micro-batch of r rows takes r / kBatch of it. F : I : W
// = 1 : 1 : 1, as a Linear's three GEMMs are alike.
constexpr double kForwardSeconds = 0.040, kInputSeconds = 0.040, kWeightSeconds = 0.040;
constexpr int kRounds = 3;
constexpr int kStepsPerTiming = 2;
// The m to run: all, or KNOWN_COSTS_CHUNKS alone.
std::vector<int64_t> chunk_counts() {
  const std::string only = env_or("KNOWN_COSTS_CHUNKS", "");
  if (!only.empty()) return {std::stoll(only)};
  return {1, 2, 4, 8, 16};
}
const std::vector<int64_t> kChunks = chunk_counts();
const std::vector<std::string> kSchedules = {"gpipe",           "1f1b", "zbh1", "zbh2",
                                             "interleaved1f1b", "zbv",  "auto"};
const std::vector<std::string> kAutoCandidates = {"gpipe", "1f1b", "zbh1", "zbh2"};

int64_t virtual_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "zbv" ? 2 : 1;
}

// Waits batch_seconds x rows / kBatch: sleeps until shortly before the deadline, then spins, so
// that the wait ends on time even where a sleep wakes late.
void wait_for_rows(double batch_seconds, int64_t rows) {
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                  batch_seconds * static_cast<double>(rows) / static_cast<double>(kBatch)));
  std::this_thread::sleep_until(deadline - std::chrono::microseconds(200));
  while (Clock::now() < deadline) {
  }
}

// y = x * scale, taking known times. The backward spends kInputSeconds only where autograd asks
// for the input's gradient and kWeightSeconds only where it asks for the scale's: the input half
// of a split backward pays the first, the weight half the second, a whole backward both (the
// first layer of the pipeline, whose input takes no gradient, pays no input half, as a Linear
// computes no dX there).
class TimedScale : public torch::autograd::Function<TimedScale> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& scale) {
    wait_for_rows(kForwardSeconds, x.size(0));
    ctx->save_for_backward({x, scale});
    return x * scale;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &scale = saved[1], &grad = grads[0];
    at::Tensor grad_x, grad_scale;
    if (ctx->needs_input_grad(0)) {
      wait_for_rows(kInputSeconds, x.size(0));
      grad_x = grad * scale;
    }
    if (ctx->needs_input_grad(1)) {
      wait_for_rows(kWeightSeconds, x.size(0));
      grad_scale = (grad * x).sum(0);
    }
    return {grad_x, grad_scale};
  }
};

struct TimedLayerImpl : torch::nn::Module {
  TimedLayerImpl() : scale(register_parameter("scale", torch::ones({kWidth}))) {}
  at::Tensor forward(const at::Tensor& x) { return TimedScale::apply(x, scale); }
  at::Tensor scale;
};
TORCH_MODULE(TimedLayer);

torch::nn::Sequential make_timed_model() {
  torch::nn::Sequential model;
  for (int64_t i = 0; i < kLayers; ++i) model->push_back(TimedLayer());
  return model;
}

// What each stage of `schedule` costs per micro-batch of `rows` rows, as the layers above spend
// it: the first stage's backward is never split (its inputs take no gradient), so all of it is
// counted as its input half, as the Pipe's own profile counts it.
pipetrain::ActionCosts known_costs(const std::string& schedule, int64_t rows, double transfer) {
  const int64_t stages = kStages * virtual_stages(schedule);
  const double layers = static_cast<double>(kLayers / stages);
  const double share = static_cast<double>(rows) / static_cast<double>(kBatch);
  pipetrain::ActionCosts costs;
  for (int64_t s = 0; s < stages; ++s) {
    const double input_layers = s == 0 ? layers - 1 : layers;
    costs.forward.push_back(layers * kForwardSeconds * share);
    costs.backward.push_back((input_layers * kInputSeconds + layers * kWeightSeconds) * share);
    costs.weight.push_back(s == 0 ? 0.0 : layers * kWeightSeconds * share);
  }
  costs.transfer = transfer;
  return costs;
}

double simulated_seconds(const std::string& schedule, int64_t chunks,
                         const pipetrain::ActionCosts& costs) {
  const auto plan = pipetrain::executed_plan(
      pipetrain::make_schedule(schedule, kStages, chunks, virtual_stages(schedule)),
      /*fused=*/false, pipetrain::recompute_below(pipetrain::CheckpointMode::kNever, chunks));
  return pipetrain::simulate_plan(plan, costs).step_time;
}

// Seconds per step one rank spent in its actions, from its Trace: forwards, backwards or their
// input halves, weight halves.
struct RankTimes {
  double forward = 0, input = 0, weight = 0;
};
// Per rank and configuration: those three, whether it split its backwards, its seconds handing
// transfers over (sends, receives posted ahead) and how many transfers it sent or received.
constexpr int kTimesPerRank = 6;

// Per rank, measured over known time of each kind of action, for `ran` (whose placement and
// whether it split its backwards say which known costs the rank's actions had); and what a
// transfer cost its rank's thread, over both ranks (ActionCosts::message).
struct Factors {
  std::vector<double> forward, input, weight;
  double per_transfer = 0;
};

// How many transfers rank `rank` sends and receives in a step of `schedule`.
int64_t transfers_per_step(const std::string& schedule, int64_t chunks, int64_t rank) {
  const auto plan = pipetrain::lower(
      pipetrain::make_schedule(schedule, kStages, chunks, virtual_stages(schedule)))[rank];
  return std::count_if(plan.begin(), plan.end(), [](const pipetrain::PlannedAction& p) {
    return p.kind == pipetrain::PlannedAction::Kind::kSend ||
           p.kind == pipetrain::PlannedAction::Kind::kReceive;
  });
}

Factors factors_of(const std::string& ran, int64_t chunks, const std::vector<RankTimes>& times,
                   bool split) {
  const auto known = known_costs(ran, kBatch / chunks, 0.0);
  const auto placement = pipetrain::stage_placement(
      pipetrain::make_schedule(ran, kStages, chunks, virtual_stages(ran)));
  const double m = static_cast<double>(chunks);
  Factors factors;
  for (int64_t r = 0; r < kStages; ++r) {
    double forward = 0, input = 0, weight = 0;
    for (size_t s = 0; s < placement.size(); ++s) {
      if (placement[s] != r) continue;
      forward += known.forward[s] * m;
      input += (split ? known.backward[s] - known.weight[s] : known.backward[s]) * m;
      weight += split ? known.weight[s] * m : 0.0;
    }
    factors.forward.push_back(times[r].forward / forward);
    factors.input.push_back(times[r].input / input);
    factors.weight.push_back(weight > 0 ? times[r].weight / weight : factors.input.back());
  }
  return factors;
}

// The known costs of `schedule`, each stage's scaled by its rank's factors: what each action
// took, the layers' own call costs included, as the Pipe's profile for "auto" measures them, and
// with `with_transfers`, what each transfer took its rank.
pipetrain::ActionCosts traced_costs(const std::string& schedule, int64_t chunks, double transfer,
                                    const Factors& f, bool with_transfers = true) {
  auto costs = known_costs(schedule, kBatch / chunks, transfer);
  if (with_transfers) costs.message = f.per_transfer;
  const auto placement = pipetrain::stage_placement(
      pipetrain::make_schedule(schedule, kStages, chunks, virtual_stages(schedule)));
  for (size_t s = 0; s < placement.size(); ++s) {
    const auto r = static_cast<size_t>(placement[s]);
    const double input = (costs.backward[s] - costs.weight[s]) * f.input[r];
    costs.forward[s] *= f.forward[r];
    costs.weight[s] *= f.weight[r];
    costs.backward[s] = input + costs.weight[s];
  }
  return costs;
}

std::unique_ptr<SgdPipe> make_pipelined(int64_t chunks, const std::string& schedule,
                                        std::shared_ptr<pipetrain::World> world,
                                        std::shared_ptr<pipetrain::Trace> trace) {
  const int64_t stages = kStages * virtual_stages(schedule);
  return std::make_unique<SgdPipe>(make_timed_model(),
                                   pipetrain::PipeOptions()
                                       .balance(std::vector<int64_t>(stages, kLayers / stages))
                                       .chunks(chunks)
                                       .checkpoint("never")
                                       .schedule(schedule)
                                       .virtual_stages(virtual_stages(schedule))
                                       .trace(std::move(trace)),
                                   std::move(world), 1e-3);
}

// Seconds per step between barriers, so that both stages' work is inside.
template <typename Fn>
double time_steps(const pipetrain::World& world, Fn&& step) {
  world.barrier();
  const auto start = Clock::now();
  for (int i = 0; i < kStepsPerTiming; ++i) step();
  world.barrier();
  return seconds_since(start) / kStepsPerTiming;
}

void run_stage() {
  use_one_thread();
  prctl(PR_SET_TIMERSLACK, 1UL);  // sleeps wake within microseconds, leaving the spin little
  auto world = pipetrain::World::connect(*pipetrain::select_cluster_environment());
  if (world->size() != kStages) throw std::runtime_error("known_costs_bench needs 2 ranks");

  torch::manual_seed(0);
  const at::Tensor inputs = torch::randn({kBatch, kWidth}),
                   targets = torch::randn({kBatch, kWidth});
  using Config = std::pair<int64_t, std::string>;
  std::map<Config, std::unique_ptr<SgdPipe>> pipes;
  std::map<Config, std::shared_ptr<pipetrain::Trace>> traces;
  std::map<int64_t, double> transfer;
  for (int64_t m : kChunks) {
    for (const auto& s : kSchedules) {
      traces[{m, s}] = std::make_shared<pipetrain::Trace>();
      pipes[{m, s}] = make_pipelined(m, s, world, traces[{m, s}]);
    }
    transfer[m] = one_way_transfer_seconds(world, kBatch / m, kWidth);
  }
  // Warm-up, and auto's steps while it chooses: it has chosen before the timed rounds.
  for (auto& [config, pipe] : pipes) {
    for (int i = 0; i < 3 || pipe->pipe().choosing_schedule(); ++i) pipe->step(inputs, targets);
  }
  for (auto& [config, trace] : traces) trace->start(*world);  // spans from the timed steps on
  std::map<Config, std::vector<double>> measured;
  const auto start = Clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (auto& [config, pipe] : pipes) {
      measured[config].push_back(time_steps(*world, [&] { pipe->step(inputs, targets); }));
    }
  }
  const std::string trace_dir = env_or("KNOWN_COSTS_TRACES", "");
  for (auto& [config, trace] : traces) {
    if (!trace_dir.empty()) {
      trace->write(*world,
                   trace_dir + "/m" + std::to_string(config.first) + "_" + config.second + ".json");
    }
  }
  // Every rank's action times per step, by configuration (in the map's order), on both ranks.
  const double steps = kRounds * kStepsPerTiming;
  at::Tensor times =
      torch::zeros({static_cast<int64_t>(traces.size()), kStages, kTimesPerRank}, torch::kFloat64);
  int64_t index = 0;
  for (auto& [config, trace] : traces) {
    const auto spans = trace->total_ms();
    const auto ms = [&](const char* name) {
      const auto it = spans.find(name);
      return it == spans.end() ? 0.0 : it->second;
    };
    auto row = times[index++][world->rank()];
    row[0] = 1e-3 * ms("forward") / steps;
    row[1] = 1e-3 * (ms("backward") + ms("input backward")) / steps;
    row[2] = 1e-3 * ms("weight backward") / steps;
    row[3] = spans.count("input backward") > 0 ? 1.0 : 0.0;  // it split its backwards
    row[4] = 1e-3 * (ms("send activation") + ms("send gradient") + ms("post receive")) / steps;
    row[5] = static_cast<double>(
        transfers_per_step(pipes[config]->pipe().schedule(), config.first, world->rank()));
  }
  const auto summed = world->all_reduce_sum(times.flatten());
  std::map<Config, Factors> factors;
  index = 0;
  for (const auto& [config, trace] : traces) {
    std::vector<RankTimes> ranks;
    bool split = false;
    double transfer_seconds = 0, transfers = 0;
    for (int64_t r = 0; r < kStages; ++r, index += kTimesPerRank) {
      const auto i = static_cast<size_t>(index);
      ranks.push_back({summed[i], summed[i + 1], summed[i + 2]});
      split = split || summed[i + 3] > 0;
      transfer_seconds += summed[i + 4];
      transfers += summed[i + 5];
    }
    // auto's candidates all hold one stage per rank, as zbh1 does.
    const std::string ran = config.second == "auto" ? "zbh1" : config.second;
    factors[config] = factors_of(ran, config.first, ranks, split);
    factors[config].per_transfer = transfer_seconds / transfers;
  }
  if (world->rank() != 0) return;

  std::printf(
      "known_costs_bench: %lld timed layers, 2 stages (4 layers per rank), batch %lld; per layer "
      "and whole batch F %.0f ms, I %.0f ms, W %.0f ms (a micro-batch takes its share); median of "
      "%d rounds x %d steps; %.0f s\n\n",
      static_cast<long long>(kLayers), static_cast<long long>(kBatch), 1e3 * kForwardSeconds,
      1e3 * kInputSeconds, 1e3 * kWeightSeconds, kRounds, kStepsPerTiming, seconds_since(start));
  std::printf(
      "| m  | schedule        | measured ms | simulated, known ms | measured / known | simulated, "
      "traced ms | measured / traced | vs 1f1b measured | vs 1f1b traced | share of the gain | "
      "share, transfers free |\n");
  std::printf(
      "|----|-----------------|-------------|---------------------|------------------|"
      "--------------------|-------------------|------------------|----------------|"
      "-------------------|-----------------------|\n");
  int auto_fastest = 0;
  for (int64_t m : kChunks) {
    const auto traced = [&](const std::string& s, bool with_transfers = true) {
      const auto of = [&](const std::string& c) {
        return simulated_seconds(c, m,
                                 traced_costs(c, m, transfer[m], factors[{m, s}], with_transfers));
      };
      if (s != "auto") return of(s);
      double best = 0;  // what auto would pick, were its profile these times
      for (const auto& c : kAutoCandidates) best = best == 0 ? of(c) : std::min(best, of(c));
      return best;
    };
    const auto known = [&](const std::string& s) {
      if (s != "auto") {
        return simulated_seconds(s, m, known_costs(s, kBatch / m, transfer[m]));
      }
      double best = 0;
      for (const auto& c : kAutoCandidates) {
        const double t = simulated_seconds(c, m, known_costs(c, kBatch / m, transfer[m]));
        best = best == 0 ? t : std::min(best, t);
      }
      return best;
    };
    const double one_f_one_b = median(measured[{m, "1f1b"}]), one_f_one_b_sim = traced("1f1b"),
                 one_f_one_b_free = traced("1f1b", false);
    std::string fastest_candidate;
    for (const auto& c : kAutoCandidates) {
      if (fastest_candidate.empty() ||
          median(measured[{m, c}]) < median(measured[{m, fastest_candidate}])) {
        fastest_candidate = c;
      }
    }
    for (const auto& s : kSchedules) {
      const double t = median(measured[{m, s}]), sim_known = known(s), sim = traced(s);
      const double gain = 1 - t / one_f_one_b, gain_sim = 1 - sim / one_f_one_b_sim;
      std::printf(
          "| %2lld | %-15s | %11.1f | %19.1f | %16.3f | %19.1f | %17.3f | %15.1f%% | %13.1f%% | ",
          static_cast<long long>(m), s.c_str(), 1e3 * t, 1e3 * sim_known, t / sim_known, 1e3 * sim,
          t / sim, 100 * gain, 100 * gain_sim);
      const double gain_free = 1 - traced(s, false) / one_f_one_b_free;
      for (const auto& [predicted, width] : {std::pair{gain_sim, 16}, std::pair{gain_free, 20}}) {
        if (predicted > 0.005) {
          std::printf("%*.0f%% |", width, 100 * gain / predicted);
        } else {
          std::printf("%*s |", width + 1, "-");
        }
      }
      std::printf("\n");
    }
    // Two configurations of one schedule measure apart by noise alone: within 0.5% is a tie.
    const std::string& ran = pipes[{m, "auto"}]->pipe().schedule();
    const double t_ran = median(measured[{m, ran}]),
                 t_fastest = median(measured[{m, fastest_candidate}]);
    if (t_ran <= 1.005 * t_fastest) ++auto_fastest;
    std::printf(
        "|    | auto ran %s (measured %.1f ms); the fastest of gpipe/1f1b/zbh1/zbh2 measured %s "
        "(%.1f ms) | | | | | | | | | |\n",
        ran.c_str(), 1e3 * t_ran, fastest_candidate.c_str(), 1e3 * t_fastest);
  }
  std::printf(
      "\nauto ran the fastest measured schedule it chooses from (or one measured within 0.5%% of "
      "it) in %d of %zu configurations.\n"
      "simulated: simulate_plan on the plan the schedule executes with the measured one-way "
      "transfer time and, per stage, the layers' known times (known) or the times its actions "
      "took in this run's Trace, the layers' own call costs included (traced: each rank's known "
      "times scaled by what its forwards, input halves and weight halves took over what they "
      "should have, as auto's profile measures them, and each send and receive taking its rank "
      "what the sends and posted receives took on average: ActionCosts::message). What is left "
      "between measured and traced is the executor's other costs: waking for receives, "
      "bookkeeping between actions. auto's simulated step is the fastest candidate's (its own "
      "pick comes from the times it profiles, printed above the table). share of the gain: the "
      "measured gain over 1F1B over the traced simulation's; transfers free: over the traced "
      "simulation's with transfers costing their ranks nothing.\n",
      auto_fastest, kChunks.size());
}

}  // namespace

int main() { return run_as_local_stages("known_costs_bench", kStages, run_stage); }
