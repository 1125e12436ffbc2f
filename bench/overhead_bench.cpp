// What does pipetrain cost when it has nothing to pipeline? Trains the same MLP for the same steps
// once through a one-stage Pipe (chunks 1, checkpoint "never", single-process World) and once with
// a plain hand-written libtorch loop, and prints ms/step for both and their ratio (goal: <= 1.03).
// The two loops alternate over several rounds, first one then the other, and the table reports
// medians, so that clock and cache drift fall on both alike. CPU time per step is shown beside
// wall time, and the CPU time other processes took meanwhile, so a run on a busy machine shows it.
//
//   cmake -S . -B build-bench -G Ninja -DPIPETRAIN_BUILD_TESTS=OFF && ninja -C build-bench
//   build-bench/bench/overhead_bench
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "bench_common.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"

namespace {

using namespace pipetrain::bench;  // the helpers every benchmark here shares
using Clock = std::chrono::steady_clock;

constexpr int64_t kBlocks = 8;
constexpr int64_t kWidth = 512;
constexpr int64_t kBatch = 256;
constexpr int kRounds = 9;
constexpr int kStepsPerRound = 10;
constexpr double kLearningRate = 1e-3;

struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

// The loop every libtorch tutorial writes; the baseline.
class PlainLoop {
 public:
  PlainLoop()
      : model_(make_mlp(kBlocks, kWidth)), optimizer_(model_->parameters(), kLearningRate) {}
  void step(const Batch& batch) {
    optimizer_.zero_grad();
    auto loss = torch::mse_loss(model_->forward(batch.inputs), batch.targets);
    loss.backward();
    optimizer_.step();
  }

 private:
  torch::nn::Sequential model_;
  torch::optim::SGD optimizer_;
};

// The same training step through a one-stage Pipe.
class PipeLoop {
 public:
  PipeLoop()
      : pipe_(make_mlp(kBlocks, kWidth),
              pipetrain::PipeOptions().balance({2 * kBlocks}).chunks(1).checkpoint("never"),
              std::make_shared<pipetrain::World>(), kLearningRate) {}
  void step(const Batch& batch) { pipe_.step(batch.inputs, batch.targets); }

 private:
  SgdPipe pipe_;
};

struct Timing {
  double wall_ms = 0;  // per step
  double cpu_ms = 0;   // per step, this process's CPU time
};

template <typename Loop>
Timing time_round(Loop& loop, const Batch& batch) {
  const double cpu = process_cpu_seconds();
  const auto start = Clock::now();
  for (int i = 0; i < kStepsPerRound; ++i) loop.step(batch);
  return {1e3 * seconds_since(start) / kStepsPerRound,
          1e3 * (process_cpu_seconds() - cpu) / kStepsPerRound};
}

}  // namespace

int main() {
  pipetrain::bench::use_one_thread();
  torch::manual_seed(0);
  const Batch batch{torch::randn({kBatch, kWidth}), torch::randn({kBatch, kWidth})};
  PlainLoop plain;
  PipeLoop pipe;
  for (int i = 0; i < 3; ++i) {  // warm-up: allocator, BLAS buffers, autograd graph caches
    plain.step(batch);
    pipe.step(batch);
  }

  const std::string load_before = load_average();
  const double busy = machine_busy_seconds(), own = process_cpu_seconds();
  const auto start = Clock::now();
  std::vector<Timing> plain_t, pipe_t;
  for (int round = 0; round < kRounds; ++round) {
    if (round % 2 == 0) {
      plain_t.push_back(time_round(plain, batch));
      pipe_t.push_back(time_round(pipe, batch));
    } else {
      pipe_t.push_back(time_round(pipe, batch));
      plain_t.push_back(time_round(plain, batch));
    }
  }
  const double wall = seconds_since(start);
  const double others = (machine_busy_seconds() - busy) - (process_cpu_seconds() - own);

  const auto column = [](const std::vector<Timing>& t, double Timing::*field) {
    std::vector<double> v;
    for (const auto& x : t) v.push_back(x.*field);
    return v;
  };
  const auto ratios = [&](double Timing::*field) {
    std::vector<double> r;
    for (int i = 0; i < kRounds; ++i) r.push_back(pipe_t[i].*field / plain_t[i].*field);
    return r;
  };
  std::printf(
      "overhead_bench: %lld x (Linear(%lld,%lld)+ReLU), batch %lld, fp32, %d thread(s), "
      "SGD\n",
      static_cast<long long>(kBlocks), static_cast<long long>(kWidth),
      static_cast<long long>(kWidth), static_cast<long long>(kBatch), at::get_num_threads());
  std::printf("%d rounds of %d steps each, alternating; medians over rounds\n", kRounds,
              kStepsPerRound);
  std::printf(
      "load average before %s, after %s; other processes used %.1f CPU-s during the "
      "%.1f s timed part (%ld CPUs)\n\n",
      load_before.c_str(), load_average().c_str(), others, wall, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "| loop                     | wall ms/step median | min     | max     | CPU ms/step "
      "median |\n");
  std::printf(
      "|--------------------------|---------------------|---------|---------|-----------"
      "--------|\n");
  const auto row = [&](const char* name, const std::vector<Timing>& t) {
    const auto wall_ms = column(t, &Timing::wall_ms);
    std::printf("| %-24s | %19.2f | %7.2f | %7.2f | %18.2f |\n", name, median(wall_ms),
                *std::min_element(wall_ms.begin(), wall_ms.end()),
                *std::max_element(wall_ms.begin(), wall_ms.end()),
                median(column(t, &Timing::cpu_ms)));
  };
  row("plain libtorch loop", plain_t);
  row("Pipe, 1 stage, chunks 1", pipe_t);
  const auto wall_ratio = ratios(&Timing::wall_ms);
  std::printf(
      "\nratio pipe/plain, median of per-round ratios: wall %.3f (min %.3f, max %.3f), "
      "CPU time %.3f; goal <= 1.03\n",
      median(wall_ratio), *std::min_element(wall_ratio.begin(), wall_ratio.end()),
      *std::max_element(wall_ratio.begin(), wall_ratio.end()), median(ratios(&Timing::cpu_ms)));
  return 0;
}
