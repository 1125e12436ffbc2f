#include "train/memory_report.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/resource.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <cstdio>
#include <set>
#include <stdexcept>

#ifdef PIPETRAIN_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "pipetrain/module.h"
#include "pipetrain/world.h"
#include "util/compat.h"

namespace pipetrain {

namespace {

// How many tensors the size of a parameter an optimizer with `options` keeps for it; -1 for an
// optimizer other than these.
int64_t state_tensors_per_parameter(const torch::optim::OptimizerOptions& options) {
  using namespace torch::optim;
  if (const auto* adamw = dynamic_cast<const AdamWOptions*>(&options)) {
    return adamw->amsgrad() ? 3 : 2;
  }
  if (const auto* adam = dynamic_cast<const AdamOptions*>(&options)) return adam->amsgrad() ? 3 : 2;
  if (const auto* sgd = dynamic_cast<const SGDOptions*>(&options)) {
    return sgd->momentum() != 0 ? 1 : 0;
  }
  if (const auto* rmsprop = dynamic_cast<const RMSpropOptions*>(&options)) {
    return 1 + (rmsprop->momentum() != 0 ? 1 : 0) + (rmsprop->centered() ? 1 : 0);
  }
  if (dynamic_cast<const AdagradOptions*>(&options) != nullptr) return 1;
  return -1;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

MemoryFigures memory_figures(const Module& module, const torch::optim::Optimizer& optimizer) {
  MemoryFigures figures;
  std::set<const c10::TensorImpl*> seen;
  const auto layers = module.local_layers();
  for (const auto& p : layers->parameters()) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const auto bytes = static_cast<int64_t>(p.nbytes());
    figures.parameters += bytes;
    if (p.requires_grad()) figures.gradients += bytes;
  }
  for (const auto& b : layers->buffers()) figures.parameters += static_cast<int64_t>(b.nbytes());
  std::set<const c10::TensorImpl*> stepped;
  for (const auto& group : optimizer.param_groups()) {
    const int64_t tensors = state_tensors_per_parameter(group.options());
    if (tensors < 0) figures.optimizer_state_known = false;
    for (const auto& p : group.params()) {
      // A frozen parameter gets no gradient, so the optimizer keeps no state for it.
      if (!p.requires_grad()) continue;
      if (stepped.insert(p.unsafeGetTensorImpl()).second) {
        figures.optimizer_state += tensors * static_cast<int64_t>(p.nbytes());
      }
    }
  }
  return figures;
}

std::vector<MemoryFigures> gather_memory_figures(const World& world, const MemoryFigures& mine) {
  constexpr int64_t kFields = 4;
  auto values = at::zeros({world.size() * kFields}, at::kDouble);
  const int64_t slot = world.rank() * kFields;
  values[slot] = static_cast<double>(mine.parameters);
  values[slot + 1] = static_cast<double>(mine.gradients);
  values[slot + 2] = mine.optimizer_state_known ? static_cast<double>(mine.optimizer_state) : -1;
  values[slot + 3] = static_cast<double>(mine.first_step_peak);
  const auto sums = world.all_reduce_sum(values.to(world.device()));
  std::vector<MemoryFigures> ranks(static_cast<size_t>(world.size()));
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].parameters = static_cast<int64_t>(sums[r * kFields]);
    ranks[r].gradients = static_cast<int64_t>(sums[r * kFields + 1]);
    ranks[r].optimizer_state_known = sums[r * kFields + 2] >= 0;
    ranks[r].optimizer_state =
        ranks[r].optimizer_state_known ? static_cast<int64_t>(sums[r * kFields + 2]) : 0;
    ranks[r].first_step_peak = static_cast<int64_t>(sums[r * kFields + 3]);
  }
  return ranks;
}

std::string memory_table(const std::vector<MemoryFigures>& ranks) {
  const bool measured = !ranks.empty() && ranks.front().first_step_peak >= 0;
  std::string table = measured ? "memory per rank after the first step, MiB\n"
                               : "memory per rank, MiB (activations come with the first step)\n";
  table += "rank  parameters  gradients  optimizer state  first step's peak  total\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    const MemoryFigures& f = ranks[r];
    char row[160];
    std::snprintf(
        row, sizeof row, "%4zu  %10s  %9s  %15s  %17s  %s\n", r, mib(f.parameters).c_str(),
        mib(f.gradients).c_str(), f.optimizer_state_known ? mib(f.optimizer_state).c_str() : "?",
        f.first_step_peak >= 0 ? mib(f.first_step_peak).c_str() : "-", mib(f.total()).c_str());
    table += row;
  }
  table.pop_back();
  return table;
}

