#include "pipetrain/hub_model.h"

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <stdexcept>

#include "io/hf_json.h"
#include "pipetrain/hf_decoder.h"
#include "pipetrain/hf_gpt2.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

// nn::decoder_preset_names() of one family, by their prefix ("llama", "qwen3"), the default first.
std::vector<std::string> decoder_presets(const std::string& family, const std::string& first) {
  std::vector<std::string> names{first};
  for (const auto& name : nn::decoder_preset_names()) {
    if (name.rfind(family, 0) == 0 && name != first) names.push_back(name);
  }
  return names;
}

std::string family_names() {
  std::string names;
  const auto& families = hub_families();
  for (size_t i = 0; i < families.size(); ++i) {
    names += (i == 0 ? "" : i + 1 == families.size() ? " and " : ", ") + families[i].model_type;
  }
  return names;
}

}  // namespace

const std::vector<HubFamily>& hub_families() {
  static const std::vector<HubFamily> families{
      {"gpt2", HubArchitecture::kGpt2, {"124M", "350M", "774M", "1558M"}},
      {"llama", HubArchitecture::kDecoder, decoder_presets("llama", "llama-150m")},
      {"qwen3", HubArchitecture::kDecoder, decoder_presets("qwen3", "qwen3-0.6b")}};
  return families;
}

const HubFamily* find_hub_family(const std::string& model_type) {
  for (const auto& family : hub_families()) {
    if (family.model_type == model_type) return &family;
  }
  return nullptr;
}

HubModel HubModel::open(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(path)) {
    throw std::invalid_argument(dir +
                                " has no config.json: pass a Hugging Face model folder (one "
                                "save_pretrained or `pipetrain export` wrote)");
  }
  const auto json = read_json_object(path);
  const JsonFields fields(path, json);
  const std::string model_type = fields.string("model_type");
  HubModel model;
  model.dir_ = dir;
  model.family_ = find_hub_family(model_type);
  if (model.family_ == nullptr) {
    fields.fail(
        "model_type",
        "is \"" + model_type + "\", a model pipetrain does not build: it reads " + family_names());
  }
  model.folder_ = std::make_shared<const HfFolder>(dir);
  if (model.family_->architecture == HubArchitecture::kGpt2) {
    model.gpt2_ = read_hf_gpt2_config(dir);
    check_hf_gpt2_weights(*model.folder_, *model.gpt2_);
  } else {
    model.decoder_ = read_hf_decoder_config(dir);
    check_hf_decoder_weights(*model.folder_, *model.decoder_);
  }
  return model;
}

int64_t HubModel::vocab_size() const { return gpt2_ ? gpt2_->vocab_size : decoder_->vocab_size; }

int64_t HubModel::block_size() const { return gpt2_ ? gpt2_->block_size : decoder_->block_size; }

std::vector<LayerSpec> HubModel::layers() const {
  return gpt2_ ? hf_gpt2_layers(*gpt2_, folder_) : hf_decoder_layers(*decoder_, folder_);
}

double HubModel::flops_per_token() const {
  return gpt2_ ? nn::gpt2_flops_per_token(*gpt2_) : nn::decoder_flops_per_token(*decoder_);
}

void HubModel::export_weights(const std::map<std::string, at::Tensor>& weights,
                              const std::string& out, const HubExportOptions& options) const {
  export_from(WeightSource::of(weights), out, options);
}

void HubModel::export_checkpoint(const std::string& checkpoint, const std::string& out,
                                 const HubExportOptions& options) const {
  const StoredWeights stored(checkpoint);
  export_from(WeightSource::of(stored), out, options);
}

void HubModel::export_from(const WeightSource& weights, const std::string& out,
                           const HubExportOptions& options) const {
  if (decoder_) {
    export_hf_decoder(weights, *decoder_, model_type(), out, options.max_shard_bytes(),
                      options.dtype().value_or(at::kBFloat16),
                      options.copy_tokenizer() ? dir_ : "");
    return;
  }
  // GPT-2's export is one fp32 file, as its releases are: other settings would be ignored.
  if (options.dtype().value_or(at::kFloat) != at::kFloat ||
      options.max_shard_bytes() != kHfDefaultMaxShardBytes) {
    throw std::invalid_argument(
        "a GPT-2 exports as one fp32 file: leave HubExportOptions' dtype and max_shard_bytes "
        "unset");
  }
  std::set<std::string> names;
  for (const auto& [name, shape] : weights.shapes) names.insert(name);
  export_hf_gpt2(weights.read(names), *gpt2_, out);
}

}  // namespace pipetrain
