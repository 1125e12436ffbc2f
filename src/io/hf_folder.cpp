#include "pipetrain/hf_folder.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <regex>
#include <stdexcept>

#include "io/file_writer.h"
#include "io/hf_json.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool is_weight_file(const std::string& name) {
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, kShard);
}

// Weight files an earlier export may have left in `dir` that this one did not write.
void remove_stale_weight_files(const fs::path& dir, const std::set<std::string>& written) {
  std::vector<fs::path> stale;  // listed first: a folder is not changed while it is read
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file(name) && written.count(name) == 0) stale.push_back(entry.path());
  }
  for (const auto& path : stale) {
    std::error_code error;
    fs::remove(path, error);
    if (error) {
      throw std::runtime_error("cannot remove " + path.string() + " of an earlier export (" +
                               error.message() +
                               "): remove it, or transformers may read it instead");
    }
  }
}

}  // namespace

TensorMap to_hf_names(const std::map<std::string, at::Tensor>& weights,
                      const std::vector<HfTensor>& tensors) {
  TensorMap stored;
  for (const auto& tensor : tensors) {
    const auto found = weights.find(tensor.name);
    if (found == weights.end()) {
      throw std::invalid_argument("the weights have no \"" + tensor.name + "\" (\"" +
                                  tensor.hf_name + "\" in a Hugging Face folder)");
    }
    stored[tensor.hf_name] = tensor.transposed ? found->second.t() : found->second;
  }
  return stored;
}

std::map<std::string, at::Tensor> from_hf_names(const TensorMap& stored,
                                                const std::vector<HfTensor>& tensors) {
  std::map<std::string, at::Tensor> weights;
  for (const auto& tensor : tensors) {
    const auto found = stored.find(tensor.hf_name);
    if (found == stored.end()) continue;
    weights[tensor.name] = tensor.transposed ? found->second.t().contiguous() : found->second;
  }
  return weights;
}

std::map<std::string, SafetensorsEntry> read_weights_header(const std::string& path) {
  try {
    return read_safetensors_header(path);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

struct HfFolder::State {
  std::string dir, listing;
  std::map<std::string, std::string> file_of;
  // The shards' headers, each read once, when first needed (a rank reads its own shards alone).
  std::mutex mutex;
  std::map<std::string, std::map<std::string, SafetensorsEntry>> headers;

  const std::map<std::string, SafetensorsEntry>& header(const std::string& file) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto found = headers.find(file);
    if (found != headers.end()) return found->second;
    if (!fs::is_regular_file(file)) {
      throw std::invalid_argument(listing + " puts tensors in " + file +
                                  ", which does not exist: the folder is incomplete (download or "
                                  "copy that shard)");
    }
    return headers[file] = read_weights_header(file);
  }
};

HfFolder::HfFolder(const std::string& dir) : state_(std::make_shared<State>()) {
  State& state = *state_;
  state.dir = dir;
  const fs::path folder(dir);
  // A single file first, as transformers looks for it first.
  if (fs::is_regular_file(folder / kSingleFile)) {
    state.listing = (folder / kSingleFile).string();
    state.headers[state.listing] = read_weights_header(state.listing);
    for (const auto& [name, entry] : state.headers[state.listing]) {
      state.file_of[name] = state.listing;
    }
  } else if (fs::is_regular_file(folder / kIndexFile)) {
    state.listing = (folder / kIndexFile).string();
    const Json index = read_json_object(state.listing);
    const JsonFields fields(state.listing, index);
    const Json& weight_map = fields.at("weight_map");
    if (!weight_map.is_object()) fields.fail("weight_map", "is not an object");
    for (const auto& [name, shard] : weight_map.items()) {
      // A shard is a file beside the index: no path may lead out of the folder.
      if (!shard.is_string() || shard.get<std::string>().empty() ||
          shard.get<std::string>().find('/') != std::string::npos ||
          shard.get<std::string>() == "..") {
        fields.fail("weight_map", "gives tensor \"" + name + "\" the file " + shard.dump() +
                                      ", not the name of a file beside the index");
      }
      state.file_of[name] = (folder / shard.get<std::string>()).string();
    }
  } else {
    throw std::invalid_argument(dir + " holds neither " + kSingleFile + " nor " + kIndexFile +
                                ": pass a Hugging Face model folder with its weights in "
                                "safetensors (convert .bin weights with transformers first)");
  }
}

const std::string& HfFolder::dir() const { return state_->dir; }
const std::string& HfFolder::listing() const { return state_->listing; }
const std::map<std::string, std::string>& HfFolder::file_of() const { return state_->file_of; }

SafetensorsEntry HfFolder::entry(const std::string& hf_name) const {
  const auto file = state_->file_of.find(hf_name);
  if (file == state_->file_of.end()) {
    throw std::invalid_argument(state_->listing + " has no tensor \"" + hf_name + "\"");
  }
  const auto& header = state_->header(file->second);
  const auto found = header.find(hf_name);
  if (found == header.end()) {
    throw std::invalid_argument(state_->listing + " puts tensor \"" + hf_name + "\" in " +
                                file->second +
                                ", which does not hold it: the index is not the one written "
                                "with the shards");
  }
  return found->second;
}

TensorMap HfFolder::read(const std::set<std::string>& hf_names) const {
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& name : hf_names) {
    entry(name);  // its file there, holding it
    by_file[state_->file_of.at(name)].insert(name);
  }
  TensorMap tensors;
  for (const auto& [file, names] : by_file) tensors.merge(load_safetensors(file, names));
  return tensors;
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t current = 0;
  bool open = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_bytes) {
      shards.push_back({i});
      open = false;
      continue;
    }
    if (!open || current + bytes[i] > max_bytes) {
      shards.emplace_back();
      current = 0;
      open = true;
    }
    shards.back().push_back(i);
    current += bytes[i];
  }
  return shards;
}

