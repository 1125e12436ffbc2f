#include "data/tokenizer/post_processor.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace pipetrain::tokenizer {

namespace {

// The single-sequence template: ids before the text, the text, ids after it (a template may
// place special tokens anywhere, so it is kept as a list of parts).
class Template : public PostProcessor {
 public:
  // Each part: the special token ids it stands for, or empty for the text.
  explicit Template(std::vector<std::vector<int64_t>> parts) : parts_(std::move(parts)) {}
  void add_special_tokens(std::vector<int64_t>& ids) const override {
    std::vector<int64_t> out;
    for (const auto& part : parts_) {
      if (part.empty()) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), part.begin(), part.end());
      }
    }
    ids = std::move(out);
  }

 private:
  std::vector<std::vector<int64_t>> parts_;
};

// ByteLevel's processing only trims offsets, which encode() does not return.
class Unchanged : public PostProcessor {
 public:
  void add_special_tokens(std::vector<int64_t>&) const override {}
};

class Sequence : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void add_special_tokens(std::vector<int64_t>& ids) const override {
    for (const auto& step : steps_) step->add_special_tokens(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> template_processing(const nlohmann::json& config) {
  const auto& special_tokens = config.at("special_tokens");
  std::vector<std::vector<int64_t>> parts;
  for (const auto& piece : config.at("single")) {
    if (piece.contains("Sequence")) {
      if (piece.at("Sequence").at("id") != "A") {
        throw std::invalid_argument("TemplateProcessing's single template names the sequence " +
                                    piece.at("Sequence").at("id").dump() + ", not A");
      }
      parts.emplace_back();
      continue;
    }
    const auto name = piece.at("SpecialToken").at("id").get<std::string>();
    if (!special_tokens.contains(name)) {
      throw std::invalid_argument("TemplateProcessing's template names the special token '" + name +
                                  "', which its special_tokens do not define");
    }
    parts.push_back(special_tokens.at(name).at("ids").get<std::vector<int64_t>>());
  }
  return std::make_unique<Template>(std::move(parts));
}

// RoBERTa's and BERT's processors: cls, the text, sep.
std::unique_ptr<PostProcessor> cls_and_sep(const nlohmann::json& config) {
  return std::make_unique<Template>(std::vector<std::vector<int64_t>>{
      {config.at("cls").at(1).get<int64_t>()}, {}, {config.at("sep").at(1).get<int64_t>()}});
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const auto type = config.at("type").get<std::string>();
  if (type == "TemplateProcessing") return template_processing(config);
  if (type == "ByteLevel") return std::make_unique<Unchanged>();
  if (type == "RobertaProcessing" || type == "BertProcessing") return cls_and_sep(config);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step : config.at("processors")) steps.push_back(make_post_processor(step));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw std::invalid_argument(
      "the post-processor '" + type +
      "' is not implemented (pipetrain has TemplateProcessing, ByteLevel, RobertaProcessing, "
      "BertProcessing, Sequence)");
}

}  // namespace pipetrain::tokenizer
