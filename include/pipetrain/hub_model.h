// A Hugging Face Hub model to fine-tune: a folder holding config.json and the weights in
// safetensors (GPT-2, Llama 3, Qwen3, as save_pretrained or `pipetrain export` writes them), read
// into the layers pipetrain::nn builds, and a checkpoint of them written back as such a folder.
//
//   const auto hub = pipetrain::HubModel::open("Qwen3-0.6B");
//   pipetrain::LanguageModel model(hub.layers(), pipetrain::LanguageModelOptions().lr(1e-5));
//   trainer.fit(model, loader);  // under any strategy: each process reads its own layers' tensors
//   hub.export_checkpoint(root + "/checkpoints/last.ckpt", "Qwen3-0.6B-tuned");
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/hf_folder.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/nn/decoder.h"
#include "pipetrain/nn/gpt2.h"

namespace pipetrain {

// How a family's models are built: nn::gpt2's layers, or nn::decoder's (Llama 3, Qwen3).
enum class HubArchitecture { kGpt2, kDecoder };

// A family of models pipetrain reads and writes, named by Hugging Face's model_type.
struct HubFamily {
  std::string model_type;  // "gpt2", "llama", "qwen3"
  HubArchitecture architecture;
  // Its published shapes (nn::gpt2_preset's, nn::decoder_preset's); the first is the default.
  std::vector<std::string> presets;
};

// Every family: gpt2, llama, qwen3.
const std::vector<HubFamily>& hub_families();
// The family of `model_type`; nullptr when pipetrain has none of that name.
const HubFamily* find_hub_family(const std::string& model_type);

struct HubExportOptions {
  // The weights' dtype in the folder (bf16, fp16 or fp32); unset: bf16, and fp32 for GPT-2, whose
  // export is one fp32 file.
  TORCH_ARG(std::optional<at::ScalarType>, dtype) = std::nullopt;
  // The largest weights file, past which they are sharded (Llama, Qwen3).
  TORCH_ARG(int64_t, max_shard_bytes) = kHfDefaultMaxShardBytes;
  // Whether the tokenizer files (and generation_config.json) of the folder opened are copied beside
  // the weights (Llama, Qwen3), so that the export is a model transformers runs as it is.
  TORCH_ARG(bool, copy_tokenizer) = true;
};

class HubModel {
 public:
  // Reads `dir`/config.json, whose model_type names the family, and checks the weights' headers
  // against it (every tensor there, of its shape: nothing read). Throws std::invalid_argument
  // naming the file, and for a model_type of no family, naming it and the families.
  static HubModel open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const HubFamily& family() const { return *family_; }
  const std::string& model_type() const { return family_->model_type; }
  // The shape config.json gives; nullptr for the other architecture.
  const nn::Gpt2Config* gpt2_config() const { return gpt2_ ? &*gpt2_ : nullptr; }
  const nn::DecoderConfig* decoder_config() const { return decoder_ ? &*decoder_ : nullptr; }
  int64_t vocab_size() const;
  // The longest sequence it is trained on: GPT-2's positions, a decoder's block_size (at most
  // max_position_embeddings).
  int64_t block_size() const;

  // The model's layers, built per rank (layer_spec.h): each process builds only its stages'
  // layers, each given its tensors of the folder as it is built (checked: names, shapes, finite
  // values). The folder's listing is read once and shared by the layers.
  std::vector<LayerSpec> layers() const;
  // Model FLOPs of one token's forward and backward at block_size() (ThroughputMonitorOptions'
  // flops_per_sample is this times the tokens of a sample).
  double flops_per_token() const;

  // `weights` (pipetrain's names: a checkpoint's, or a trained Sequential's state) written into
  // `out` as a Hugging Face folder of this model's family and shape. Throws std::invalid_argument
  // (before writing anything) naming a tensor that does not fit.
  void export_weights(const std::map<std::string, at::Tensor>& weights, const std::string& out,
                      const HubExportOptions& options = {}) const;
  // The same from a checkpoint (a .ckpt folder), read one output shard at a time.
  void export_checkpoint(const std::string& checkpoint, const std::string& out,
                         const HubExportOptions& options = {}) const;

 private:
  HubModel() = default;
  void export_from(const WeightSource& weights, const std::string& out,
                   const HubExportOptions& options) const;

  std::string dir_;
  const HubFamily* family_ = nullptr;
  std::shared_ptr<const HfFolder> folder_;  // its listing read once, shared by every layer
  std::optional<nn::Gpt2Config> gpt2_;
  std::optional<nn::DecoderConfig> decoder_;
};

}  // namespace pipetrain
