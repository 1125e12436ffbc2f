// The GPU benchmark of issue "beat torch.distributed.pipelining": the peer's reference model (16
// blocks of Linear(2048,8192)-GELU-Linear(8192,2048)-LayerNorm, bf16 weights and data, SGD lr 1e-3,
// MSE against random targets), timed as the peer times it: 5 warm-up steps, then the mean of
// STEPS steps between two (synchronize + barrier) points. Gradients are set to none before each
// step, as the peer's zero_grad does (and the Trainer's): zeroing them instead makes each backward
// add every weight gradient into the zeros (8.35 against 7.07 ms a step at B = 1024 on an H200,
// bench/RESULTS.md).
//
//   gpu_bench single   one GPU: a plain libtorch loop, and the same model through pipetrain
//   gpu_bench pipe     two GPUs (it launches its two ranks itself): GPipe and 1F1B at
//                      B in {1024, 8192}, M in {4, 8, 16, 32}, eager and with CUDA graphs, each
//                      with and without fused gradient accumulation; checkpoint "always" at M = 8
//   gpu_bench ddp      two GPUs, each holding the whole model and half of B = 8192, gradients
//                      averaged by GradientSync; and the same without averaging, whose difference
//                      is the all-reduce time backward did not hide
//
// Every measurement prints one line "RESULT {json}" (bench/gpu_table.py turns them into the table
// and bench/results/gpu.json). Per configuration it also measures each stage's busy time (the GPU
// time of its forwards, backwards and weight gradients inside the pipelined step, and of its
// optimizer, from a --trace of three more steps) and the peak memory of the step above what the
// weights and gradients hold.
// BATCHES, SCHEDULES and CHUNKS (comma-separated) restrict `pipe` to some configurations;
// TRACE_DIR=dir writes each configuration's traced steps there as Chrome-trace JSON.
#include <torch/torch.h>

#ifdef PIPETRAIN_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "distributed/gradient_sync.h"
#include "pipeline/trace.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"

namespace {

#ifdef PIPETRAIN_HAS_CUDA

constexpr int64_t kWidth = 2048;
constexpr int64_t kBlocks = 16;
constexpr int kWarmup = 5;

// Whether `value` is among the comma-separated values of environment variable `name` (unset: all
// are): BATCHES=1024 SCHEDULES=gpipe CHUNKS=8,16 gpu_bench pipe runs only those configurations.
bool selected(const char* name, const std::string& value) {
  const char* list = std::getenv(name);
  if (!list) return true;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (item == value) return true;
  }
  return false;
}

int steps() {
  const char* text = std::getenv("STEPS");
  return text ? std::atoi(text) : 10;
}

// The peer's model as one flat Sequential (4 layers a block), so stages can split it anywhere.
torch::nn::Sequential reference_model() {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t b = 0; b < kBlocks; ++b) {
    model->push_back(torch::nn::Linear(kWidth, 4 * kWidth));
    model->push_back(torch::nn::Functional([](const at::Tensor& x) { return torch::gelu(x); }));
    model->push_back(torch::nn::Linear(4 * kWidth, kWidth));
    model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
  }
  model->to(torch::kBFloat16);
  return model;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

int64_t allocated_now(c10::DeviceIndex device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}
int64_t allocated_peak(c10::DeviceIndex device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
}

// Mean seconds per call of `step` over steps() calls after kWarmup, `sync` at both ends.
template <typename Step, typename Sync>
double time_steps(const Step& step, const Sync& sync) {
  for (int i = 0; i < kWarmup; ++i) step();
  sync();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps(); ++i) step();
  sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps();
}

// Peak bytes one call of `step` allocates above what is allocated before it (weights, gradients
// and optimizer state, all of which exist after the warm-up).
template <typename Step>
int64_t step_peak(const Step& step, c10::DeviceIndex device) {
  torch::cuda::synchronize();
  const int64_t before = allocated_now(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  step();
  torch::cuda::synchronize();
  return allocated_peak(device) - before;
}

void print_single_result(const char* kind, int64_t batch, bool graphs, double seconds,
                         double peak_gib) {
  std::printf(
      "RESULT {\"kind\": \"%s\", \"B\": %ld, \"M\": 1, \"schedule\": \"single\", "
      "\"checkpoint\": \"never\", \"cuda_graphs\": %s, \"step_ms\": %.3f, \"peak_gib\": %.3f}\n",
      kind, batch, graphs ? "true" : "false", seconds * 1e3, peak_gib);
}

void run_single() {
  const c10::Device device(c10::DeviceType::CUDA, 0);
  auto model = reference_model();
  model->to(device);
  auto sync = [] { torch::cuda::synchronize(); };
  for (const int64_t batch : {1024, 8192}) {
    auto x = torch::randn({batch, kWidth}, torch::TensorOptions(torch::kBFloat16).device(device));
    auto y = torch::randn_like(x);
    {
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-3));
      auto step = [&] {
        optimizer.zero_grad(true);
        torch::mse_loss(model->forward(x), y).backward();
        optimizer.step();
      };
      const double seconds = time_steps(step, sync);
      print_single_result("plain", batch, false, seconds, gib(allocated_peak(0)));
    }
    for (const bool graphs : {false, true}) {
      pipetrain::LocalEnvironment env;
      auto world =
          pipetrain::World::connect(env, pipetrain::World::kDefaultTimeout, c10::DeviceType::CUDA);
      pipetrain::Pipe pipe(
          model, pipetrain::PipeOptions().chunks(1).checkpoint("never").cuda_graphs(graphs), world);
      torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(1e-3));
      auto step = [&] {
        optimizer.zero_grad(true);
        pipe.forward_backward(x, batch, [&](const at::Tensor& out, const pipetrain::MicroBatch&) {
          return torch::mse_loss(out, y);
        });
        optimizer.step();
      };
      c10::cuda::CUDACachingAllocator::resetPeakStats(0);
      const double seconds = time_steps(step, sync);
      print_single_result("pipetrain", batch, graphs, seconds, gib(allocated_peak(0)));
    }
    std::fflush(stdout);
  }
}

