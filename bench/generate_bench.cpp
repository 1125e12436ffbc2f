// Generation speed of pipetrain::nn::generate on one GPU (else the CPU): a decoder of a preset's
// shape (weights drawn at random: the time does not depend on them) in bf16 (fp32 on the CPU),
// greedy, a batch of prompts of
// `prompt` random tokens each, `new` tokens made per prompt (no EOS, so every row makes them all).
// Per batch size, one JSON line: time to first token (the prompt's forward and the first choice),
// then milliseconds per decode step and tokens per second after it; and the weight-read bound, the
// decoder's bytes of weights over the bandwidth a device-to-device copy reaches (the floor of a
// decode step at batch 1, which must read every weight once).
//   generate_bench [preset=llama3.2-1b] [batches=1,8,32] [prompt=128] [new=256]
// bench/generate_peer.py times transformers' generate on the same shapes; bench/generate.sh runs
// both in one command.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "pipetrain/nn/decoder.h"
#include "pipetrain/nn/generate.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Bytes per second a device-to-device copy of 1 GiB moves (read and written, each counted once).
double copy_bandwidth(const torch::Device& device) {
  const auto from = torch::ones({int64_t{1} << 30}, torch::dtype(torch::kUInt8).device(device));
  auto to = torch::empty_like(from);
  to.copy_(from);
  synchronize(device);
  const auto start = Clock::now();
  constexpr int kCopies = 10;
  for (int i = 0; i < kCopies; ++i) to.copy_(from);
  synchronize(device);
  return 2.0 * kCopies * static_cast<double>(from.numel()) / seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "llama3.2-1b";
  const std::string batches = argc > 2 ? argv[2] : "1,8,32";
  const int64_t prompt = argc > 3 ? std::stoll(argv[3]) : 128;
  const int64_t made = argc > 4 ? std::stoll(argv[4]) : 256;
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);
  auto config = pipetrain::nn::decoder_preset(preset);
  auto model = pipetrain::nn::decoder(config);
  model->to(device, device.is_cuda() ? torch::kBFloat16 : torch::kFloat);
  double weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += static_cast<double>(p.nbytes());
  const double bound_ms = 1e3 * weight_bytes / copy_bandwidth(device);
  std::printf(
      "{\"bench\": \"generate\", \"impl\": \"pipetrain\", \"device\": \"%s\", \"preset\": "
      "\"%s\", \"weight_bytes\": %.0f, \"weight_read_bound_ms\": %.3f}\n",
      device.str().c_str(), preset.c_str(), weight_bytes, bound_ms);

  std::stringstream sizes(batches);
  for (std::string size; std::getline(sizes, size, ',');) {
    const int64_t rows = std::stoll(size);
    std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(rows));
    for (auto& ids : prompts) {
      const auto drawn = torch::randint(config.vocab_size, {prompt}, torch::kInt64);
      ids.assign(drawn.data_ptr<int64_t>(), drawn.data_ptr<int64_t>() + prompt);
    }
    const auto options = pipetrain::nn::GenerationOptions().max_new_tokens(made);
    pipetrain::nn::generate(model, prompts, pipetrain::nn::GenerationOptions().max_new_tokens(8));
    double first = 0;
    const auto start = Clock::now();
    // Each token reaches the callback after the host has it: the times are the device's too.
    pipetrain::nn::generate(model, prompts, options, [&](size_t row, int64_t) {
      if (row == 0 && first == 0) first = seconds_since(start);
    });
    const double total = seconds_since(start);
    const double step_ms = 1e3 * (total - first) / static_cast<double>(made - 1);
    std::printf(
        "{\"bench\": \"generate\", \"impl\": \"pipetrain\", \"preset\": \"%s\", \"batch\": %lld, "
        "\"prompt\": %lld, \"new\": %lld, \"ttft_ms\": %.2f, \"decode_ms_per_step\": %.3f, "
        "\"tokens_per_s\": %.1f, \"of_weight_read_bound\": %.3f}\n",
        preset.c_str(), static_cast<long long>(rows), static_cast<long long>(prompt),
        static_cast<long long>(made), 1e3 * first, step_ms,
        1e3 * static_cast<double>(rows) / step_ms, bound_ms / step_ms);
    std::fflush(stdout);
  }
  return 0;
}
