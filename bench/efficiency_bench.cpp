// How close does a 2-stage CPU pipeline come to the ideal? The same MLP and the same m
// micro-batches are trained (a) by ONE process with one thread doing gradient accumulation over
// the micro-batches and (b) by a 2-stage Pipe, one process and one BLAS/OpenMP thread per stage,
// for m in {1, 2, 4, 8, 16}, schedules "gpipe", "1f1b", "zbh1", "zbh2", "interleaved1f1b" and "zbv"
// (2 stages per rank), and "auto" (its picks printed by rank 0 as it makes them, m ascending),
// checkpoint "never". Speedup is
// T_single / T_pipe, efficiency T_single / (p * T_pipe); the bubble allows at most m / (m + p - 1),
// so the table also shows efficiency / bound (goal: >= 0.85 at m = 8). A "simulated" column feeds
// the schedule simulator (schedule.h) the measured single-process cost per micro-batch and the
// measured one-way transfer time, to tell the bubble and communication apart from everything else;
// the CPU time each stage used per step tells waiting apart from work. Needs 2 otherwise idle
// cores: the header line says how much CPU other processes took while it ran. Run without torchrun;
// it starts its two stages itself:
//
//   cmake -S . -B build-bench -G Ninja -DPIPETRAIN_BUILD_TESTS=OFF && ninja -C build-bench
//   build-bench/bench/efficiency_bench
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "distributed/world_connection.h"
#include "pipeline/microbatch.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/pipe.h"
#include "pipetrain/schedule.h"
#include "pipetrain/world.h"

namespace {

using namespace pipetrain::bench;  // the helpers every benchmark here shares
using Clock = std::chrono::steady_clock;

constexpr int64_t kStages = 2;
constexpr int64_t kBlocks = 8;
constexpr int64_t kWidth = 1024;
constexpr int64_t kBatch = 512;
constexpr int kRounds = 3;          // every configuration is timed once per round; medians reported
constexpr int kStepsPerTiming = 2;  // training steps between the two barriers of one timing
constexpr double kLearningRate = 1e-4;
const std::vector<int64_t> kChunks = {1, 2, 4, 8, 16};
const std::vector<std::string> kSchedules = {"gpipe",           "1f1b", "zbh1", "zbh2",
                                             "interleaved1f1b", "zbv",  "auto"};

// Stages per rank: interleaved1f1b and zbv cut each rank's 8 blocks into 2 stages of 4.
int64_t virtual_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "zbv" ? 2 : 1;
}

struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

// The baseline: the whole model in this process, gradients accumulated over the micro-batches.
class Accumulation {
 public:
  explicit Accumulation(int64_t chunks)
      : chunks_(chunks),
        model_(make_mlp(kBlocks, kWidth)),
        optimizer_(model_->parameters(), kLearningRate) {}
  void step(const Batch& batch) {
    optimizer_.zero_grad();
    for (const auto& mb : pipetrain::split_microbatches(kBatch, chunks_)) {
      const double share = static_cast<double>(mb.size()) / kBatch;
      auto out = model_->forward(batch.inputs.slice(0, mb.begin, mb.end));
      auto loss = torch::mse_loss(out, batch.targets.slice(0, mb.begin, mb.end)) * share;
      loss.backward();
    }
    optimizer_.step();
  }

 private:
  int64_t chunks_;
  torch::nn::Sequential model_;
  torch::optim::SGD optimizer_;
};

std::unique_ptr<SgdPipe> make_pipelined(int64_t chunks, const std::string& schedule,
                                        std::shared_ptr<pipetrain::World> world) {
  const int64_t stages = kStages * virtual_stages(schedule);
  return std::make_unique<SgdPipe>(make_mlp(kBlocks, kWidth),
                                   pipetrain::PipeOptions()
                                       .balance(std::vector<int64_t>(stages, 2 * kBlocks / stages))
                                       .chunks(chunks)
                                       .checkpoint("never")
                                       .schedule(schedule)
                                       .virtual_stages(virtual_stages(schedule)),
                                   std::move(world), kLearningRate);
}

struct Timing {
  double wall = 0;       // seconds per step, between barriers, so that every stage's work is inside
  double main_cpu = 0;   // CPU seconds per step of this thread (where forward and backward run)
  double other_cpu = 0;  // CPU seconds per step of this process's other threads (Gloo's)
};

