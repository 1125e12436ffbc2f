// A model described layer by layer, so that each process builds only the layers of its own stages
// (DeepSpeed's LayerSpec, Megatron's per-stage build): no process ever holds the whole model.
//
//   std::vector<pipetrain::LayerSpec> layers;
//   layers.push_back(pipetrain::layer([] { return torch::nn::Embedding(50304, 768); }));
//   for (int i = 0; i < 12; ++i) layers.push_back(pipetrain::layer([] { return Block(768); }));
//   MyModule module(std::move(layers));  // a pipetrain::Module built from specs
//
// The Trainer builds a layer only on the processes holding it, each with the default CPU generator
// seeded from the run's seed and the layer's index: the weights of a layer are the same under
// every balance, strategy and number of processes, so a pipelined run starts where `single` does.
// Where another process holds a layer, the Sequential has a `NotHeld` placeholder in its place,
// so layers keep their global names ("3.weight") everywhere. Layers on different stages cannot
// share a tensor: tie them by name (LayerSpec::tie), and the first name's values become every
// copy's.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain {

struct LayerSpec {
  // Builds the layer (on the CPU; the strategy moves it to its device).
  std::function<torch::nn::AnyModule()> build;
  // Its number of parameter elements, for a balance by size without building it; 0: unknown (a
  // balance by size then builds it alone to count them, one layer at a time).
  int64_t parameters = 0;
  // Its parameters that are another layer's (a head tied to the embedding): its own name -> the
  // other's global name, {"weight": "0.weight"}. The copy starts from the other's values and they
  // train as one parameter (PipeOptions::tied_parameters).
  std::map<std::string, std::string> tied_to;
  // Where the same process holds the layers it is tied to (one stage, or a V schedule's first
  // rank): builds it sharing their tensors, given the layers built before it, so that the process
  // holds one tensor (one gradient, one optimizer state), as a model built whole does. Unset: a
  // copy there too.
  std::function<torch::nn::AnyModule(const torch::nn::Sequential& built)> build_sharing;

  // Ties parameter `own` to `global_name`; `sharing` as build_sharing.
  template <typename BuildSharing>
  LayerSpec& tie(const std::string& own, const std::string& global_name, BuildSharing sharing) {
    tied_to[own] = global_name;
    build_sharing = [sharing = std::move(sharing)](const torch::nn::Sequential& built) {
      return torch::nn::AnyModule(sharing(built));
    };
    return *this;
  }
  LayerSpec& tie(const std::string& own, const std::string& global_name) {
    tied_to[own] = global_name;
    return *this;
  }
};

// `build` returns any LibTorch module holder (torch::nn::Linear, a TORCH_MODULE of one's own).
template <typename Build>
LayerSpec layer(Build build, int64_t parameters = 0) {
  LayerSpec spec;
  spec.build = [build = std::move(build)] { return torch::nn::AnyModule(build()); };
  spec.parameters = parameters;
  return spec;
}

// Stands where a layer held by another process would be: no parameters, and a forward that
// throws, naming the layer.
class NotHeldImpl : public torch::nn::Module {
 public:
  explicit NotHeldImpl(int64_t index) : index_(index) {}
  at::Tensor forward(const at::Tensor& input);
  int64_t index() const { return index_; }

 private:
  int64_t index_;
};
TORCH_MODULE(NotHeld);

// Whether layer `index` of `sequential` is built here (not a NotHeld placeholder).
bool is_held(const torch::nn::Sequential& sequential, int64_t index);
// Whether `name` ("3.weight") is a tensor's global name in a layer of `sequential` that another
// process holds: one this process cannot check.
bool held_elsewhere(const torch::nn::Sequential& sequential, const std::string& name);

// The Sequential of `specs` as one process holds it: layer i built (under its seed, the default
// CPU generator put back afterwards) where `held[i]`, a NotHeld placeholder elsewhere.
torch::nn::Sequential build_layers(const std::vector<LayerSpec>& specs,
                                   const std::vector<bool>& held, uint64_t seed);

// Each layer's parameter elements: given by its spec, or counted by building it alone.
std::vector<int64_t> layer_sizes(const std::vector<LayerSpec>& specs, uint64_t seed);

}  // namespace pipetrain
