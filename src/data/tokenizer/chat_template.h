// Hugging Face chat templates (the `chat_template` of a model's tokenizer_config.json), rendered as
// transformers' apply_chat_template renders them with Python's Jinja: trim_blocks and
// lstrip_blocks on, Python's semantics for every value, transformers' tojson and
// raise_exception.
//
// The renderer implements the Jinja that chat templates use (if/elif/else, for with loop and
// else, set and set blocks, namespace, macros, break/continue, generation, the usual filters,
// tests and str/dict methods); anything else (call blocks, include, filter blocks, Python's
// repr of a list, non-ASCII case mapping, ...) is refused with std::invalid_argument naming the
// construct and its line and column, never rendered differently from transformers. A template that
// fails on a context (raise_exception, an undefined variable's attribute, a type error) throws
// std::runtime_error, with its position, where transformers would raise.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pipetrain {

namespace jinja {
struct Stmt;
}

class ChatTemplate {
 public:
  // Parses once; throws std::invalid_argument for a syntax error or a construct not implemented.
  static ChatTemplate parse(std::string_view source);

  // The template's variables: `messages` (a list of {"role", "content", ...}),
  // `add_generation_prompt`, `bos_token`, `eos_token`, and whatever else the template reads
  // (`tools`, `enable_thinking`, ...). An ordered_json, as a dict's key order shows in tojson's
  // output. transformers always passes `tools` and `documents` (None unless given): a caller
  // mirroring apply_chat_template sets them to null where it has none. Several threads may
  // render with one ChatTemplate at once.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const std::vector<jinja::Stmt>> body);
  std::shared_ptr<const std::vector<jinja::Stmt>> body_;
};

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& context);

}  // namespace pipetrain
