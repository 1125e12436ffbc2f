#include "pipetrain/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "data/tokenizer/added_vocabulary.h"
#include "data/tokenizer/bpe.h"
#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/normalizer.h"
#include "data/tokenizer/post_processor.h"
#include "data/tokenizer/pre_tokenizer.h"
#include "data/tokenizer/token_decoder.h"
#include "data/tokenizer/utf8.h"

namespace pipetrain {

namespace fs = std::filesystem;
using namespace tokenizer;

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<AddedVocabulary> added;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<TokenDecoder> decoder;
  std::optional<int64_t> bos, eos, pad;
  std::string chat_template;
  // tokenizer_config.json's special tokens by name (bos_token, ...), the template's variables.
  nlohmann::ordered_json special_tokens_map = nlohmann::ordered_json::object();
  // Parsed on first use: a template with a construct pipetrain lacks must not stop encoding.
  mutable std::once_flag parse_once;
  mutable std::unique_ptr<ChatTemplate> parsed_template;
};

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path.string() + ": cannot read the file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(path.string() + " is not valid JSON: " + error.what());
  }
}

// A token of tokenizer_config.json: a string, an AddedToken object ({"content": ...}) or null.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  throw std::invalid_argument(std::string("its ") + key +
                              " is neither a string nor a token: " + it->dump());
}

// tokenizer_config.json's chat template: a string, or a list of named templates whose "default"
// is the one apply_chat_template uses without a name.
std::string config_chat_template(const nlohmann::json& config) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& named : *it) {
      if (named.value("name", "") == "default") return named.at("template").get<std::string>();
    }
    return "";
  }
  throw std::invalid_argument("its chat_template is neither a string nor a list of templates");
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file)) {
    throw std::invalid_argument(
        file.string() + " does not exist: give a tokenizer.json or a model folder holding one");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = file.string();
  const nlohmann::json json = read_json(file);
  try {
    const auto& model = json.at("model");
    const auto type = model.value("type", std::string("BPE"));
    if (type != "BPE") {
      throw std::invalid_argument("the model '" + type +
                                  "' is not implemented (pipetrain has BPE)");
    }
    for (const char* unsupported : {"truncation", "padding"}) {
      if (json.contains(unsupported) && !json.at(unsupported).is_null()) {
        throw std::invalid_argument(std::string("its ") + unsupported +
                                    " settings are not implemented: set them to null");
      }
    }
    impl->model = std::make_unique<Bpe>(model);
    impl->normalizer = make_normalizer(json.value("normalizer", nlohmann::json()));
    impl->pre_tokenizer = make_pre_tokenizer(json.value("pre_tokenizer", nlohmann::json()));
    impl->post_processor = make_post_processor(json.value("post_processor", nlohmann::json()));
    impl->decoder = make_token_decoder(json.value("decoder", nlohmann::json()));
    impl->added = std::make_unique<AddedVocabulary>(json.value("added_tokens", nlohmann::json()),
                                                    *impl->model, impl->normalizer.get());
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(file.string() +
                                " is not a tokenizer this version reads: " + error.what());
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(file.string() + ": " + error.what());
  }

  Tokenizer tokenizer(std::move(impl));
  const fs::path config_file = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config_file)) {
    const nlohmann::json config = read_json(config_file);
    const auto id_of = [&](const char* key) -> std::optional<int64_t> {
      const auto token = config_token(config, key);
      if (!token) return std::nullopt;
      const auto id = tokenizer.token_to_id(*token);
      if (!id) {
        throw std::invalid_argument(config_file.string() + ": its " + key + " '" + *token +
                                    "' is not a token of " + file.string());
      }
      return id;
    };
    try {
      for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                              "cls_token", "mask_token"}) {
        if (const auto token = config_token(config, key)) {
          tokenizer.impl_->special_tokens_map[key] = *token;
        }
      }
      tokenizer.impl_->bos = id_of("bos_token");
      tokenizer.impl_->eos = id_of("eos_token");
      tokenizer.impl_->pad = id_of("pad_token");
      tokenizer.impl_->chat_template = config_chat_template(config);
    } catch (const nlohmann::json::exception& error) {
      throw std::invalid_argument(config_file.string() + ": " + error.what());
    }
  }
  return tokenizer;
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const auto offset = first_invalid_utf8(text)) {
    throw std::invalid_argument("the text is not UTF-8: byte " + std::to_string(*offset) + " (0x" +
                                [&] {
                                  std::ostringstream hex;
                                  hex << std::hex << std::uppercase
                                      << int{static_cast<unsigned char>(text[*offset])};
                                  return hex.str();
                                }() +
                                ") begins no valid character");
  }
  const Impl& impl = *impl_;
  // Added tokens first, in the raw text and then in the normalized rest; the rest is
  // pre-tokenized into pieces, each tokenized by the model.
  std::vector<Segment> segments{{std::string(text), std::nullopt, true}};
  impl.added->split(segments, /*normalized=*/false);
  if (impl.normalizer) {
    for (Segment& segment : segments) {
      if (!segment.id) impl.normalizer->apply(segment.text);
    }
  }
  impl.added->split(segments, /*normalized=*/true);

  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Piece> pieces;
  for (Segment& segment : segments) {
    if (segment.id) {
      ids.push_back(*segment.id);
      continue;
    }
    if (segment.text.empty()) continue;
    pieces.clear();
    pieces.push_back({std::move(segment.text), segment.at_start});
    if (impl.pre_tokenizer) impl.pre_tokenizer->apply(pieces);
    for (const Piece& piece : pieces) impl.model->tokenize(piece.text, ids);
  }
  if (add_special_tokens && impl.post_processor) impl.post_processor->apply(ids);
  return ids;
}

