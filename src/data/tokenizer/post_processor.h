// tokenizer.json's "post_processor": the special tokens an encoding gets around the text's own
// (Llama 3's <|begin_of_text|>, say), added where encode() is asked to add special tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // `ids` of one sequence, with the processor's special tokens added.
  virtual void add_special_tokens(std::vector<int64_t>& ids) const = 0;
};

// The post-processor `config` describes (TemplateProcessing, ByteLevel, RobertaProcessing,
// BertProcessing, Sequence), or null for a null config. Throws std::invalid_argument naming a
// type that is not implemented or a template that names an undefined special token.
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config);

}  // namespace pipetrain::tokenizer