std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

bool is_export_file(const std::string& name) {
  // The atomic writer's temporary files: "<name>.tmp-<pid>".
  const auto temporary = name.rfind(".tmp-");
  if (temporary != std::string::npos) return is_export_file(name.substr(0, temporary));
  return name == "config.json" || is_weight_file(name) || is_tokenizer_file(name);
}

WeightSource WeightSource::of(const std::map<std::string, at::Tensor>& weights) {
  WeightSource source;
  for (const auto& [name, tensor] : weights) source.shapes[name] = tensor.sizes().vec();
  source.read = [&weights](const std::set<std::string>& names) {
    std::map<std::string, at::Tensor> some;
    for (const auto& name : names) some[name] = weights.at(name);
    return some;
  };
  return source;
}

WeightSource WeightSource::of(const StoredWeights& stored) {
  return WeightSource{stored.shapes(),
                      [&stored](const std::set<std::string>& names) { return stored.read(names); }};
}

void write_hf_weights(const WeightSource& weights, const std::vector<HfTensor>& tensors,
                      const std::string& dir, int64_t max_shard_bytes, at::ScalarType dtype) {
  std::vector<int64_t> bytes;
  for (const auto& tensor : tensors) {
    int64_t elements = 1;
    for (const int64_t size : tensor.shape) elements *= size;
    bytes.push_back(elements * static_cast<int64_t>(c10::elementSize(dtype)));
  }
  // One shard read and converted at a time: never a second whole copy of the model, and from a
  // checkpoint's files never more than one output shard's tensors.
  const fs::path folder(dir);
  const auto shards = plan_shards(bytes, max_shard_bytes);
  std::set<std::string> written;
  Json weight_map = Json::object();
  int64_t total_size = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? kSingleFile : shard_name(s, shards.size());
    std::vector<HfTensor> here;
    std::set<std::string> names;
    for (const size_t i : shards[s]) {
      here.push_back(tensors[i]);
      names.insert(tensors[i].name);
      weight_map[tensors[i].hf_name] = name;
      total_size += bytes[i];
    }
    TensorMap shard = to_hf_names(weights.read(names), here);
    for (auto& [hf_name, tensor] : shard) {
      tensor = tensor.detach().to(at::kCPU).to(dtype).contiguous();
    }
    // transformers' from_pretrained asks for the "pt" format in the metadata.
    save_safetensors((folder / name).string(), shard, {{"format", "pt"}});
    written.insert(name);
  }
  if (shards.size() > 1) {
    const Json index{{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    write_file((folder / kIndexFile).string(), index.dump(2) + "\n");
    written.insert(kIndexFile);
  }
  remove_stale_weight_files(folder, written);
}

}  // namespace pipetrain
