// How much activation memory does each checkpoint mode keep per stage? A 2-stage Pipe (m = 8
// micro-batches, schedules "gpipe" and "1f1b") is trained with checkpoint "never", "except_last"
// and "always" while every CPU tensor allocation goes through a counting allocator installed
// before any tensor exists. For each stage the table shows the peak of live tensor bytes during
// one forward_backward minus the live bytes just before it (parameters, gradients and inputs
// already exist then: one warm-up step runs first), i.e. exactly what the schedule adds.
// Run without torchrun; it starts its two stages itself:
//
//   cmake -S . -B build-bench -G Ninja -DPIPETRAIN_BUILD_TESTS=OFF && ninja -C build-bench
//   build-bench/bench/memory_bench
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "distributed/world_connection.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"

namespace {

using namespace pipetrain::bench;  // the helpers every benchmark here shares

constexpr int64_t kStages = 2;
// Activations, not weights, should dominate: 8 blocks per stage, narrow layers, a large batch.
constexpr int64_t kBlocks = 16;
constexpr int64_t kWidth = 256;
constexpr int64_t kBatch = 2048;
constexpr int64_t kChunks = 8;
const std::vector<std::string> kSchedules = {"gpipe", "1f1b"};
const std::vector<std::string> kModes = {"never", "except_last", "always"};

// Forwards to the allocator it wraps and counts the bytes of live allocations and their peak.
// Each DataPtr it returns owns the wrapped allocator's DataPtr in a heap context, so memory is
// released exactly as the wrapped allocator wants.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t bytes) const override {
    auto* context = new Context{wrapped_->allocate(bytes), bytes, this};
    void* data = context->inner.get();
    const auto device = context->inner.device();
    const int64_t live = live_.fetch_add(bytes) + static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return {data, context, &release, device};
  }

  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  struct Context {
    c10::DataPtr inner;
    size_t bytes;
    const CountingAllocator* owner;
  };
  static void release(void* ptr) {
    auto* context = static_cast<Context*>(ptr);
    context->owner->live_.fetch_sub(static_cast<int64_t>(context->bytes));
    delete context;
  }

  c10::Allocator* wrapped_;
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

CountingAllocator& counting_allocator() {
  static CountingAllocator* allocator = new CountingAllocator(c10::GetDefaultCPUAllocator());
  return *allocator;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct Measured {
  int64_t peak = 0;      // peak live bytes during forward_backward minus live bytes before it
  int64_t retained = 0;  // live bytes after it minus before
};

Measured measure(const std::shared_ptr<pipetrain::World>& world, const std::string& schedule,
                 const std::string& mode) {
  pipetrain::Pipe pipe(make_mlp(kBlocks, kWidth),
                       pipetrain::PipeOptions()
                           .balance({kBlocks, kBlocks})
                           .chunks(kChunks)
                           .checkpoint(mode)
                           .schedule(schedule),
                       world);
  torch::optim::SGD optimizer(pipe.parameters(), 1e-4);
  torch::manual_seed(0);
  const auto inputs = torch::randn({kBatch, kWidth});
  const auto targets = torch::randn({kBatch, kWidth});
  const auto step = [&] {
    optimizer.zero_grad();
    pipe.forward_backward(pipe.is_first_stage() ? inputs : at::Tensor(), kBatch,
                          [&](const at::Tensor& out, const pipetrain::MicroBatch& mb) {
                            return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
                          });
  };
  step();  // warm-up: gradients exist from here on
  optimizer.step();
  world->barrier();

  auto& counter = counting_allocator();
  optimizer.zero_grad();
  const int64_t before = counter.live();
  counter.reset_peak();
  pipe.forward_backward(pipe.is_first_stage() ? inputs : at::Tensor(), kBatch,
                        [&](const at::Tensor& out, const pipetrain::MicroBatch& mb) {
                          return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
                        });
  Measured measured{counter.peak() - before, counter.live() - before};
  world->barrier();
  return measured;
}

std::string key(const std::string& schedule, const std::string& mode) {
  return "memory_bench/" + schedule + "/" + mode;
}

void run_stage() {
  pipetrain::bench::use_one_thread();
  auto world = pipetrain::World::connect(*pipetrain::select_cluster_environment());
  if (world->size() != kStages) throw std::runtime_error("memory_bench needs 2 ranks");

  std::map<std::pair<std::string, std::string>, Measured> mine;
  for (const auto& s : kSchedules) {
    for (const auto& mode : kModes) mine[{s, mode}] = measure(world, s, mode);
  }
  if (world->rank() != 0) {
    for (const auto& [config, m] : mine) {
      const std::string text = std::to_string(m.peak) + " " + std::to_string(m.retained);
      store(*world)->set(key(config.first, config.second),
                         std::vector<uint8_t>(text.begin(), text.end()));
    }
    world->barrier();
    return;
  }
  std::map<std::pair<std::string, std::string>, Measured> last;
  for (const auto& s : kSchedules) {
    for (const auto& mode : kModes) {
      const auto bytes = store(*world)->get(key(s, mode));
      long long peak = 0, retained = 0;
      std::sscanf(std::string(bytes.begin(), bytes.end()).c_str(), "%lld %lld", &peak, &retained);
      last[{s, mode}] = {peak, retained};
    }
  }
  world->barrier();

  const int64_t rows = kBatch / kChunks;
  std::printf("%s, chunks %lld\n",
              describe_mlp_stages("memory_bench", kBlocks, kWidth, kBatch, kStages).c_str(),
              static_cast<long long>(kChunks));
  std::printf("one micro-batch activation (%lld x %lld fp32) = %.2f MiB; whole batch = %.2f MiB\n",
              static_cast<long long>(rows), static_cast<long long>(kWidth), mib(rows * kWidth * 4),
              mib(kBatch * kWidth * 4));
  std::printf(
      "largest parameter = %.2f MiB: its gradient is computed into a new tensor and then added "
      "to .grad, so one such temporary can be part of any peak\n",
      mib(kWidth * kWidth * 4));
  std::printf(
      "peak = max live CPU tensor bytes during one forward_backward minus live bytes "
      "before it; retained = live after minus before\n\n");
  std::printf(
      "| schedule | checkpoint  | stage 0 peak MiB | stage 1 peak MiB | stage 0 retained "
      "MiB | stage 1 retained MiB |\n");
  std::printf(
      "|----------|-------------|------------------|------------------|------------------"
      "----|----------------------|\n");
  for (const auto& s : kSchedules) {
    for (const auto& mode : kModes) {
      const auto& a = mine[{s, mode}];
      const auto& b = last[{s, mode}];
      std::printf("| %-8s | %-11s | %16.2f | %16.2f | %20.2f | %20.2f |\n", s.c_str(), mode.c_str(),
                  mib(a.peak), mib(b.peak), mib(a.retained), mib(b.retained));
    }
  }
}

}  // namespace

int main() {
  // Before any tensor exists, so that every allocation is counted and freed through the wrapper.
  c10::SetCPUAllocator(&counting_allocator(), /*priority=*/UINT8_MAX);
  return run_as_local_stages("memory_bench", kStages, run_stage);
}
