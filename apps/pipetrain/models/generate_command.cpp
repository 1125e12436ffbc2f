#include "models/generate_command.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>

#include <pipetrain/balance.h>
#include <pipetrain/checkpoint_io.h>
#include <pipetrain/checkpoint_path.h>
#include <pipetrain/cluster_environment.h>
#include <pipetrain/hf_decoder.h>
#include <pipetrain/hf_gpt2.h>
#include <pipetrain/hub_model.h>
#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/embedding.h>
#include <pipetrain/nn/generate.h>
#include <pipetrain/nn/gpt2.h>
#include <pipetrain/tokenizer.h>
#include <pipetrain/trainer.h>
#include <pipetrain/world.h>

#include "hub/hf_layers.h"
#include "models/models.h"
#include "models/run_config.h"

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The prompts of the flags, then of the file.
std::vector<std::string> read_prompts(const GenerateRequest& request) {
  std::vector<std::string> prompts = request.prompts;
  if (!request.prompts_file.empty()) {
    const auto in_file = read_prompts_file(request.prompts_file, "--prompts-file");
    prompts.insert(prompts.end(), in_file.begin(), in_file.end());
  }
  if (prompts.empty()) {
    throw std::invalid_argument("generate: no prompts: pass --prompt TEXT or --prompts-file FILE");
  }
  return prompts;
}

// `folder`'s generation_config.json's eos_token_id (a number or a list), else the tokenizer's EOS
// (if any).
std::vector<int64_t> eos_ids(const std::string& folder, const std::optional<Tokenizer>& tokenizer) {
  const fs::path path = fs::path(folder) / "generation_config.json";
  if (!folder.empty() && fs::exists(path)) {
    const Json config = Json::parse(std::ifstream(path), nullptr, /*allow_exceptions=*/false);
    const auto eos = config.is_object() ? config.find("eos_token_id") : config.end();
    if (eos != config.end() && eos->is_number_integer()) return {eos->get<int64_t>()};
    if (eos != config.end() && eos->is_array()) return eos->get<std::vector<int64_t>>();
  }
  if (tokenizer) {
    if (const auto eos = tokenizer->eos_token_id()) return {*eos};
  }
  return {};
}

torch::Device device_for(const std::string& accelerator) {
  if (accelerator == "cpu") return torch::kCPU;
  if (accelerator == "cuda" || accelerator == "gpu") {
    if (!torch::cuda::is_available()) {
      throw std::invalid_argument("--accelerator " + accelerator + ": no GPU is visible here");
    }
    return torch::Device(torch::kCUDA, 0);
  }
  if (accelerator != "auto") {
    throw std::invalid_argument("--accelerator " + accelerator + ": use cpu, cuda or auto");
  }
  return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
}

// "1,2,3" as ids; std::invalid_argument naming `text` where it is not a list of ids.
std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || id < 0) {
      throw std::invalid_argument("--prompt-ids " + text +
                                  ": a comma-separated list of token ids (0 or more each)");
    }
    ids.push_back(id);
    at = comma + 1;
  }
  return ids;
}

at::ScalarType dtype_for(const std::string& dtype, const torch::Device& device) {
  if (dtype.empty()) return device.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  if (dtype == "bf16") return torch::kBFloat16;
  if (dtype == "fp32") return torch::kFloat;
  throw std::invalid_argument("--dtype " + dtype + ": use bf16 or fp32");
}

// Layers per process of a pipeline over `stages` processes for a model of `layers` layers (an
// embedding, blocks, a final norm, a head): the blocks spread evenly, rank 0 with the embedding
// before its blocks and the last rank with the norm and head after its own.
std::vector<int64_t> stage_sizes(int64_t layers, int64_t stages) {
  const int64_t blocks = layers - 3;
  if (stages > blocks) {
    throw std::invalid_argument("--devices " + std::to_string(stages) + ": a model of " +
                                std::to_string(blocks) + " blocks generates over " +
                                std::to_string(blocks) + " processes at most");
  }
  std::vector<int64_t> sizes(static_cast<size_t>(stages), blocks / stages);
  for (int64_t r = 0; r < blocks % stages; ++r) ++sizes[static_cast<size_t>(r)];
  sizes.front() += 1;
  sizes.back() += 2;
  return sizes;
}

