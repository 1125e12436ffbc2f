// tokenizer.json's "post_processor": the special tokens an encoding gets around the text's own
// (Llama 3's <|begin_of_text|>, say), added where encode() is asked to add special tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/tokenizer/step.h"

namespace pipetrain::tokenizer {

// Adds its special tokens around the ids of one sequence.
using PostProcessor = Step<std::vector<int64_t>>;

// The post-processor `config` describes (TemplateProcessing, ByteLevel, RobertaProcessing,
// BertProcessing, Sequence), or null for a null config. Throws std::invalid_argument naming a
// type that is not implemented or a template that names an undefined special token.
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config);

}  // namespace pipetrain::tokenizer