std::vector<std::vector<int64_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens,
                                                          int threads) const {
  std::vector<std::vector<int64_t>> encoded(texts.size());
  const size_t workers = std::min<size_t>(
      texts.size(), threads > 0 ? static_cast<size_t>(threads)
                                : std::max<size_t>(1, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) encoded[i] = encode(texts[i], add_special_tokens);
    return encoded;
  }
  // Texts handed out one at a time, so that a long one does not hold up a fixed share.
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      try {
        for (size_t i = next++; i < texts.size(); i = next++) {
          encoded[i] = encode(texts[i], add_special_tokens);
        }
      } catch (...) {
        errors[w] = std::current_exception();
        next = texts.size();
      }
    });
  }
  for (auto& thread : pool) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return encoded;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int64_t id : ids) {
    const std::string* token = impl.added->id_to_token(id);
    if (token == nullptr) token = impl.model->id_to_token(id);
    if (token == nullptr) {
      throw std::out_of_range("the id " + std::to_string(id) + " is not in the vocabulary of " +
                              impl.path + " (" + std::to_string(vocab_size()) + " ids)");
    }
    if (skip_special_tokens && impl.added->is_special(id)) continue;
    tokens.push_back(*token);
  }
  if (!impl.decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i > 0 ? " " : "") + tokens[i];
    return joined;
  }
  impl.decoder->apply(tokens);
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto id = impl_->added->token_to_id(token)) return *id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (const std::string* token = impl_->added->id_to_token(id)) return *token;
  if (const std::string* token = impl_->model->id_to_token(id)) return *token;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const {
  return std::max(impl_->model->vocab_size(), impl_->added->id_end());
}

std::optional<int64_t> Tokenizer::bos_token_id() const { return impl_->bos; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return impl_->eos; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return impl_->pad; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt,
                                           const std::string& variables_json) const {
  const Impl& impl = *impl_;
  if (impl.chat_template.empty()) {
    throw std::invalid_argument("the tokenizer " + impl.path +
                                " has no chat template (tokenizer_config.json's chat_template)");
  }
  std::call_once(impl.parse_once, [&] {
    impl.parsed_template = std::make_unique<ChatTemplate>(ChatTemplate::parse(impl.chat_template));
  });
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) {
    context["messages"].push_back({{"role", message.role}, {"content", message.content}});
  }
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  context.update(impl.special_tokens_map);
  nlohmann::ordered_json variables;
  try {
    variables = nlohmann::ordered_json::parse(variables_json);
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument("the chat template's variables are not JSON: " +
                                std::string(error.what()));
  }
  if (!variables.is_object()) {
    throw std::invalid_argument("the chat template's variables must be a JSON object, not " +
                                variables_json);
  }
  context.update(variables);
  return impl.parsed_template->render(context);
}

const std::string& Tokenizer::path() const { return impl_->path; }

}  // namespace pipetrain
