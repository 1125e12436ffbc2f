// A Hugging Face tokenizer read from its tokenizer.json, the file every model on the Hub ships,
// that gives the ids Hugging Face's own `tokenizers` library gives: text -> added tokens split out
// -> normalizer -> pre-tokenizer -> BPE model -> post-processor (BOS/EOS as the file says), and
// ids -> decoder -> text. A component of the file that pipetrain does not implement is refused
// when the file is read, naming it and the file: a tokenization is the reference's or none.
//
//   auto tokenizer = pipetrain::Tokenizer::from_file("Llama-3.2-1B");  // or .../tokenizer.json
//   std::vector<int64_t> ids = tokenizer.encode("Hello world");
//   std::string text = tokenizer.decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipetrain {

// One turn of a conversation, as chat templates read it ({"role": ..., "content": ...}).
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class Tokenizer {
 public:
  // Reads `path`: a tokenizer.json, or a folder holding one (a Hub model's folder), and the
  // tokenizer_config.json beside it where there is one (BOS, EOS and pad tokens, chat template).
  // Throws std::invalid_argument naming the file for a missing or malformed file and for a
  // component, option or model type that is not implemented.
  static Tokenizer from_file(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text` (UTF-8). With add_special_tokens, the post-processor's tokens (a BOS, say)
  // are added as the file's post-processor adds them. Special tokens written in the text
  // ("<|endoftext|>") are their ids, as in Hugging Face's tokenizers. Throws
  // std::invalid_argument for text that is not valid UTF-8, naming the byte offset.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // encode() of each text, spread over `threads` threads (0: every core); the same ids.
  std::vector<std::vector<int64_t>> encode_batch(const std::vector<std::string>& texts,
                                                 bool add_special_tokens = true,
                                                 int threads = 0) const;
  // The text of `ids` through the file's decoder; bytes that do not form UTF-8 become U+FFFD as
  // in Hugging Face's tokenizers. Throws std::out_of_range for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  // One more than the largest id (the model's vocabulary and the added tokens), the size an
  // embedding needs.
  int64_t vocab_size() const;

  // From tokenizer_config.json where present (its token names resolved to ids), else unset.
  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  // The Jinja chat template of tokenizer_config.json ("" when it has none).
  const std::string& chat_template() const;
  // `messages` rendered with the chat template as transformers' apply_chat_template(messages,
  // tokenize=False, add_generation_prompt=...) renders them: the config's special tokens
  // (bos_token, eos_token, ...) are the template's variables, tools and documents are None, and
  // `variables_json`, a JSON object, adds or overrides others ({"enable_thinking": false}).
  // Encode the result with add_special_tokens = false: the template writes its own BOS. Throws
  // std::invalid_argument where there is no chat template or it uses a construct pipetrain does
  // not implement (named, with its line and column), std::runtime_error where the template
  // fails (its raise_exception(), say).
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = false,
                                  const std::string& variables_json = "{}") const;
  // The file this tokenizer was read from.
  const std::string& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipetrain
