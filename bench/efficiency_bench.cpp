// How close does a 2-stage CPU pipeline come to the ideal? The same MLP and the same m
// micro-batches are trained (a) by ONE process with one thread doing gradient accumulation over
// the micro-batches and (b) by a 2-stage Pipe, one process and one BLAS/OpenMP thread per stage,
// for m in {1, 2, 4, 8, 16}, schedules "gpipe" and "1f1b", checkpoint "never". Speedup is
// T_single / T_pipe, efficiency T_single / (p * T_pipe); the bubble allows at most m / (m + p - 1),
// so the table also shows efficiency / bound (goal: >= 0.85 at m = 8). A "simulated" column feeds
// the schedule simulator (schedule.h) the measured single-process cost per micro-batch and the
// measured one-way transfer time, to tell the bubble and communication apart from everything else.
// Needs 2 free cores. Run without torchrun; it starts its two stages itself:
//
//   cmake -S . -B build-bench -G Ninja -DPIPETRAIN_BUILD_TESTS=OFF && ninja -C build-bench
//   build-bench/bench/efficiency_bench
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/p2p.h"
#include "pipetrain/pipe.h"
#include "pipetrain/schedule.h"
#include "pipetrain/world.h"

namespace {

using pipetrain::bench::env_or;
using pipetrain::bench::make_mlp;
using pipetrain::bench::median;
using pipetrain::bench::seconds_since;
using Clock = std::chrono::steady_clock;

constexpr int64_t kStages = 2;
constexpr int64_t kBlocks = 8;
constexpr int64_t kWidth = 1024;
constexpr int64_t kBatch = 512;
constexpr int kRounds = 3;          // every configuration is timed once per round; medians reported
constexpr int kStepsPerTiming = 2;  // training steps between the two barriers of one timing
constexpr double kLearningRate = 1e-4;
const std::vector<int64_t> kChunks = {1, 2, 4, 8, 16};
const std::vector<std::string> kSchedules = {"gpipe", "1f1b"};
constexpr const char* kWorkerVariable = "PIPETRAIN_BENCH_WORKER";

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

class Pipelined {
 public:
  Pipelined(int64_t chunks, const std::string& schedule, std::shared_ptr<pipetrain::World> world)
      : pipe_(make_mlp(kBlocks, kWidth),
              pipetrain::PipeOptions()
                  .balance({kBlocks, kBlocks})
                  .chunks(chunks)
                  .checkpoint("never")
                  .schedule(schedule),
              std::move(world)),
        optimizer_(pipe_.parameters(), kLearningRate) {}
  void step(const Batch& batch) {
    optimizer_.zero_grad();
    pipe_.forward_backward(pipe_.is_first_stage() ? batch.inputs : at::Tensor(), kBatch,
                           [&](const at::Tensor& out, const pipetrain::MicroBatch& mb) {
                             return torch::mse_loss(out, batch.targets.slice(0, mb.begin, mb.end));
                           });
    optimizer_.step();
  }

 private:
  pipetrain::Pipe pipe_;
  torch::optim::SGD optimizer_;
};

// Seconds per step on this rank, between barriers, so that every stage's work is inside.
template <typename Fn>
double time_steps(const pipetrain::World& world, Fn&& step) {
  world.barrier();
  const auto start = Clock::now();
  for (int i = 0; i < kStepsPerTiming; ++i) step();
  world.barrier();
  return seconds_since(start) / kStepsPerTiming;
}

// One-way time of one micro-batch's activation between the two stages (ping-pong / 2).
double transfer_seconds(const std::shared_ptr<pipetrain::World>& world, int64_t rows) {
  pipetrain::PeerToPeer p2p(world);
  const auto tensor = torch::randn({rows, kWidth});
  const auto trip = [&] {
    if (world->rank() == 0) {
      p2p.send(tensor, 1, pipetrain::Flow::kActivation);
      p2p.recv(1, pipetrain::Flow::kGradient);
    } else {
      p2p.send(p2p.recv(0, pipetrain::Flow::kActivation), 0, pipetrain::Flow::kGradient);
    }
    p2p.wait_for_sends();
  };
  for (int i = 0; i < 3; ++i) trip();  // warm-up
  constexpr int kTrips = 20;
  world->barrier();
  const auto start = Clock::now();
  for (int i = 0; i < kTrips; ++i) trip();
  return seconds_since(start) / kTrips / 2;
}

// Step time the schedule simulator predicts from the single process's cost per micro-batch
// (split evenly over the stages, backward = 2 x forward) and the measured transfer time.
double simulated_seconds(const std::string& schedule, int64_t chunks, double single_seconds,
                         double transfer) {
  const double per_stage = single_seconds / chunks / kStages;
  auto costs = pipetrain::ActionCosts::uniform(kStages, per_stage / 3, 2 * per_stage / 3);
  costs.transfer = transfer;
  return pipetrain::simulate(pipetrain::make_schedule(schedule, kStages, chunks), costs).step_time;
}

void run_stage() {
  at::set_num_threads(1);
  auto world = pipetrain::World::connect(*pipetrain::select_cluster_environment());
  if (world->size() != kStages) throw std::runtime_error("efficiency_bench needs 2 ranks");
  const bool rank0 = world->rank() == 0;

  torch::manual_seed(0);
  const Batch batch{torch::randn({kBatch, kWidth}), torch::randn({kBatch, kWidth})};
  std::map<int64_t, std::unique_ptr<Accumulation>> singles;
  std::map<std::pair<int64_t, std::string>, std::unique_ptr<Pipelined>> pipes;
  for (int64_t m : kChunks) {
    if (rank0) singles[m] = std::make_unique<Accumulation>(m);
    for (const auto& s : kSchedules) pipes[{m, s}] = std::make_unique<Pipelined>(m, s, world);
  }
  std::map<int64_t, double> transfer;
  for (int64_t m : kChunks) transfer[m] = transfer_seconds(world, kBatch / m);

  // Warm-up: one step of everything.
  for (int64_t m : kChunks) {
    time_steps(*world, [&] {
      if (rank0) singles[m]->step(batch);
    });
    for (const auto& s : kSchedules) pipes[{m, s}]->step(batch);
  }

  // Rounds: the single-process baseline runs on rank 0 while rank 1 waits in a barrier, then the
  // pipelines run on both, so drift falls on all of them alike.
  std::map<int64_t, std::vector<double>> single_s;
  std::map<std::pair<int64_t, std::string>, std::vector<double>> pipe_s;
  const auto start = Clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (int64_t m : kChunks) {
      single_s[m].push_back(time_steps(*world, [&] {
        if (rank0) singles[m]->step(batch);
      }));
      for (const auto& s : kSchedules) {
        auto& pipe = *pipes[{m, s}];
        pipe_s[{m, s}].push_back(time_steps(*world, [&] { pipe.step(batch); }));
      }
    }
  }
  const double total = seconds_since(start);
  if (!rank0) return;

  std::printf(
      "efficiency_bench: %lld x (Linear(%lld,%lld)+ReLU), batch %lld, fp32, %lld stages "
      "(balance {%lld, %lld}), 1 thread per process, checkpoint never, SGD\n",
      static_cast<long long>(kBlocks), static_cast<long long>(kWidth),
      static_cast<long long>(kWidth), static_cast<long long>(kBatch),
      static_cast<long long>(kStages), static_cast<long long>(kBlocks),
      static_cast<long long>(kBlocks));
  std::printf(
      "median of %d rounds x %d steps per configuration (timed part: %.0f s); "
      "OMP_NUM_THREADS=%s, at::get_num_threads()=%d\n\n",
      kRounds, kStepsPerTiming, total, env_or("OMP_NUM_THREADS", "unset").c_str(),
      at::get_num_threads());
  std::printf(
      "| m  | schedule | T_single ms | T_pipe ms | speedup | efficiency | bound m/(m+p-1) "
      "| eff/bound | simulated eff/bound | transfer ms |\n");
  std::printf(
      "|----|----------|-------------|-----------|---------|------------|-----------------"
      "|-----------|---------------------|-------------|\n");
  for (int64_t m : kChunks) {
    const double t_single = median(single_s[m]);
    const double bound = static_cast<double>(m) / static_cast<double>(m + kStages - 1);
    for (const auto& s : kSchedules) {
      const double t_pipe = median(pipe_s[{m, s}]);
      const double efficiency = t_single / (kStages * t_pipe);
      const double simulated =
          t_single / (kStages * simulated_seconds(s, m, t_single, transfer[m])) / bound;
      std::printf(
          "| %2lld | %-8s | %11.1f | %9.1f | %7.2f | %10.3f | %15.3f | %9.3f | %19.3f | "
          "%11.2f |\n",
          static_cast<long long>(m), s.c_str(), 1e3 * t_single, 1e3 * t_pipe, t_single / t_pipe,
          efficiency, bound, efficiency / bound, simulated, 1e3 * transfer[m]);
    }
  }
  std::printf(
      "\ngoal: eff/bound >= 0.85 at m = 8. \"simulated\" = schedule simulator with the "
      "measured per-micro-batch cost and transfer time (bubble + transfer only).\n");
}

}  // namespace

int main() {
  try {
    if (std::getenv(kWorkerVariable) != nullptr) {
      run_stage();
      return 0;
    }
    pipetrain::LaunchOptions options;
    options.nprocs = kStages;
    options.extra_env = {
        {kWorkerVariable, "1"}, {"OMP_NUM_THREADS", "1"}, {"OPENBLAS_NUM_THREADS", "1"}};
    return pipetrain::launch_local_processes(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "efficiency_bench (rank %s): %s\n", env_or("RANK", "-").c_str(), e.what());
    return 1;
  }
}
