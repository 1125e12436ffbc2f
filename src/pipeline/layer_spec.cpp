#include "pipetrain/layer_spec.h"

#include <torch/torch.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "pipeline/recompute.h"

namespace pipetrain {
namespace {

// The seed of layer `index`: a mix of the run's seed and the index (splitmix64), so that nearby
// seeds and nearby layers draw unrelated weights.
uint64_t layer_seed(uint64_t seed, int64_t index) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(index) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Layer `index` built under its own seed, the default CPU generator put back afterwards (the run's
// random draws do not depend on which layers a process builds).
torch::nn::AnyModule build_one(const LayerSpec& spec, int64_t index, uint64_t seed,
                               const torch::nn::Sequential* sharing_with = nullptr) {
  if (!spec.build) {
    throw std::invalid_argument("LayerSpec " + std::to_string(index) +
                                " has no build function: give each layer one (pipetrain::layer)");
  }
  const RngState before = RngState::capture();
  struct PutBack {
    const RngState& state;
    ~PutBack() { state.restore(); }
  } put_back{before};
  {
    // The CPU generator alone: CUDA's keep the run's seed (dropout on a GPU draws from them).
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(layer_seed(seed, index));
  }
  return sharing_with ? spec.build_sharing(*sharing_with) : spec.build();
}

// Whether layer `index`'s ties can share tensors: it has a way to, and every layer it is tied to
// is built here, before it.
bool can_share(const LayerSpec& spec, int64_t index, const std::vector<bool>& held) {
  if (!spec.build_sharing || spec.tied_to.empty()) return false;
  for (const auto& [own, global] : spec.tied_to) {
    const int64_t layer = std::stoll(global.substr(0, global.find('.')));
    if (layer >= index || !held.at(static_cast<size_t>(layer))) return false;
  }
  return true;
}

}  // namespace

at::Tensor NotHeldImpl::forward(const at::Tensor& /*input*/) {
  throw std::logic_error("layer " + std::to_string(index_) +
                         " is held by another process (per-rank construction): this process "
                         "cannot run it");
}

bool is_held(const torch::nn::Sequential& sequential, int64_t index) {
  return !(sequential->begin() + index)->ptr()->as<NotHeldImpl>();
}

bool held_elsewhere(const torch::nn::Sequential& sequential, const std::string& name) {
  const auto dot = name.find('.');
  if (dot == 0 || dot == std::string::npos || name.find_first_not_of("0123456789") != dot) {
    return false;
  }
  const int64_t layer = std::stoll(name.substr(0, dot));
  return layer < static_cast<int64_t>(sequential->size()) && !is_held(sequential, layer);
}

torch::nn::Sequential build_layers(const std::vector<LayerSpec>& specs,
                                   const std::vector<bool>& held, uint64_t seed) {
  if (held.size() != specs.size()) {
    throw std::logic_error("build_layers: " + std::to_string(held.size()) + " flags for " +
                           std::to_string(specs.size()) + " layers");
  }
  torch::nn::Sequential sequential;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto index = static_cast<int64_t>(i);
    if (held[i]) {
      const bool share = can_share(specs[i], index, held);
      sequential->push_back(std::to_string(i),
                            build_one(specs[i], index, seed, share ? &sequential : nullptr));
    } else {
      sequential->push_back(std::to_string(i), NotHeld(index));
    }
  }
  return sequential;
}

std::vector<int64_t> layer_sizes(const std::vector<LayerSpec>& specs, uint64_t seed) {
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t size = specs[i].parameters;
    if (size == 0) {
      const auto built = build_one(specs[i], static_cast<int64_t>(i), seed);
      for (const auto& p : built.ptr()->parameters()) size += p.numel();
    }
    sizes.push_back(size);
  }
  return sizes;
}

}  // namespace pipetrain