// The layers of `request`'s model described one by one, each reading its own tensors as it is
// built (a tied head none: its values are its tie's); `vocab_size` the model's.
std::vector<LayerSpec> layer_specs(const GenerateRequest& request, int64_t& vocab_size) {
  if (request.init_from.empty() == request.ckpt_path.empty()) {
    throw std::invalid_argument(
        "generate: pass --init-from DIR (a GPT-2, Llama or Qwen3 Hugging Face folder) or "
        "--ckpt-path (a checkpoint of fit's), one of them");
  }
  if (!request.init_from.empty()) {
    const auto hub = HubModel::open(request.init_from);
    vocab_size = hub.vocab_size();
    return hub.layers();
  }
  const std::string checkpoint =
      resolve_checkpoint_path(request.ckpt_path, request.default_root_dir);
  const std::string run = run_config_dir(checkpoint);
  const HubFamily* family = run.empty() ? nullptr : find_hub_family(read_model_type(run));
  if (family == nullptr) {
    throw std::invalid_argument(
        "--ckpt-path " + checkpoint +
        ": no config.json of a gpt2, llama or qwen3 run beside it (fit keeps one in the run's "
        "folder, above checkpoints/); generate reads those checkpoints, or a Hugging Face folder "
        "(--init-from)");
  }
  std::vector<LayerSpec> specs;
  if (family->architecture == HubArchitecture::kGpt2) {
    const auto config = read_hf_gpt2_config(run);
    vocab_size = config.vocab_size;
    specs = nn::gpt2_layers(config);
  } else {
    const auto config = read_hf_decoder_config(run);
    vocab_size = config.vocab_size;
    specs = nn::decoder_layers(config);
  }
  const auto stored = std::make_shared<const StoredWeights>(checkpoint);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].tied_to.empty()) continue;
    specs[i].build = [stored, i, build = std::move(specs[i].build)] {
      auto layer = build();
      const std::string prefix = std::to_string(i) + ".";
      std::set<std::string> names;
      for (const auto& [name, shape] : stored->shapes()) {
        if (name.rfind(prefix, 0) == 0) names.insert(name);
      }
      load_layer_weights(layer, static_cast<int64_t>(i), stored->read(names), stored->source());
      return layer;
    };
  }
  return specs;
}

// This process's run of the model's layers: all of them (`world` nullptr), or its stage of a
// pipeline over `world` (--balance, else stage_sizes), each layer built here alone. A tied layer
// (the head tied to the embedding) shares its tie's tensor where this process holds both, else
// takes its values.
torch::nn::Sequential read_stage(const GenerateRequest& request, const World* world,
                                 int64_t& vocab_size) {
  const auto specs = layer_specs(request, vocab_size);
  const int64_t rank = world ? world->rank() : 0;
  const int64_t layers = static_cast<int64_t>(specs.size()), stages = world ? world->size() : 1;
  auto sizes = request.balance;
  if (sizes.empty()) {
    sizes = stage_sizes(layers, stages);
  } else if (static_cast<int64_t>(sizes.size()) != stages) {
    throw std::invalid_argument("--balance " + format_balance(sizes) + " names " +
                                std::to_string(sizes.size()) + " stages for --devices " +
                                std::to_string(stages) + ": give one count per process");
  } else {
    validate_balance(sizes, layers);
  }
  size_t first = 0;
  for (int64_t r = 0; r < rank; ++r) first += static_cast<size_t>(sizes[r]);
  torch::nn::Sequential stage;
  torch::NoGradGuard no_grad;
  // "0.weight": layer 0, its "weight".
  const auto layer_of = [](const std::string& global) {
    return std::stoul(global.substr(0, global.find('.')));
  };
  for (size_t i = first; i < first + static_cast<size_t>(sizes[rank]); ++i) {
    const bool holds_ties =
        !specs[i].tied_to.empty() &&
        std::all_of(specs[i].tied_to.begin(), specs[i].tied_to.end(),
                    [&](const auto& tie) { return layer_of(tie.second) >= first; });
    if (holds_ties && specs[i].build_sharing) {
      stage->push_back(specs[i].build_sharing(stage));
      continue;
    }
    auto layer = specs[i].build();
    for (const auto& [own, global] : specs[i].tied_to) {
      const size_t dot = global.find('.');
      const auto source = specs[layer_of(global)].build();
      layer.ptr()->named_parameters()[own].copy_(
          source.ptr()->named_parameters()[global.substr(dot + 1)]);
    }
    stage->push_back(layer);
  }
  return stage;
}

}  // namespace