// Milliseconds this stage's GPU spends per step, from a trace of a few pipelined steps: in
// forwards, backwards and deferred weight gradients (what a perfect pipeline overlaps with the
// other stages'), and in the optimizer (zero_grad and step, which no pipeline overlaps).
struct BusyTime {
  double pipelined_ms = 0, optimizer_ms = 0;
};

template <typename Step>
BusyTime stage_busy(pipetrain::Trace& trace, const pipetrain::World& world, const Step& step) {
  constexpr int kTracedSteps = 3;
  trace.start(world);
  for (int i = 0; i < kTracedSteps; ++i) step();
  auto totals = trace.total_ms();
  return {(totals["forward"] + totals["backward"] + totals["weight gradients"]) / kTracedSteps,
          totals["optimizer"] / kTracedSteps};
}

void run_pipe_rank() {
  auto env = pipetrain::select_cluster_environment();
  auto world =
      pipetrain::World::connect(*env, pipetrain::World::kDefaultTimeout, c10::DeviceType::CUDA);
  const auto device = world->device();
  auto model = reference_model();
  auto sync = [&] {
    torch::cuda::synchronize();
    world->barrier();
  };
  for (const int64_t batch : {1024, 8192}) {
    if (!selected("BATCHES", std::to_string(batch))) continue;
    auto x = torch::randn({batch, kWidth}, torch::TensorOptions(torch::kBFloat16).device(device));
    auto y = torch::randn_like(x);
    for (const std::string schedule : {"gpipe", "1f1b"}) {
      if (!selected("SCHEDULES", schedule)) continue;
      for (const int64_t chunks : {4, 8, 16, 32}) {
        if (!selected("CHUNKS", std::to_string(chunks))) continue;
        // (checkpoint, CUDA graphs, fused gradient accumulation)
        std::vector<std::tuple<std::string, bool, bool>> variants{{"never", false, false},
                                                                  {"never", false, true},
                                                                  {"never", true, false},
                                                                  {"never", true, true}};
        if (chunks == 8) variants.emplace_back("always", false, false);
        for (const auto& [mode, graphs, fused] : variants) {
          // Dozens of pipes in one process: the memory pools of the last one's CUDA graphs return
          // to the driver only on emptyCache, and NCCL allocates outside the caching allocator.
          torch::cuda::synchronize();
          c10::cuda::CUDACachingAllocator::emptyCache();
          // What earlier configurations left allocated (nothing, unless something leaks).
          const double left_before = gib(allocated_now(device.index()));
          auto trace = std::make_shared<pipetrain::Trace>();  // started after the timed steps
          pipetrain::Pipe pipe(model,
                               pipetrain::PipeOptions()
                                   .balance({32, 32})
                                   .chunks(chunks)
                                   .checkpoint(mode)
                                   .schedule(schedule)
                                   .cuda_graphs(graphs)
                                   .fuse_gradient_accumulation(fused)
                                   .trace(trace),
                               world);
          torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(1e-3));
          auto step = [&] {
            {
              pipetrain::Trace::Span span(trace.get(), "optimizer");
              optimizer.zero_grad(true);
            }
            pipe.forward_backward(x, batch,
                                  [&](const at::Tensor& out, const pipetrain::MicroBatch& mb) {
                                    return torch::mse_loss(out, y.slice(0, mb.begin, mb.end));
                                  });
            pipetrain::Trace::Span span(trace.get(), "optimizer");
            optimizer.step();
          };
          const double seconds = time_steps(step, sync);
          const double activations = gib(step_peak(step, device.index()));
          const BusyTime busy = stage_busy(*trace, *world, step);
          if (const char* dir = std::getenv("TRACE_DIR")) {  // the traced steps, for Perfetto
            trace->write(*world, std::string(dir) + "/B" + std::to_string(batch) + "_M" +
                                     std::to_string(chunks) + "_" + schedule + "_" + mode +
                                     (graphs ? "_graphs" : "") + (fused ? "_fused" : "") + ".json");
          }
          world->barrier();
          // Every rank's figures to rank 0, through the store-backed broadcast.
          std::ostringstream mine;
          mine << busy.pipelined_ms << " " << busy.optimizer_ms << " " << activations << " "
               << gib(allocated_peak(device.index())) << " " << left_before;
          std::vector<std::string> all;
          for (int64_t r = 0; r < world->size(); ++r)
            all.push_back(world->broadcast(mine.str(), r));
          if (world->is_global_zero()) {
            // A perfect pipeline: each stage's pipelined work stretched by the bubble,
            // (M + p - 1) / M, plus its optimizer; the bound is the largest of those.
            double bound = 0;
            const double stretch = static_cast<double>(chunks + world->size() - 1) / chunks;
            std::ostringstream stages;
            for (size_t r = 0; r < all.size(); ++r) {
              std::istringstream in(all[r]);
              double b = 0, o = 0, a = 0, p = 0, l = 0;
              in >> b >> o >> a >> p >> l;
              bound = std::max(bound, b * stretch + o);
              stages << (r ? ", " : "") << "{\"busy_ms\": " << b << ", \"optimizer_ms\": " << o
                     << ", \"activation_gib\": " << a << ", \"peak_gib\": " << p
                     << ", \"allocated_before_gib\": " << l << "}";
            }
            std::printf(
                "RESULT {\"kind\": \"pipetrain\", \"B\": %ld, \"M\": %ld, \"schedule\": \"%s\", "
                "\"checkpoint\": \"%s\", \"cuda_graphs\": %s, \"fused\": %s, \"step_ms\": %.3f, "
                "\"bound_ms\": %.3f, \"stages\": [%s]}\n",
                batch, chunks, schedule.c_str(), mode.c_str(), graphs ? "true" : "false",
                fused ? "true" : "false", seconds * 1e3, bound, stages.str().c_str());
            std::fflush(stdout);
          }
        }
      }
    }
  }
}

