// Does the executor run the plan the simulator predicts? Two stages whose layers take KNOWN times:
// each layer's forward, input-gradient and weight-gradient halves wait for a fixed time per row
// (and compute a tiny elementwise product, so that tensors, autograd and the B/I/W split are the
// real ones). The two processes then need no CPU for their "compute", so the step time does not
// move with this machine's two busy cores, and the simulator can be fed the exact costs
// (simulate_plan on the plan each schedule executes, plus the measured transfer time).
// What it tells apart from efficiency_bench: the executor's own losses (waiting, sends and
// receives, autograd) against the bubble the schedule leaves, which the simulation contains.
//
// For m in {1, 2, 4, 8, 16} and every schedule ("auto" too): measured step, simulated step, their
// ratio, the gain over 1F1B measured and simulated, and whether auto ran within 2% of the fastest
// of the schedules it chooses from. Run it as efficiency_bench (it starts its two stages itself):
//
//   build/bench/known_costs_bench
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
#include "pipetrain/cluster_environment.h"
#include "pipetrain/pipe.h"
#include "pipetrain/plan.h"
#include "pipetrain/recompute.h"
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
const std::vector<int64_t> kChunks = {1, 2, 4, 8, 16};
const std::vector<std::string> kSchedules = {"gpipe",           "1f1b", "zbh1", "zbh2",
                                             "interleaved1f1b", "zbv",  "auto"};
const std::vector<std::string> kAutoCandidates = {"gpipe", "1f1b", "zbh1", "zbh2"};

int64_t virtual_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "zbv" ? 2 : 1;
}

// Seconds the layers' waits ran past their time in this process, summed: what the timer adds to
// the known costs (the simulation does not see it).
double g_overshoot_seconds = 0;

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
  g_overshoot_seconds += std::chrono::duration<double>(Clock::now() - deadline).count();
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

double simulated_seconds(const std::string& schedule, int64_t chunks, double transfer) {
  const auto plan = pipetrain::executed_plan(
      pipetrain::make_schedule(schedule, kStages, chunks, virtual_stages(schedule)),
      /*fused=*/false, pipetrain::recompute_below(pipetrain::CheckpointMode::kNever, chunks));
  return pipetrain::simulate_plan(plan, known_costs(schedule, kBatch / chunks, transfer)).step_time;
}

std::unique_ptr<SgdPipe> make_pipelined(int64_t chunks, const std::string& schedule,
                                        std::shared_ptr<pipetrain::World> world) {
  const int64_t stages = kStages * virtual_stages(schedule);
  return std::make_unique<SgdPipe>(make_timed_model(),
                                   pipetrain::PipeOptions()
                                       .balance(std::vector<int64_t>(stages, kLayers / stages))
                                       .chunks(chunks)
                                       .checkpoint("never")
                                       .schedule(schedule)
                                       .virtual_stages(virtual_stages(schedule)),
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
  std::map<int64_t, double> transfer;
  for (int64_t m : kChunks) {
    for (const auto& s : kSchedules) pipes[{m, s}] = make_pipelined(m, s, world);
    transfer[m] = one_way_transfer_seconds(world, kBatch / m, kWidth);
  }
  // Warm-up, and auto's two profiled steps: it picks before the timed rounds.
  for (int i = 0; i < 3; ++i) {
    for (auto& [config, pipe] : pipes) pipe->step(inputs, targets);
  }
  std::map<Config, std::vector<double>> measured, overshoot;
  const auto start = Clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (auto& [config, pipe] : pipes) {
      const double overshoot_before = g_overshoot_seconds;
      measured[config].push_back(time_steps(*world, [&] { pipe->step(inputs, targets); }));
      overshoot[config].push_back((g_overshoot_seconds - overshoot_before) / kStepsPerTiming);
    }
  }
  // Both stages' overshoot per step, summed, by configuration (in the map's order).
  std::vector<double> own_overshoot;
  for (const auto& [config, values] : overshoot) own_overshoot.push_back(median(values));
  const auto both_overshoot = world->all_reduce_sum(torch::tensor(own_overshoot, torch::kFloat64));
  std::map<Config, double> mean_overshoot;
  size_t index = 0;
  for (const auto& [config, values] : overshoot) {
    mean_overshoot[config] = both_overshoot[index++] / kStages;
  }
  if (world->rank() != 0) return;

  std::printf(
      "known_costs_bench: %lld timed layers, 2 stages (4 layers per rank), batch %lld; per layer "
      "and whole batch F %.0f ms, I %.0f ms, W %.0f ms (a micro-batch takes its share); median of "
      "%d rounds x %d steps; %.0f s\n\n",
      static_cast<long long>(kLayers), static_cast<long long>(kBatch), 1e3 * kForwardSeconds,
      1e3 * kInputSeconds, 1e3 * kWeightSeconds, kRounds, kStepsPerTiming, seconds_since(start));
  std::printf(
      "| m  | schedule        | measured ms | simulated ms | measured / simulated | vs 1f1b "
      "measured | vs 1f1b simulated | share of the simulated gain | timer overshoot ms |\n");
  std::printf(
      "|----|-----------------|-------------|--------------|----------------------|--------------"
      "----|-------------------|-----------------------------|--------------------|\n");
  int auto_fastest = 0;
  for (int64_t m : kChunks) {
    const double one_f_one_b = median(measured[{m, "1f1b"}]);
    const double one_f_one_b_sim = simulated_seconds("1f1b", m, transfer[m]);
    double best_candidate = 0, auto_sim = 0;
    for (const auto& c : kAutoCandidates) {
      const double t = median(measured[{m, c}]);
      best_candidate = best_candidate == 0 ? t : std::min(best_candidate, t);
      const double sim = simulated_seconds(c, m, transfer[m]);
      auto_sim = auto_sim == 0 ? sim : std::min(auto_sim, sim);
    }
    for (const auto& s : kSchedules) {
      const double t = median(measured[{m, s}]);
      const double sim = s == "auto" ? auto_sim : simulated_seconds(s, m, transfer[m]);
      const double gain = 1 - t / one_f_one_b, gain_sim = 1 - sim / one_f_one_b_sim;
      std::printf("| %2lld | %-15s | %11.1f | %12.1f | %20.3f | %16.1f%% | %16.1f%% | ",
                  static_cast<long long>(m), s.c_str(), 1e3 * t, 1e3 * sim, t / sim, 100 * gain,
                  100 * gain_sim);
      if (gain_sim > 0.005) {
        std::printf("%26.0f%% | ", 100 * gain / gain_sim);
      } else {
        std::printf("%27s | ", "-");
      }
      std::printf("%18.2f |\n", 1e3 * mean_overshoot[{m, s}]);
    }
    const double t_auto = median(measured[{m, "auto"}]);
    if (t_auto <= 1.02 * best_candidate) ++auto_fastest;
    std::printf("|    | auto vs fastest of gpipe/1f1b/zbh1/zbh2 | %.1f vs %.1f ms | | | | | | |\n",
                1e3 * t_auto, 1e3 * best_candidate);
  }
  std::printf(
      "\nauto ran within 2%% of the fastest schedule it chooses from in %d of %zu configurations.\n"
      "simulated: simulate_plan on the plan the schedule executes, with the layers' known times "
      "and the measured one-way transfer time; auto's simulated step is the fastest candidate's "
      "(its own pick comes from the times it profiles, printed above the table). timer overshoot: "
      "per step and stage (mean of the two), how much later than their time the layers' waits "
      "ended; the simulation does not contain it.\n",
      auto_fastest, kChunks.size());
}

}  // namespace

int main() { return run_as_local_stages("known_costs_bench", kStages, run_stage); }