std::string decode_generated(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<int64_t> known;
  for (const int64_t id : ids) {
    if (tokenizer.id_to_token(id)) known.push_back(id);
  }
  return tokenizer.decode(known, /*skip_special_tokens=*/true);
}

int64_t tokenizer_vocab_limit(const torch::nn::Sequential& model, const Tokenizer& tokenizer) {
  const auto* head =
      model->size() > 0 ? model->ptr(model->size() - 1)->as<nn::LMHeadImpl>() : nullptr;
  if (head == nullptr || tokenizer.vocab_size() >= head->weight.size(0)) return 0;
  return tokenizer.vocab_size();
}

std::vector<std::string> read_prompts_file(const std::string& path, const std::string& flag) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) throw std::invalid_argument(flag + " " + path + ": cannot be read");
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<std::string> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    if (line.front() != '{') {
      prompts.push_back(line);
      continue;
    }
    const Json object = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto prompt = object.is_object() ? object.find("prompt") : object.end();
    if (prompt == object.end() || !prompt->is_string()) {
      throw std::invalid_argument(flag + " " + path + ", line " + std::to_string(number) +
                                  ": a JSON line needs a string field \"prompt\"");
    }
    prompts.push_back(prompt->get<std::string>());
  }
  return prompts;
}

int generate_text(const GenerateRequest& request, std::ostream& out) {
  const bool pipe = request.strategy == "pipe";
  if (!pipe && request.strategy != "single") {
    throw std::invalid_argument("--strategy " + request.strategy + ": use single or pipe");
  }
  if (request.devices < 1 || (!pipe && request.devices != 1)) {
    throw std::invalid_argument("--devices " + std::to_string(request.devices) +
                                ": give 1, or with --strategy pipe the processes the model's "
                                "layers are spread over");
  }
  if (pipe && request.prompts_file == "-") {
    throw std::invalid_argument(
        "--prompts-file -: under --strategy pipe every process reads the prompts: give a file");
  }
  if (!request.ckpt_path.empty() && request.tokenizer.empty() && request.prompt_ids.empty()) {
    throw std::invalid_argument(
        "--ckpt-path: pass --tokenizer (the tokenizer.json, or the folder, of the model fit "
        "started from), or --prompt-ids");
  }
  const bool given_ids = !request.prompt_ids.empty();
  if (given_ids && (!request.prompts.empty() || !request.prompts_file.empty() || request.chat)) {
    throw std::invalid_argument(
        "--prompt-ids are tokens already: leave out --prompt, --prompts-file and --chat");
  }
  // A pipeline's processes: this one launches them and waits (each then runs what follows), unless
  // torchrun or SLURM did.
  if (pipe) {
    const auto launch = TrainerOptions()
                            .strategy("pipe")
                            .devices(request.devices)
                            .accelerator(request.accelerator == "auto"  ? "auto"
                                         : request.accelerator == "cpu" ? "cpu"
                                                                        : "cuda");
    if (const auto status = launch_ranks(launch)) return *status;
  }
  std::vector<std::string> prompts;
  std::optional<Tokenizer> tokenizer;
  std::vector<std::vector<int64_t>> ids;
  if (given_ids) {
    for (const auto& text : request.prompt_ids) ids.push_back(parse_ids(text));
  } else {
    prompts = read_prompts(request);
    tokenizer =
        Tokenizer::from_file(request.tokenizer.empty() ? request.init_from : request.tokenizer);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ids.push_back(request.chat ? tokenizer->encode(tokenizer->apply_chat_template(
                                                         {{"user", prompts[i]}},
                                                         /*add_generation_prompt=*/true),
                                                     /*add_special_tokens=*/false)
                                 : tokenizer->encode(prompts[i]));
      if (ids.back().empty()) {
        throw std::invalid_argument("generate: prompt " + std::to_string(i + 1) +
                                    " has no tokens: give it some text");
      }
    }
  }

  // The whole model here, or this rank's stage of it.
  torch::nn::Sequential model;
  std::shared_ptr<World> world;
  int64_t vocab_size = 0;
  auto device = device_for(request.accelerator);
  if (pipe) {
    world = World::connect(*select_cluster_environment(), World::kDefaultTimeout, device.type());
    if (world->size() != request.devices) {
      throw std::invalid_argument("--devices " + std::to_string(request.devices) +
                                  ": the run has " + std::to_string(world->size()) +
                                  " processes (torchrun's or SLURM's): make --devices match");
    }
    device = world->device();
  }
  model = read_stage(request, world.get(), vocab_size);
  model->to(device, dtype_for(request.dtype, device));
  const auto generate = [&](const nn::GenerationOptions& options,
                            const nn::TokenCallback& on_token = nullptr) {
    return world ? nn::generate(model, *world, ids, options, on_token)
                 : nn::generate(model, ids, options, on_token);
  };
  // Every rank generates; rank 0 alone writes.
  std::ostream nowhere(nullptr);
  std::ostream& shown = world && world->rank() != 0 ? nowhere : out;

  const auto options =
      nn::GenerationOptions()
          .max_new_tokens(request.max_new_tokens)
          .temperature(request.temperature)
          .top_k(request.top_k)
          .top_p(request.top_p)
          .seed(request.seed)
          .eos_token_ids(eos_ids(!request.init_from.empty()            ? request.init_from
                                 : fs::is_directory(request.tokenizer) ? request.tokenizer
                                                                       : "",
                                 tokenizer))
          .pad_token_id(tokenizer ? tokenizer->pad_token_id().value_or(0) : 0)
          .vocab_limit(tokenizer && tokenizer->vocab_size() < vocab_size ? tokenizer->vocab_size()
                                                                         : 0);
  if (given_ids) {
    for (const auto& made : generate(options)) {
      for (size_t i = 0; i < made.size(); ++i) shown << (i ? "," : "") << made[i];
      shown << "\n";
    }
    shown << std::flush;
    return 0;
  }
  if (prompts.size() == 1) {
    // The text as it is made: each token's decoding of all made so far, less what is printed
    // (a character of several tokens appears once whole).
    shown << prompts.front() << std::flush;
    std::vector<int64_t> made;
    std::string printed;
    generate(options, [&](size_t, int64_t token) {
      made.push_back(token);
      const std::string text = decode_generated(*tokenizer, made);
      const bool partial_character =  // U+FFFD: bytes a later token completes
          text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0 &&
          !partial_character) {
        shown << text.substr(printed.size()) << std::flush;
        printed = text;
      }
    });
    const std::string text = decode_generated(*tokenizer, made);
    if (text.compare(0, printed.size(), printed) == 0) shown << text.substr(printed.size());
    shown << std::endl;
    return 0;
  }
  const auto made = generate(options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i > 0) shown << "---------------\n";
    shown << prompts[i] << decode_generated(*tokenizer, made[i]) << "\n";
  }
  shown << std::flush;
  return 0;
}

}  // namespace pipetrain::cli