template <typename Fn>
Timing time_steps(const pipetrain::World& world, Fn&& step) {
  world.barrier();
  const double process = process_cpu_seconds(), thread = thread_cpu_seconds();
  const auto start = Clock::now();
  for (int i = 0; i < kStepsPerTiming; ++i) step();
  const double main_cpu = thread_cpu_seconds() - thread;
  const double all_cpu = process_cpu_seconds() - process;
  world.barrier();
  return {seconds_since(start) / kStepsPerTiming, main_cpu / kStepsPerTiming,
          (all_cpu - main_cpu) / kStepsPerTiming};
}

// Step time the schedule simulator predicts from the single process's cost per micro-batch
// (split evenly over the stages, backward = 2 x forward, its weight half = 1 x forward: a Linear's
// three GEMMs are alike) and the measured transfer time.
double simulated_seconds(const std::string& schedule, int64_t chunks, double single_seconds,
                         double transfer) {
  if (schedule == "auto") {  // what it would pick, were the costs these
    double best = simulated_seconds("1f1b", chunks, single_seconds, transfer);
    for (const char* other : {"zbh1", "gpipe"}) {
      best = std::min(best, simulated_seconds(other, chunks, single_seconds, transfer));
    }
    return best;
  }
  const int64_t v = virtual_stages(schedule);
  const double per_stage = single_seconds / chunks / kStages / v;
  auto costs =
      pipetrain::ActionCosts::uniform(kStages * v, per_stage / 3, 2 * per_stage / 3, per_stage / 3);
  costs.transfer = transfer;
  return pipetrain::simulate(pipetrain::make_schedule(schedule, kStages, chunks, v), costs)
      .step_time;
}

