// GPT-2 weights in the layout of Hugging Face's transformers.GPT2LMHeadModel, for the Sequential
// nn::gpt2(config) builds: a folder holding model.safetensors (names
// "transformer.h.0.attn.c_attn.weight", ...; the Conv1D projections stored [in, out], the transpose
// of a Linear's weight; lm_head tied to wte and so not stored), or shards and their index
// (hf_folder.h), and config.json. `pipetrain export --format hf` writes one; `--init-from DIR`
// starts training from one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/hf_folder.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/nn/gpt2.h"

namespace pipetrain {

// Every tensor of a GPT-2 of shape `config`, pipetrain's name ("1.attn.c_attn.weight", shape
// [3C, C]) and Hugging Face's ("transformer.h.0.attn.c_attn.weight", stored transposed), in
// pipetrain's name order. The head, tied to wte, is not stored. Pure: no file read.
std::vector<HfTensor> hf_gpt2_tensors(const nn::Gpt2Config& config);

// Writes `weights` (pipetrain's names, as in a checkpoint's model.safetensors) of a GPT-2 of shape
// `config` into `dir` (created if missing). Throws std::invalid_argument naming a missing tensor
// or one whose shape disagrees with `config`, std::runtime_error when a file cannot be written.
void export_hf_gpt2(const std::map<std::string, at::Tensor>& weights, const nn::Gpt2Config& config,
                    const std::string& dir);

// `dir`/config.json (created if missing) for a GPT-2 of shape `config`, as transformers reads it:
// what export writes, and what fit keeps beside a run's checkpoints for export.
void write_hf_gpt2_config(const nn::Gpt2Config& config, const std::string& dir);

// The shape in `dir`/config.json. Throws std::invalid_argument naming the file and what is
// missing or not GPT-2.
nn::Gpt2Config read_hf_gpt2_config(const std::string& dir);
// The weights in `dir`, a GPT-2 of shape `config`, under pipetrain's names
// (ready for load_weights; the tied head under wte's name alone). Throws std::invalid_argument
// naming the file and the tensor it lacks. With `wanted`, only the tensors whose pipetrain names
// it accepts are read (a process building some layers reads theirs alone).
std::map<std::string, at::Tensor> read_hf_gpt2_weights(
    const std::string& dir, const nn::Gpt2Config& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted = {});
// The same from a folder already opened.
std::map<std::string, at::Tensor> read_hf_gpt2_weights(
    const HfFolder& folder, const nn::Gpt2Config& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted = {});

// nn::gpt2_layers(config), each layer, where `init_from` names a Hugging Face GPT-2 folder, given
// that layer's tensors of it as it is built: each process reads only its own layers'. The folder's
// listing is read once, here, and shared by the layers' builds.
std::vector<LayerSpec> hf_gpt2_layers(const nn::Gpt2Config& config, const std::string& init_from);
// The same from a folder already opened, which the layers' builds share.
std::vector<LayerSpec> hf_gpt2_layers(const nn::Gpt2Config& config,
                                      std::shared_ptr<const HfFolder> folder);

// What read_hf_gpt2_weights checks of every tensor (there, of its shape), from the file's header
// alone: run before a model of `config` is built, so that a config.json that does not describe its
// weights (a vocabulary of 1e12) is refused naming the tensor, not met by the allocator.
void check_hf_gpt2_weights(const std::string& dir, const nn::Gpt2Config& config);
void check_hf_gpt2_weights(const HfFolder& folder, const nn::Gpt2Config& config);

// The shape of the GPT-2 whose weights these are: n_layer, n_embd, vocab and block size from the
// tensors, n_head from `n_head`. Throws std::invalid_argument when `n_head` is 0 (unknown).
nn::Gpt2Config gpt2_config_of(const std::map<std::string, at::Tensor>& weights, int64_t n_head);

}  // namespace pipetrain
