#include "models/generate_command.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/checkpoint_path.h>
#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/embedding.h>
#include <pipetrain/nn/generate.h>
#include <pipetrain/nn/gpt2.h>
#include <pipetrain/tokenizer.h>

#include "models/hf_decoder.h"
#include "models/hf_gpt2.h"
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

// Whether `dir`/config.json says GPT-2; a folder without a readable one is left to the decoder's
// reader, whose message names what is missing.
bool is_gpt2(const std::string& dir) {
  const Json config = Json::parse(std::ifstream(fs::path(dir) / "config.json"), nullptr,
                                  /*allow_exceptions=*/false);
  const auto type = config.is_object() ? config.find("model_type") : config.end();
  return type != config.end() && type->is_string() && type->get<std::string>() == "gpt2";
}

// The model of a Hugging Face folder, or of a checkpoint (`weights`, read) whose run's
// config.json is in `dir`: a GPT-2 or a decoder, as its model_type says. `source` names the
// weights in messages.
torch::nn::Sequential model_of(
    const std::string& dir, const std::string& source,
    const std::function<std::map<std::string, at::Tensor>(const nn::Gpt2Config&)>& gpt2_weights,
    const std::function<std::map<std::string, at::Tensor>(const nn::DecoderConfig&)>&
        decoder_weights) {
  if (is_gpt2(dir)) {
    const nn::Gpt2Config config = read_hf_gpt2_config(dir);
    auto model = nn::gpt2(config);
    load_weights(model, gpt2_weights(config), source);
    return model;
  }
  const nn::DecoderConfig config = read_hf_decoder_config(dir);
  auto model = nn::decoder(config);
  load_weights(model, decoder_weights(config), source);
  return model;
}

// The model of `request`: a Hugging Face folder's, or a checkpoint's in the shape of its run's
// config.json.
torch::nn::Sequential read_model(const GenerateRequest& request) {
  if (request.init_from.empty() == request.ckpt_path.empty()) {
    throw std::invalid_argument(
        "generate: pass --init-from DIR (a GPT-2, Llama or Qwen3 Hugging Face folder) or "
        "--ckpt-path (a checkpoint of fit's), one of them");
  }
  if (!request.init_from.empty()) {
    const std::string& folder = request.init_from;
    return model_of(
        folder, folder,
        [&](const nn::Gpt2Config& config) {
          check_hf_gpt2_weights(folder, config);
          return read_hf_gpt2_weights(folder, config);
        },
        [&](const nn::DecoderConfig& config) {
          check_hf_decoder_weights(folder, config);
          return read_hf_decoder_weights(folder, config);
        });
  }
  const std::string checkpoint =
      resolve_checkpoint_path(request.ckpt_path, request.default_root_dir);
  const std::string run = run_config_dir(checkpoint);
  const std::string type = run.empty() ? "" : read_model_type(run);
  if (type != "gpt2" && !is_decoder(type)) {
    throw std::invalid_argument(
        "--ckpt-path " + checkpoint +
        ": no config.json of a gpt2, llama or qwen3 run beside it (fit keeps one in the run's "
        "folder, above checkpoints/); generate reads those checkpoints, or a Hugging Face folder "
        "(--init-from)");
  }
  const auto weights = [&](const auto&) { return read_checkpoint_weights(checkpoint); };
  return model_of(run, checkpoint, weights, weights);
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

void generate_text(const GenerateRequest& request, std::ostream& out) {
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

  auto model = read_model(request);
  const auto device = device_for(request.accelerator);
  model->to(device, dtype_for(request.dtype, device));

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
          .vocab_limit(tokenizer ? tokenizer_vocab_limit(model, *tokenizer) : 0);
  if (given_ids) {
    for (const auto& made : nn::generate(model, ids, options)) {
      for (size_t i = 0; i < made.size(); ++i) out << (i ? "," : "") << made[i];
      out << "\n";
    }
    out << std::flush;
    return;
  }
  if (prompts.size() == 1) {
    // The text as it is made: each token's decoding of all made so far, less what is printed
    // (a character of several tokens appears once whole).
    out << prompts.front() << std::flush;
    std::vector<int64_t> made;
    std::string printed;
    nn::generate(model, ids, options, [&](size_t, int64_t token) {
      made.push_back(token);
      const std::string text = decode_generated(*tokenizer, made);
      const bool partial_character =  // U+FFFD: bytes a later token completes
          text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0 &&
          !partial_character) {
        out << text.substr(printed.size()) << std::flush;
        printed = text;
      }
    });
    const std::string text = decode_generated(*tokenizer, made);
    if (text.compare(0, printed.size(), printed) == 0) out << text.substr(printed.size());
    out << std::endl;
    return;
  }
  const auto made = nn::generate(model, ids, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i > 0) out << "---------------\n";
    out << prompts[i] << decode_generated(*tokenizer, made[i]) << "\n";
  }
  out << std::flush;
}

}  // namespace pipetrain::cli
