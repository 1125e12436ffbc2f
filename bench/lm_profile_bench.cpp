// Where one GPU's time goes in a language model's step through the Trainer: PyTorch's profiler
// (Kineto) records steps 16-20 of `fit` and this prints the GPU kernels by total time per step,
// their sum against the steps' wall time (a sum well below it means the device waits for the
// host), and writes a Chrome trace.
//   build-gpu/bench/lm_profile_bench [model=gpt2] [size] [B=16] [T=1024] [chunks=1]
//       [trace=lm_trace.json] [top=40] [fuse-gradient-accumulation=false] [cuda-graphs=false]
// model is gpt2 (size 124M by default), llama (llama-150m) or qwen3 (qwen3-0.6b); chunks > 1
// trains under `pipe` on the one device with that many micro-batches (checkpoint never). Data:
// uniform random tokens below the model's vocabulary (throughput only), as bench/lm_fit.sh.
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/models.h"
#include "pipetrain/callback.h"
#include "pipetrain/token_dataset.h"
#include "pipetrain/trainer.h"

namespace {

constexpr int64_t kFirst = 16, kSteps = 5;

class Profile : public pipetrain::Callback {
 public:
  Profile(std::string trace, size_t top) : trace_(std::move(trace)), top_(top) {}

  void on_train_batch_start(pipetrain::Trainer&, pipetrain::Module&, const pipetrain::Batch&,
                            int64_t batch_idx) override {
    namespace prof = torch::profiler::impl;
    if (batch_idx == kFirst) {
      torch::cuda::synchronize();
      const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
      const std::set<prof::ActivityType> activities{prof::ActivityType::CPU,
                                                    prof::ActivityType::CUDA};
      torch::autograd::profiler::prepareProfiler(config, activities);
      torch::autograd::profiler::enableProfiler(config, activities);
      start_ = std::chrono::steady_clock::now();
    } else if (batch_idx == kFirst + kSteps) {
      torch::cuda::synchronize();
      const double wall_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
              .count() /
          kSteps;
      const auto result = torch::autograd::profiler::disableProfiler();
      report(*result, wall_ms);
    }
  }

 private:
  void report(torch::autograd::profiler::ProfilerResult& result, double wall_ms) const {
    std::map<std::string, std::pair<double, int64_t>> kernels;  // name -> (ms, calls)
    double total_ms = 0;
    for (const auto& event : result.events()) {
      if (event.deviceType() != c10::DeviceType::CUDA) continue;
#if TORCH_VERSION_MAJOR >= 2
      const double ms = static_cast<double>(event.durationNs()) / 1e6;
#else
      const double ms = static_cast<double>(event.durationUs()) / 1e3;
#endif
      auto& entry = kernels[event.name()];
      entry.first += ms;
      ++entry.second;
      total_ms += ms;
    }
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> sorted(kernels.begin(),
                                                                           kernels.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::printf("step wall %.2f ms, GPU activity %.2f ms per step (%.0f%%)\n", wall_ms,
                total_ms / kSteps, 100 * total_ms / kSteps / wall_ms);
    std::printf("%9s %6s %6s  %s\n", "ms/step", "%", "calls", "kernel");
    for (size_t i = 0; i < std::min(top_, sorted.size()); ++i) {
      const auto& [name, value] = sorted[i];
      std::printf("%9.3f %6.1f %6lld  %.150s\n", value.first / kSteps, 100 * value.first / total_ms,
                  static_cast<long long>(value.second / kSteps), name.c_str());
    }
    result.save(trace_);
  }

  std::string trace_;
  size_t top_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "gpt2";
  const std::map<std::string, std::string> default_size{
      {"gpt2", "124M"}, {"llama", "llama-150m"}, {"qwen3", "qwen3-0.6b"}};
  if (default_size.count(name) == 0) {
    std::fprintf(stderr, "lm_profile_bench: model is gpt2, llama or qwen3, not '%s'\n",
                 name.c_str());
    return 2;
  }
  const std::string size = argc > 2 ? argv[2] : default_size.at(name);
  const int64_t batch = argc > 3 ? std::stoll(argv[3]) : 16;
  const int64_t block = argc > 4 ? std::stoll(argv[4]) : 1024;
  const int64_t chunks = argc > 5 ? std::stoll(argv[5]) : 1;
  const std::string trace = argc > 6 ? argv[6] : "lm_trace.json";
  const size_t top = argc > 7 ? std::stoul(argv[7]) : 40;
  const bool fuse = argc > 8 && std::string(argv[8]) == "true";
  const bool graphs = argc > 9 && std::string(argv[9]) == "true";
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "lm_profile_bench needs a CUDA device\n");
    return 1;
  }
  const auto dir = std::filesystem::temp_directory_path() / "lm_profile_bench";
  std::filesystem::create_directories(dir);
  pipetrain::cli::ModelOptions model_options;
  model_options.name = name;
  model_options.model_size = size;
  model_options.block_size = block;
  model_options.train_data = (dir / "train.bin").string();
  model_options.lr = 6e-4;
  const bool gpt2 = name == "gpt2";
  const int64_t vocab = gpt2 ? 50257 : pipetrain::cli::decoder_config(model_options).vocab_size;
  std::mt19937 random(0);
  std::vector<uint32_t> tokens(batch * (block + 1) * (kFirst + kSteps + 4));
  for (auto& token : tokens) token = static_cast<uint32_t>(random() % vocab);
  if (gpt2) {
    pipetrain::write_token_file(model_options.train_data,
                                std::vector<uint16_t>(tokens.begin(), tokens.end()));
  } else {
    pipetrain::write_token_file(model_options.train_data, tokens,
                                pipetrain::TokenFileFormat::kLlmc);
  }
  auto model = pipetrain::cli::make_model(model_options);
  pipetrain::Trainer trainer(pipetrain::TrainerOptions()
                                 .accelerator("cuda")
                                 .precision("bf16-mixed")
                                 .gradient_clip_val(1.0)
                                 .max_steps(kFirst + kSteps + 1)
                                 .strategy(chunks > 1 ? "pipe" : "single")
                                 .pipe(pipetrain::PipeOptions()
                                           .chunks(chunks)
                                           .checkpoint("never")
                                           .fuse_gradient_accumulation(fuse)
                                           .cuda_graphs(graphs))
                                 .loggers({})
                                 .enable_progress_bar(false)
                                 .enable_checkpointing(false)
                                 .default_root_dir((dir / "runs").string())
                                 .callbacks({std::make_shared<Profile>(trace, top)}));
  const pipetrain::DataLoader train(model.train,
                                    pipetrain::DataLoaderOptions().batch_size(batch).shuffle(true));
  trainer.fit(*model.module, train);
  std::filesystem::remove_all(dir);
  return 0;
}
