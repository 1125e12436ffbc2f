#include "models/loss_masked_examples.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace pipetrain::cli {
namespace {

using nlohmann::json;

// The string field `key` of `object`, or an error naming it.
std::string string_field(const json& object, const std::string& key, const std::string& where,
                         const std::string& what) {
  const auto field = object.find(key);
  if (field == object.end()) throw std::invalid_argument(where + what + " has no \"" + key + "\"");
  if (!field->is_string()) {
    throw std::invalid_argument(where + what + "'s \"" + key + "\" is " + field->type_name() +
                                ", not a string");
  }
  return field->get<std::string>();
}

std::vector<ChatMessage> read_messages(const json& object, const std::string& where) {
  const auto field = object.find("messages");
  if (field == object.end() || !field->is_array() || field->empty()) {
    throw std::invalid_argument(where + "no \"messages\" array of {\"role\", \"content\"} objects" +
                                " in the line (--format chat)");
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < field->size(); ++i) {
    const json& message = (*field)[i];
    const std::string what = "message " + std::to_string(i);
    if (!message.is_object()) throw std::invalid_argument(where + what + " is not an object");
    messages.push_back({string_field(message, "role", where, what),
                        string_field(message, "content", where, what)});
  }
  return messages;
}

std::string render(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                   size_t count, bool add_generation_prompt, const std::string& where) {
  try {
    return tokenizer.apply_chat_template({messages.begin(), messages.begin() + count},
                                         add_generation_prompt);
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + "the chat template fails on the first " +
                                std::to_string(count) + " messages: " + e.what());
  }
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

LossMaskedIds encode_chat(const Tokenizer& tokenizer, const json& object,
                          const std::string& where) {
  const auto messages = read_messages(object, where);
  const std::string whole = render(tokenizer, messages, messages.size(), false, where);
  // Where the rendering is cut: the assistant turns are [cuts[1], cuts[2]), [cuts[3], cuts[4]),
  // ...; the pieces between them are context.
  std::vector<size_t> cuts{0};
  for (size_t k = 0; k < messages.size(); ++k) {
    if (messages[k].role != "assistant") continue;
    const std::string prompt = render(tokenizer, messages, k, true, where);
    const std::string through = render(tokenizer, messages, k + 1, false, where);
    if (!starts_with(through, prompt) || !starts_with(whole, through) ||
        prompt.size() < cuts.back()) {
      throw std::invalid_argument(
          where + "the chat template renders the conversation up to message " + std::to_string(k) +
          " (an assistant turn) as other than the start of the whole conversation (it rewrites " +
          "earlier turns, as Qwen3's drops the thinking of turns before the last user message, " +
          "or ends every rendering with a generation prompt, as Llama 3's first template), so " +
          "the turn's tokens cannot be told apart: write one line per assistant turn, the " +
          "conversation up to it");
    }
    cuts.push_back(prompt.size());
    cuts.push_back(through.size());
  }
  cuts.push_back(whole.size());

  LossMaskedIds example;
  for (size_t piece = 0; piece + 1 < cuts.size(); ++piece) {
    const auto ids = tokenizer.encode(
        std::string_view(whole).substr(cuts[piece], cuts[piece + 1] - cuts[piece]), false);
    example.ids.insert(example.ids.end(), ids.begin(), ids.end());
    // Odd pieces are the assistant turns.
    example.mask.insert(example.mask.end(), ids.size(), static_cast<uint8_t>(piece % 2));
  }
  // The model sees the whole rendering's ids: train on those or on nothing.
  const auto expected = tokenizer.encode(whole, false);
  if (example.ids != expected) {
    const auto differ =
        std::mismatch(expected.begin(), expected.end(), example.ids.begin(), example.ids.end());
    throw std::invalid_argument(
        where + "the conversation's tokens, encoded a turn at a time, differ from its whole " +
        "rendering's at token " + std::to_string(differ.first - expected.begin()) + " of " +
        std::to_string(expected.size()) +
        ": a token crosses the boundary of an assistant turn, so its loss mask cannot be cut " +
        "exactly");
  }
  return example;
}

LossMaskedIds encode_prompt_completion(const Tokenizer& tokenizer, const json& object,
                                       const std::string& where, int64_t eos) {
  const std::string what = "the line";
  const auto prompt = tokenizer.encode(string_field(object, "prompt", where, what), true);
  const auto completion = tokenizer.encode(string_field(object, "completion", where, what), false);
  LossMaskedIds example;
  example.ids = prompt;
  example.ids.insert(example.ids.end(), completion.begin(), completion.end());
  example.ids.push_back(eos);
  example.mask.assign(prompt.size(), 0);
  example.mask.resize(example.ids.size(), 1);
  return example;
}

}  // namespace

bool is_loss_masked_format(const std::string& format) {
  return format == "chat" || format == "prompt-completion";
}

LossMaskedIds encode_loss_masked(const Tokenizer& tokenizer, const std::string& format,
                                 const std::string& line, const std::string& where_from,
                                 int64_t eos) {
  const std::string where = where_from + ": ";
  json object;
  try {
    object = json::parse(line);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(where + "not a line of JSON (" + e.what() + ")");
  }
  if (!object.is_object()) throw std::invalid_argument(where + "the line is not a JSON object");
  try {
    return format == "chat" ? encode_chat(tokenizer, object, where)
                            : encode_prompt_completion(tokenizer, object, where, eos);
  } catch (const std::invalid_argument& e) {
    // Invalid UTF-8 (the tokenizer names the byte offset): name the line too.
    const std::string message = e.what();
    if (starts_with(message, where)) throw;
    throw std::invalid_argument(where + message);
  }
}

}  // namespace pipetrain::cli