void run_ddp_rank() {
  auto env = pipetrain::select_cluster_environment();
  auto world =
      pipetrain::World::connect(*env, pipetrain::World::kDefaultTimeout, c10::DeviceType::CUDA);
  const auto device = world->device();
  // Each replica runs the whole model as a one-stage pipe; the replicas form `world`.
  auto solo = world->group({world->rank()}, "replica" + std::to_string(world->rank()));
  pipetrain::Pipe pipe(reference_model(), pipetrain::PipeOptions().chunks(1).checkpoint("never"),
                       solo);
  pipetrain::GradientSync gradient_sync(pipe.parameters(), world);
  bool sync = true;
  pipe.set_last_backward_hook([&] {
    if (sync) gradient_sync.arm();
  });
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(1e-3));
  const int64_t batch = 8192 / world->size();
  auto x = torch::randn({batch, kWidth}, torch::TensorOptions(torch::kBFloat16).device(device));
  auto y = torch::randn_like(x);
  auto step = [&] {
    optimizer.zero_grad(true);
    pipe.forward_backward(x, batch, [&](const at::Tensor& out, const pipetrain::MicroBatch&) {
      return torch::mse_loss(out, y);
    });
    if (sync) gradient_sync.finish();
    optimizer.step();
  };
  auto barrier = [&] {
    torch::cuda::synchronize();
    world->barrier();
  };
  c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  const double with_sync = time_steps(step, barrier);
  const double peak = gib(allocated_peak(device.index()));
  sync = false;
  const double without_sync = time_steps(step, barrier);
  if (world->is_global_zero()) {
    std::printf(
        "RESULT {\"kind\": \"ddp\", \"B\": 8192, \"M\": 1, \"schedule\": \"ddp\", "
        "\"checkpoint\": \"never\", \"cuda_graphs\": false, \"step_ms\": %.3f, "
        "\"no_sync_step_ms\": %.3f, \"buckets\": %ld, \"peak_gib\": %.3f}\n",
        with_sync * 1e3, without_sync * 1e3, gradient_sync.num_buckets(), peak);
    std::fflush(stdout);
  }
}

#endif  // PIPETRAIN_HAS_CUDA

}  // namespace

int main(int argc, char** argv) {
#ifdef PIPETRAIN_HAS_CUDA
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "single") {
    run_single();
    return 0;
  }
  if (mode == "pipe" || mode == "ddp") {
    // Not launched yet: start the two ranks (this process never touches the GPU).
    if (pipetrain::select_cluster_environment()->world_size() == 1) {
      pipetrain::LaunchOptions launch;
      launch.nprocs = 2;
      return pipetrain::launch_local_processes(launch);
    }
    mode == "pipe" ? run_pipe_rank() : run_ddp_rank();
    return 0;
  }
  std::cerr << "usage: gpu_bench single|pipe|ddp\n";
  return 2;
#else
  (void)argc, (void)argv;
  std::cerr << "gpu_bench needs a libtorch with CUDA\n";
  return 2;
#endif
}