std::map<std::string, double> memory_metrics(const std::vector<MemoryFigures>& ranks) {
  std::map<std::string, double> metrics;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const MemoryFigures& f = ranks[r];
    const std::string rank = "_memory_mib/rank_" + std::to_string(r);
    const auto in_mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
    metrics["parameter" + rank] = in_mib(f.parameters);
    metrics["gradient" + rank] = in_mib(f.gradients);
    if (f.optimizer_state_known) metrics["optimizer_state" + rank] = in_mib(f.optimizer_state);
    if (f.first_step_peak >= 0) metrics["first_step_peak" + rank] = in_mib(f.first_step_peak);
  }
  return metrics;
}

void check_memory_limit(const std::vector<MemoryFigures>& ranks, int64_t max_memory) {
  if (max_memory <= 0) return;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const MemoryFigures& f = ranks[r];
    if (!f.optimizer_state_known) {
      throw std::invalid_argument(
          "max_memory (--max-memory) is set, but pipetrain cannot count the state of rank " +
          std::to_string(r) +
          "'s optimizer (not SGD, Adam, AdamW, RMSprop or Adagrad): use one of those, or leave "
          "max_memory at 0");
    }
    if (f.total() <= max_memory) continue;
    const bool measured = f.first_step_peak >= 0;
    throw std::invalid_argument(
        "rank " + std::to_string(r) + " needs " + mib(f.total()) + " MiB (parameters " +
        mib(f.parameters) + ", optimizer state " + mib(f.optimizer_state) +
        (measured ? ", the first step's activations, gradients and workspace at their peak " +
                        mib(f.first_step_peak)
                  : ", gradients " + mib(f.gradients) + ", before any activation") +
        " MiB), more than max_memory (--max-memory) " + mib(max_memory) +
        " MiB; nothing was trained. To fit: split the model over more stages (--devices under "
        "pipe, --stages under ddp_pipe), share the optimizer state among replicas (--zero-stage 1 "
        "under ddp or ddp_pipe), train bf16 weights (--precision bf16-true)" +
        (measured ? ", recompute activations (--checkpoint always), hold fewer micro-batches "
                    "(--schedule 1f1b, --max-in-flight) or smaller ones (more --chunks, a smaller "
                    "--batch-size)"
                  : "") +
        ", or raise the limit");
  }
}

namespace {

// CPU memory as the default allocator gives it (c10::alloc_cpu), counted: live bytes and their
// peak. Each block carries its size in a header before the data, and its DataPtr's context is the
// data itself, as ATen's raw_allocate() requires.
class CountingAllocator final : public AllocatorCompat {
 public:
  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  // alloc_cpu's alignment, so that the data after the header is aligned as the default's.
  static constexpr size_t kHeader = 64;

  c10::DataPtr allocate_bytes(size_t bytes) const override {
    if (bytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::kCPU)};
    auto* block = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
    *reinterpret_cast<int64_t*>(block) = static_cast<int64_t>(bytes);
    const int64_t live = live_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    void* data = block + kHeader;
    return {data, data, &release, c10::Device(c10::kCPU)};
  }

  static void release(void* data);

  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

// One for the process, never destroyed: memory it handed out may be freed at any time.
CountingAllocator& counting_allocator() {
  static auto* allocator = new CountingAllocator();
  return *allocator;
}

void CountingAllocator::release(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  counting_allocator().live_.fetch_sub(*reinterpret_cast<int64_t*>(block));
  c10::free_cpu(block);
}

}  // namespace

StepMemoryMeter::StepMemoryMeter(const c10::Device& device) : device_(device) {
#ifdef PIPETRAIN_HAS_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    start_ =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
    return;
  }
#endif
  CountingAllocator& counter = counting_allocator();
  replaced_ = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counter);
  if (c10::GetCPUAllocator() != &counter) {  // one of higher priority is installed
    replaced_ = nullptr;
    return;
  }
  counter.reset_peak();
  start_ = counter.live();
}

StepMemoryMeter::~StepMemoryMeter() {
  if (replaced_ != nullptr) c10::SetCPUAllocator(replaced_);
}

int64_t StepMemoryMeter::peak() const { return since_start(/*peak=*/true); }

int64_t StepMemoryMeter::held() const { return since_start(/*peak=*/false); }

int64_t StepMemoryMeter::since_start(bool peak) const {
#ifdef PIPETRAIN_HAS_CUDA
  if (device_.is_cuda()) {
    const auto allocated =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0];
    return (peak ? allocated.peak : allocated.current) - start_;
  }
#endif
  if (replaced_ == nullptr) return -1;
  return (peak ? counting_allocator().peak() : counting_allocator().live()) - start_;
}

int64_t peak_memory_bytes(const c10::Device& device) {
#ifdef PIPETRAIN_HAS_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // [0]: every pool together
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux counts kibibytes
}

}  // namespace pipetrain
