// The weights of a Hugging Face model folder, whatever the model: one model.safetensors, or shards
// model-0000k-of-0000N.safetensors that model.safetensors.index.json names (as transformers'
// save_pretrained writes them). Reading opens the folder once (HfFolder, shared by every layer a
// process builds); writing splits a model into shards as save_pretrained does (write_hf_weights).
// What the tensors are called and shaped is each family's (hf_decoder.h, hf_gpt2.h): an HfTensor
// list, pure data, maps pipetrain's names to Hugging Face's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/safetensors.h"

namespace pipetrain {

// transformers' save_pretrained shards past "5GB" (powers of 1000).
constexpr int64_t kHfDefaultMaxShardBytes = 5'000'000'000;

// One stored tensor of a model: its name in pipetrain ("3.self_attn.q_proj.weight") and in the
// Hugging Face folder ("model.layers.2.self_attn.q_proj.weight"), its shape under pipetrain's name,
// and whether the folder stores it transposed (GPT-2's Conv1D keeps [in, out]).
struct HfTensor {
  std::string name;
  std::string hf_name;
  std::vector<int64_t> shape;
  bool transposed = false;
};

// `weights` (pipetrain's names) under the Hugging Face names of `tensors`, transposed where the
// folder stores them so; a tensor `tensors` does not list is left out. Throws
// std::invalid_argument naming a tensor of `tensors` that `weights` lacks.
TensorMap to_hf_names(const std::map<std::string, at::Tensor>& weights,
                      const std::vector<HfTensor>& tensors);
// The reverse: the tensors of `stored` (Hugging Face's names) that `tensors` lists, under
// pipetrain's names and layout; those `stored` lacks are left out.
std::map<std::string, at::Tensor> from_hf_names(const TensorMap& stored,
                                                const std::vector<HfTensor>& tensors);

// The header of a weights file of a Hugging Face folder handed in: a damaged one is bad input
// (std::invalid_argument, naming the file), as a missing one is.
std::map<std::string, SafetensorsEntry> read_weights_header(const std::string& path);

// A folder's weights, its listing read once: which file holds each tensor (the single file's
// header, or the index), the shards' headers read when first asked for. Cheap to share between
// threads and copies (a std::shared_ptr<const HfFolder> captured by each layer's build).
class HfFolder {
 public:
  // Throws std::invalid_argument naming `dir` when it holds neither model.safetensors nor
  // model.safetensors.index.json, or naming the file whose listing is damaged.
  explicit HfFolder(const std::string& dir);

  const std::string& dir() const;
  // The file whose listing names the tensors (model.safetensors or the index), for messages.
  const std::string& listing() const;
  // Every tensor's Hugging Face name -> the path of the file holding it.
  const std::map<std::string, std::string>& file_of() const;
  bool contains(const std::string& hf_name) const { return file_of().count(hf_name) > 0; }
  // The tensor as its file's header lists it (the header read once). Throws std::invalid_argument
  // when its file is missing, damaged or does not hold it.
  SafetensorsEntry entry(const std::string& hf_name) const;
  // The named tensors (Hugging Face's names), on the CPU as stored; each file holding some is
  // opened once, the others not at all. Throws as entry() does.
  TensorMap read(const std::set<std::string>& hf_names) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Tensors of `bytes` each split into shards (their indices) as save_pretrained splits a state dict:
// in order, a new shard when the next tensor would take the current one past `max_bytes`; a
// tensor larger than that alone.
std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes);

// "model-00002-of-00005.safetensors" for index 1 of 5.
std::string shard_name(size_t index, size_t count);

// Whether a file of this name is one an export writes into its folder (config.json, the weights
// and their index, the tokenizer's files), or one of their temporary files a killed export left.
bool is_export_file(const std::string& name);

// Where an export reads the weights from: every tensor's shape (pipetrain's names), and the
// tensors asked for, so that an export holds one output shard's tensors at a time.
struct WeightSource {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::function<std::map<std::string, at::Tensor>(const std::set<std::string>& names)> read;

  static WeightSource of(const std::map<std::string, at::Tensor>& weights);
  static WeightSource of(const StoredWeights& stored);  // a checkpoint's files, read on demand
};

// Writes the `tensors` of `weights` (every one there, of its shape: the caller checks) into `dir`
// (which exists) in `dtype`, under their Hugging Face names and layout: one model.safetensors when
// they fit in `max_shard_bytes`, else shards and their index; one output shard read and converted
// at a time. Weight files of an earlier export that this one did not write are removed, as
// save_pretrained removes them (transformers would read a stale model.safetensors before a new
// index). Every file is written atomically; std::runtime_error names one that cannot be.
void write_hf_weights(const WeightSource& weights, const std::vector<HfTensor>& tensors,
                      const std::string& dir, int64_t max_shard_bytes, at::ScalarType dtype);

}  // namespace pipetrain
