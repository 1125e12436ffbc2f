// What one decoder block keeps for its backward on a GPU: the caching allocator's live bytes
// after the block's forward under bf16 autocast (and fused gradient accumulation, as
// `--fuse-gradient-accumulation true` trains), less its input and output, which the model keeps
// anyway. The block is run piece by piece (input_layernorm, self_attn, the add and
// post_attention_layernorm, mlp, the last residual add) and the live bytes printed after each,
// so that a piece's share can be told from the tensors it adds. Compare with a PyTorch block's
// figure (bench/peer_block_memory.py) to see where a whole model's peak memory differs.
//   build-gpu/bench/block_memory_bench [preset=llama-150m] [B=16] [T=1024]
#include <torch/torch.h>

#include <cstdio>
#include <string>

#ifdef PIPETRAIN_BENCH_HAS_CUDA_ALLOCATOR  // a Torch built with CUDA (bench/CMakeLists.txt)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "ops/fused_linear.h"
#include "pipetrain/nn/decoder.h"
#include "util/compat.h"

namespace {

#ifdef PIPETRAIN_BENCH_HAS_CUDA_ALLOCATOR
double live_mib() {
  torch::cuda::synchronize();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return static_cast<double>(stats.allocated_bytes[0].current) / (1 << 20);
}
#endif

}  // namespace

int main(int argc, char** argv) {
#ifndef PIPETRAIN_BENCH_HAS_CUDA_ALLOCATOR
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "block_memory_bench needs a Torch built with CUDA\n");
  return 1;
#else
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "block_memory_bench needs a CUDA device\n");
    return 1;
  }
  namespace nn = pipetrain::nn;
  const std::string preset = argc > 1 ? argv[1] : "llama-150m";
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : 16;
  const int64_t time = argc > 3 ? std::stoll(argv[3]) : 1024;
  auto config = nn::decoder_preset(preset);
  config.n_layer = 1;
  auto layers = nn::decoder(config);
  layers->to(torch::kCUDA);
  auto block = layers->ptr<nn::DecoderBlockImpl>(1);

  pipetrain::set_autocast_to_bf16(c10::DeviceType::CUDA, true);
  const auto x = torch::randn({batch, time, config.n_embd},
                              torch::dtype(torch::kFloat).device(torch::kCUDA).requires_grad(true));
  const double io_mib = static_cast<double>(x.nbytes()) / (1 << 20);
  std::printf("%s, B=%lld T=%lld: input and output %.1f MiB each (fp32)\n", preset.c_str(),
              static_cast<long long>(batch), static_cast<long long>(time), io_mib);

  // Twice: the first forward also makes autocast's bf16 copies of the weights (and any workspace
  // a kernel allocates once); the second's figures are the block's own.
  for (int round = 0; round < 2; ++round) {
    const pipetrain::FusedLinearScope fused(nullptr);  // a step: its weight copies its own
    at::autocast::clear_cache();
    const double start = live_mib();
    constexpr auto to_matmuls = pipetrain::LayerNormOutput::kAutocastDtype;
    auto first = nn::residual_rms_norm(x, block->input_layernorm->weight,
                                       block->input_layernorm->options.eps(), to_matmuls);
    const double after_norm = live_mib();
    auto attention = block->self_attn(first.normalised);
    const double after_attention = live_mib();
    auto second =
        nn::add_rms_norm(first.residual, attention, block->post_attention_layernorm->weight,
                         block->post_attention_layernorm->options.eps(), to_matmuls);
    const double after_add_norm = live_mib();
    auto mlp = block->mlp(second.normalised);
    const double after_mlp = live_mib();
    auto output = second.residual + mlp;
    const double after_block = live_mib();
    // What is still live beyond the output is what autograd saved.
    first = {};
    second = {};
    attention.reset();
    mlp.reset();
    const double kept = live_mib() - start - io_mib;
    if (round == 0) {
      output.sum().backward();
      continue;
    }
    std::printf("%-40s %10s %10s\n", "after", "live MiB", "added");
    double previous = start;
    const auto row = [&](const char* what, double now) {
      std::printf("%-40s %10.1f %10.1f\n", what, now - start, now - previous);
      previous = now;
    };
    row("input_layernorm (bf16 out)", after_norm);
    row("self_attn (its bf16 output live)", after_attention);
    row("h = x + attn, post_attention_layernorm", after_add_norm);
    row("mlp (its bf16 output live)", after_mlp);
    row("h + mlp (the block's output)", after_block);
    std::printf("kept for the backward (the output and the pieces' own results let go): %.1f MiB\n",
                kept);
  }
  pipetrain::set_autocast_to_bf16(c10::DeviceType::CUDA, false);
  return 0;
#endif
}