void run_stage() {
  use_one_thread();
  auto world = pipetrain::World::connect(*pipetrain::select_cluster_environment());
  if (world->size() != kStages) throw std::runtime_error("efficiency_bench needs 2 ranks");
  const bool rank0 = world->rank() == 0;

  torch::manual_seed(0);
  const Batch batch{torch::randn({kBatch, kWidth}), torch::randn({kBatch, kWidth})};
  std::map<int64_t, std::unique_ptr<Accumulation>> singles;
  std::map<std::pair<int64_t, std::string>, std::unique_ptr<SgdPipe>> pipes;
  for (int64_t m : kChunks) {
    singles[m] = std::make_unique<Accumulation>(m);
    for (const auto& s : kSchedules) pipes[{m, s}] = make_pipelined(m, s, world);
  }
  std::map<int64_t, double> transfer;
  for (int64_t m : kChunks) transfer[m] = one_way_transfer_seconds(world, kBatch / m, kWidth);

  // Warm-up: one step of everything (each rank's own single-process copy included).
  for (int64_t m : kChunks) {
    time_steps(*world, [&] { singles[m]->step(batch); });
    for (const auto& s : kSchedules) pipes[{m, s}]->step(batch.inputs, batch.targets);
  }

  // Rounds: the single-process baseline runs on rank 0 while rank 1 waits in a barrier, then the
  // pipelines run on both, so drift falls on all of them alike.
  using Config = std::pair<int64_t, std::string>;
  std::map<int64_t, std::vector<double>> single_s, both_s;
  std::map<Config, std::vector<double>> pipe_s, main_cpu, other_cpu;
  const std::string load_before = load_average();
  const double busy = machine_busy_seconds(), own = process_cpu_seconds();
  const auto start = Clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (int64_t m : kChunks) {
      single_s[m].push_back(time_steps(*world, [&] {
                              if (rank0) singles[m]->step(batch);
                            }).wall);
      // Both ranks at once, each its own copy: what two busy cores deliver on this machine.
      both_s[m].push_back(time_steps(*world, [&] { singles[m]->step(batch); }).wall);
      for (const auto& s : kSchedules) {
        auto& pipe = *pipes[{m, s}];
        const auto t = time_steps(*world, [&] { pipe.step(batch.inputs, batch.targets); });
        pipe_s[{m, s}].push_back(t.wall);
        main_cpu[{m, s}].push_back(t.main_cpu);
        other_cpu[{m, s}].push_back(t.other_cpu);
      }
    }
  }
  const double total = seconds_since(start);
  const double busy_total = machine_busy_seconds() - busy;
  const double own_total = process_cpu_seconds() - own;

  // Rank 1 hands its CPU figures to rank 0 through the store.
  const auto publish = [&](const std::string& key, const std::string& text) {
    store(*world)->set(key, std::vector<uint8_t>(text.begin(), text.end()));
  };
  const auto fetch = [&](const std::string& key) {
    const auto bytes = store(*world)->get(key);
    return std::stod(std::string(bytes.begin(), bytes.end()));
  };
  const auto cpu_key = [](const Config& c, const char* which) {
    return "efficiency_bench/" + std::string(which) + "/" + std::to_string(c.first) + "/" +
           c.second;
  };
  if (!rank0) {
    for (const auto& [config, cpu] : main_cpu) {
      publish(cpu_key(config, "main"), std::to_string(median(cpu)));
      publish(cpu_key(config, "other"), std::to_string(median(other_cpu[config])));
    }
    publish("efficiency_bench/cpu_total", std::to_string(own_total));
    world->barrier();
    return;
  }
  const double others = busy_total - own_total - fetch("efficiency_bench/cpu_total");
  std::map<Config, double> stage1_main, stage1_other;
  for (const auto& [config, cpu] : main_cpu) {
    stage1_main[config] = fetch(cpu_key(config, "main"));
    stage1_other[config] = fetch(cpu_key(config, "other"));
  }
  world->barrier();

  std::printf("%s, 1 thread per process, checkpoint never, SGD\n",
              describe_mlp_stages("efficiency_bench", kBlocks, kWidth, kBatch, kStages).c_str());
  std::printf(
      "median of %d rounds x %d steps per configuration; OMP_NUM_THREADS=%s, "
      "at::get_num_threads()=%d\n",
      kRounds, kStepsPerTiming, env_or("OMP_NUM_THREADS", "unset").c_str(), at::get_num_threads());
  std::printf(
      "load average before %s, after %s; other processes used %.1f CPU-s during the "
      "%.0f s timed part (%ld CPUs)\n\n",
      load_before.c_str(), load_average().c_str(), others, total, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "| m  | schedule | T_single ms | T_pipe ms | speedup | efficiency | bound m/(m+p-1) | "
      "eff/bound |\n");
  std::printf(
      "|----|----------|-------------|-----------|---------|------------|-----------------|"
      "-----------|\n");
  std::string where_rows;  // the second table's, filled as the first is printed
  for (int64_t m : kChunks) {
    const double t_single = median(single_s[m]);
    const double bound = static_cast<double>(m) / static_cast<double>(m + kStages - 1);
    for (const auto& s : kSchedules) {
      const Config c{m, s};
      const double t_pipe = median(pipe_s[c]);
      const double efficiency = t_single / (kStages * t_pipe);
      std::printf("| %2lld | %-8s | %11.1f | %9.1f | %7.2f | %10.3f | %15.3f | %9.3f |\n",
                  static_cast<long long>(m), s.c_str(), 1e3 * t_single, 1e3 * t_pipe,
                  t_single / t_pipe, efficiency, bound, efficiency / bound);
      const double simulated =
          t_single / (kStages * simulated_seconds(s, m, t_single, transfer[m])) / bound;
      where_rows += format(
          "| %2lld | %-8s | %19.3f | %14.3f | %11.2f | %15.1f | %20.1f + %13.1f | %20.1f + "
          "%13.1f |\n",
          static_cast<long long>(m), s.c_str(), simulated, t_single / median(both_s[m]),
          1e3 * transfer[m], 1e3 * t_single / 2, 1e3 * median(main_cpu[c]),
          1e3 * median(other_cpu[c]), 1e3 * stage1_main[c], 1e3 * stage1_other[c]);
    }
  }
  std::printf("\ngoal: eff/bound >= 0.85 at m = 8\n\nwhere the time goes:\n\n");
  std::printf(
      "| m  | schedule | simulated eff/bound | 2-core ceiling | transfer ms | T_single / 2 ms | "
      "stage 0 CPU ms: main + other threads | stage 1 CPU ms: main + other threads |\n");
  std::printf(
      "|----|----------|---------------------|----------------|-------------|-----------------|"
      "--------------------------------------|--------------------------------------|\n");
  std::printf("%s", where_rows.c_str());
  std::printf(
      "\nsimulated: eff/bound the schedule simulator predicts from the measured single-process "
      "cost per micro-batch (half per stage, backward = 2 x forward, W = 1 x forward) and transfer "
      "time, i.e. with "
      "bubble and transfer latency as the only losses. 2-core ceiling: T_single over the time of "
      "the same single-process step run by both ranks at once (1.0 when two busy cores are as "
      "fast as one). transfer: one-way time of one micro-batch's activation (ping-pong / 2). "
      "stage CPU ms: CPU time per pipelined step of the stage's main thread (forward, backward, "
      "optimizer; ideal T_single / 2) and of its other threads (Gloo's I/O loop), which compete "
      "with the main threads for the 2 cores.\n");
}

}  // namespace

int main() { return run_as_local_stages("efficiency_bench", kStages, run_stage); }
