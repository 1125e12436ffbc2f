// Small helpers shared by the benchmarks in this folder: the MLP they train and its SGD step
// through a Pipe, a median, timers, the one-way transfer time between two stages, and the "run me
// as a pipeline stage" dispatch on top of pipetrain's local launcher. Header-only so that
// bench/CMakeLists.txt can keep building one executable per *_bench.cpp.
#pragma once

#include <torch/torch.h>

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/p2p.h"
#include "pipetrain/launcher.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"

namespace pipetrain::bench {

// `blocks` x (Linear(width, width) + ReLU): 2 * blocks layers, the same weights for every seed.
inline torch::nn::Sequential make_mlp(int64_t blocks, int64_t width, uint64_t seed = 1) {
  torch::manual_seed(seed);
  torch::nn::Sequential mlp;
  for (int64_t b = 0; b < blocks; ++b) {
    mlp->push_back(torch::nn::Linear(width, width));
    mlp->push_back(torch::nn::ReLU());
  }
  return mlp;
}

// "NAME: 8 x (Linear(1024,1024)+ReLU), batch 512, fp32, 2 stages (balance {8, 8} layers)": the
// first words of a benchmark's header, for make_mlp(blocks, width) cut into `stages` equal stages.
inline std::string describe_mlp_stages(const char* bench, int64_t blocks, int64_t width,
                                       int64_t batch, int64_t stages) {
  std::string balance;
  for (int64_t s = 0; s < stages; ++s) {
    balance += (s > 0 ? ", " : "") + std::to_string(2 * blocks / stages);
  }
  return std::string(bench) + ": " + std::to_string(blocks) + " x (Linear(" +
         std::to_string(width) + "," + std::to_string(width) + ")+ReLU), batch " +
         std::to_string(batch) + ", fp32, " + std::to_string(stages) + " stages (balance {" +
         balance + "} layers)";
}

// printf into a std::string.
inline std::string format(const char* pattern, ...) {
  va_list args, copy;
  va_start(args, pattern);
  va_copy(copy, args);
  std::string text(static_cast<size_t>(std::vsnprintf(nullptr, 0, pattern, copy)), '\0');
  va_end(copy);
  std::vsnprintf(text.data(), text.size() + 1, pattern, args);
  va_end(args);
  return text;
}

// A Pipe and plain SGD: the training step every pipelined benchmark times (mean squared error
// against `targets`, per micro-batch).
class SgdPipe {
 public:
  SgdPipe(torch::nn::Sequential model, pipetrain::PipeOptions options,
          std::shared_ptr<pipetrain::World> world, double learning_rate)
      : pipe_(std::move(model), std::move(options), std::move(world)),
        optimizer_(pipe_.parameters(), learning_rate) {}
  // Stage 0 reads `inputs`, the last stage `targets`; the others ignore them.
  void step(const at::Tensor& inputs, const at::Tensor& targets) {
    optimizer_.zero_grad();
    pipe_.forward_backward(pipe_.is_first_stage() ? inputs : at::Tensor(), targets.size(0),
                           [&](const at::Tensor& out, const pipetrain::MicroBatch& mb) {
                             return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
                           });
    optimizer_.step();
  }
  const pipetrain::Pipe& pipe() const { return pipe_; }

 private:
  pipetrain::Pipe pipe_;
  torch::optim::SGD optimizer_;
};

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One thread for ATen's intra-op pool and for BLAS. at::set_num_threads does not reach OpenBLAS's
// own pthreads (Debian's libtorch calls BLAS through libblas.so.3), so call OpenBLAS directly
// when it is the BLAS in this process; OMP_NUM_THREADS / OPENBLAS_NUM_THREADS are then not needed.
inline void use_one_thread() {
  at::set_num_threads(1);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(1);
  }
}

// CPU time of this process, all its threads (Gloo's included).
inline double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU time of the calling thread.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU time every process of the machine has used since boot (/proc/stat: user, nice, system,
// irq, softirq, steal). Its growth minus the benchmark's own CPU time is what other processes
// took from the machine while the benchmark ran: a benchmark on a busy machine says so.
inline double machine_busy_seconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The first three fields of /proc/loadavg, e.g. "0.12 0.30 0.41".
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

inline void zero_grad(const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

// One-way time of a [rows, width] activation between the two stages of `world` (ping-pong / 2).
inline double one_way_transfer_seconds(const std::shared_ptr<pipetrain::World>& world, int64_t rows,
                                       int64_t width) {
  pipetrain::PeerToPeer p2p(world);
  const auto tensor = torch::randn({rows, width});
  const auto trip = [&] {
    if (world->rank() == 0) {
      p2p.send(tensor, 1, pipetrain::Flow::kActivation);
      p2p.recv_tensor(1, pipetrain::Flow::kGradient);
    } else {
      p2p.send(p2p.recv_tensor(0, pipetrain::Flow::kActivation), 0, pipetrain::Flow::kGradient);
    }
    p2p.wait_for_sends();
  };
  for (int i = 0; i < 3; ++i) trip();  // warm-up
  constexpr int kTrips = 20;
  world->barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kTrips; ++i) trip();
  return seconds_since(start) / kTrips / 2;
}

// main() of a benchmark whose ranks are pipeline stages: launches `stages` local processes of
// this program (one thread each) and runs `run_stage` in each. Returns the exit status.
inline int run_as_local_stages(const char* bench, int64_t stages, void (*run_stage)()) {
  constexpr const char* kWorkerVariable = "PIPETRAIN_BENCH_WORKER";
  try {
    if (std::getenv(kWorkerVariable) != nullptr) {
      run_stage();
      return 0;
    }
    pipetrain::LaunchOptions options;
    options.nprocs = stages;
    options.extra_env = {
        {kWorkerVariable, "1"}, {"OMP_NUM_THREADS", "1"}, {"OPENBLAS_NUM_THREADS", "1"}};
    return pipetrain::launch_local_processes(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s (rank %s): %s\n", bench, env_or("RANK", "-").c_str(), e.what());
    return 1;
  }
}

}  // namespace pipetrain::bench
