// What does pipetrain cost when it has nothing to pipeline? Trains the same MLP for the same steps
// once through a one-stage Pipe (chunks 1, checkpoint "never", single-process World) and once with
// a plain hand-written libtorch loop, and prints ms/step for both and their ratio (goal: <= 1.03).
// The two loops alternate over several rounds, first one then the other, and the table reports
// medians, so that clock and cache drift fall on both alike.
//
//   cmake -S . -B build-bench -G Ninja -DPIPETRAIN_BUILD_TESTS=OFF && ninja -C build-bench
//   OMP_NUM_THREADS=1 build-bench/bench/overhead_bench
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "bench_common.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"

namespace {

using pipetrain::bench::make_mlp;
using pipetrain::bench::median;
using pipetrain::bench::seconds_since;
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
              std::make_shared<pipetrain::World>()),
        optimizer_(pipe_.parameters(), kLearningRate) {}
  void step(const Batch& batch) {
    optimizer_.zero_grad();
    pipe_.forward_backward(batch.inputs, kBatch,
                           [&](const at::Tensor& out, const pipetrain::MicroBatch& mb) {
                             return torch::mse_loss(out, batch.targets.slice(0, mb.begin, mb.end));
                           });
    optimizer_.step();
  }

 private:
  pipetrain::Pipe pipe_;
  torch::optim::SGD optimizer_;
};

// Milliseconds per step over kStepsPerRound steps.
template <typename Loop>
double time_round(Loop& loop, const Batch& batch) {
  const auto start = Clock::now();
  for (int i = 0; i < kStepsPerRound; ++i) loop.step(batch);
  return 1e3 * seconds_since(start) / kStepsPerRound;
}

}  // namespace

int main() {
  at::set_num_threads(1);
  torch::manual_seed(0);
  const Batch batch{torch::randn({kBatch, kWidth}), torch::randn({kBatch, kWidth})};
  PlainLoop plain;
  PipeLoop pipe;
  for (int i = 0; i < 3; ++i) {  // warm-up: allocator, BLAS buffers, autograd graph caches
    plain.step(batch);
    pipe.step(batch);
  }

  std::vector<double> plain_ms, pipe_ms, ratios;
  for (int round = 0; round < kRounds; ++round) {
    double p = 0, q = 0;
    if (round % 2 == 0) {
      p = time_round(plain, batch);
      q = time_round(pipe, batch);
    } else {
      q = time_round(pipe, batch);
      p = time_round(plain, batch);
    }
    plain_ms.push_back(p);
    pipe_ms.push_back(q);
    ratios.push_back(q / p);
  }

  std::printf(
      "overhead_bench: %lld x (Linear(%lld,%lld)+ReLU), batch %lld, fp32, %d thread(s), "
      "SGD\n",
      static_cast<long long>(kBlocks), static_cast<long long>(kWidth),
      static_cast<long long>(kWidth), static_cast<long long>(kBatch), at::get_num_threads());
  std::printf("%d rounds of %d steps each, alternating; medians over rounds\n\n", kRounds,
              kStepsPerRound);
  std::printf("| loop                         | ms/step (median) | min     | max     |\n");
  std::printf("|------------------------------|------------------|---------|---------|\n");
  const auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("| %-28s | %16.2f | %7.2f | %7.2f |\n", name, median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
  };
  row("plain libtorch loop", plain_ms);
  row("Pipe, 1 stage, chunks 1", pipe_ms);
  std::printf(
      "\nratio pipe/plain: median of per-round ratios %.3f (min %.3f, max %.3f); "
      "goal <= 1.03\n",
      median(ratios), *std::min_element(ratios.begin(), ratios.end()),
      *std::max_element(ratios.begin(), ratios.end()));
  return 0;
}
