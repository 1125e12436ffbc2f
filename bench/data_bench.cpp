// What reading data costs: resident memory while a large token file is read (it is mapped, not
// loaded), and the step time of the built-in GPT trained from a token file through the
// prefetching loader against the same windows already in memory (on the GPU, already on it).
//   build/bench/data_bench memory [file_mb=1024] [block=1024] [batch=64]
//   build/bench/data_bench step resident|file|prefetch [steps=200] [accelerator=cpu] [devices=2]
//                                [batch=16] [block=128]
// Goals (issue "Bring your own data"): resident memory near the model's size, not the file's;
// loader overhead <= 2% of a 2-stage step on CPU and <= 1.02x of resident data on one GPU.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "bench_common.h"
#include "models/gpt.h"
#include "pipetrain/callback.h"
#include "pipetrain/token_dataset.h"
#include "pipetrain/trainer.h"

namespace {

namespace fs = std::filesystem;

// Field `name` of /proc/self/status in MiB.
double status_mib(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    double kib = 0;
    if (key == name + ":" && status >> kib) return kib / 1024;
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

// `megabytes` of random byte tokens in raw uint16, written in pieces (never held whole).
void write_random_tokens(const std::string& path, int64_t megabytes) {
  std::ofstream out(path, std::ios::binary);
  std::mt19937 generator(7);
  std::vector<uint16_t> piece(1 << 20);
  for (int64_t written = 0; written < megabytes * (1 << 20); written += 2 << 20) {
    for (auto& token : piece) token = static_cast<uint16_t>(generator() % 256);
    out.write(reinterpret_cast<const char*>(piece.data()), 2 << 20);
  }
}

int memory(int64_t file_mb, int64_t block, int64_t batch) {
  const std::string path = (fs::temp_directory_path() / "pipetrain-data-bench.bin").string();
  write_random_tokens(path, file_mb);
  // The peak so far (writing the file) is not what is measured: reset it.
  std::ofstream("/proc/self/clear_refs") << "5";
  const double before = status_mib("VmHWM");
  auto dataset = std::make_shared<pipetrain::TokenDataset>(path, block, 256);
  pipetrain::DataLoader loader(dataset,
                               pipetrain::DataLoaderOptions().batch_size(batch).shuffle(true));
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  for (int64_t i = 0; i < loader.num_batches(); ++i) tokens += loader.batch(0, i).data.numel();
  const double seconds = pipetrain::bench::seconds_since(start);
  std::printf(
      "token file %lld MiB (%lld windows of %lld), one shuffled epoch in batches of %lld:\n"
      "  %.1f s, %.0f M tokens/s; peak resident %.0f MiB (before reading %.0f MiB), resident "
      "now %.0f MiB of which file pages %.0f MiB\n",
      static_cast<long long>(file_mb), static_cast<long long>(dataset->size()),
      static_cast<long long>(block), static_cast<long long>(batch), seconds,
      static_cast<double>(tokens) / seconds / 1e6, status_mib("VmHWM"), before, status_mib("VmRSS"),
      status_mib("RssFile"));
  fs::remove(path);
  return 0;
}

// Seconds per training step of `steps` steps (after 10 untimed ones) of the built-in GPT.
double seconds_per_step(const pipetrain::TrainerOptions& options,
                        std::shared_ptr<const pipetrain::Dataset> data, int64_t batch,
                        int64_t workers, const pipetrain::cli::GptConfig& config, int64_t steps) {
  struct Timer : pipetrain::Callback {
    int64_t from;
    std::chrono::steady_clock::time_point start;
    explicit Timer(int64_t f) : from(f) {}
    void on_train_batch_start(pipetrain::Trainer& trainer, pipetrain::Module&,
                              const pipetrain::Batch&, int64_t) override {
      if (trainer.global_step() == from) start = std::chrono::steady_clock::now();
    }
  };
  auto timer = std::make_shared<Timer>(10);
  auto timed = options;
  timed.max_steps(steps + 10).callbacks({timer});
  pipetrain::Trainer trainer(timed);
  pipetrain::cli::GptModel model(config);
  pipetrain::DataLoader loader(
      std::move(data),
      pipetrain::DataLoaderOptions().batch_size(batch).shuffle(true).num_workers(workers));
  trainer.fit(model, loader);
  if (timed.accelerator() == "cuda") torch::cuda::synchronize();
  return pipetrain::bench::seconds_since(timer->start) / static_cast<double>(steps);
}

// One configuration a run: resident (the windows in memory, on the GPU when there is one), file
// (read from the token file when the step asks) or prefetch (one worker reading ahead).
int step(const std::string& config_name, int64_t steps, const std::string& accelerator,
         int64_t devices, int64_t batch, int64_t block) {
  const auto options = pipetrain::TrainerOptions()
                           .strategy(devices > 1 ? "pipe" : "single")
                           .devices(devices)
                           .accelerator(accelerator)
                           .pipe(pipetrain::PipeOptions().chunks(devices > 1 ? 2 : 1))
                           .loggers({})
                           .enable_progress_bar(false)
                           .enable_checkpointing(false)
                           .num_sanity_val_steps(0)
                           .default_root_dir(fs::temp_directory_path() / "pipetrain-data-bench");
  const std::string path = (fs::temp_directory_path() / "pipetrain-data-bench-step.bin").string();
  const bool launched_rank = std::getenv("RANK") != nullptr;
  if (!launched_rank) write_random_tokens(path, 64);
  if (const auto status = pipetrain::launch_ranks(options)) {
    fs::remove(path);
    return *status;
  }
  pipetrain::cli::GptConfig config;
  config.vocab_size = 256;
  config.block_size = block;
  auto file = std::make_shared<pipetrain::TokenDataset>(path, block, 256);
  std::shared_ptr<const pipetrain::Dataset> data = file;
  if (config_name == "resident") {
    std::vector<int64_t> all(static_cast<size_t>(file->size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    const auto windows = file->get_batch(all, {});
    const auto device =
        accelerator == "cuda"
            ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(std::stoi(
                                              pipetrain::bench::env_or("LOCAL_RANK", "0"))))
            : torch::Device(torch::kCPU);
    data = std::make_shared<pipetrain::TensorDataset>(windows.data.to(device),
                                                      windows.target.to(device));
  }
  const double seconds =
      seconds_per_step(options, data, batch, config_name == "prefetch" ? 1 : 0, config, steps);
  if (pipetrain::bench::env_or("RANK", "0") == "0") {
    std::printf("gpt (block %lld, batch %lld), %s, %lld stage(s), data %s: %.3f ms per step\n",
                static_cast<long long>(block), static_cast<long long>(batch), accelerator.c_str(),
                static_cast<long long>(devices), config_name.c_str(), 1e3 * seconds);
  }
  if (!launched_rank) fs::remove(path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "memory";
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::stoll(argv[i]) : fallback; };
  if (mode == "memory") return memory(arg(2, 1024), arg(3, 1024), arg(4, 64));
  if (mode == "step" && argc > 2) {
    return step(argv[2], arg(3, 200), argc > 4 ? argv[4] : "cpu", arg(5, 2), arg(6, 16),
                arg(7, 128));
  }
  std::fprintf(stderr, "usage: data_bench memory|step [...]\n");
  return 2;
}
