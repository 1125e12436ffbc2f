// pipetrain::Tokenizer against Hugging Face's tokenizers (the Rust library, run by
// tests/reference/tokenize.js) on real tokenizer.json files and on small files of each component.
#include <gtest/gtest.h>

#include <pipetrain/tokenizer.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/tokenizer/unicode.h"
#include "support/command.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/real_tokenizers.h"

namespace pipetrain::testing::tokenizer_test {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kReferences = fs::path(PIPETRAIN_SOURCE_DIR) / "tests" / "reference";

// What Hugging Face's tokenizers make of `texts` with the tokenizer at `tokenizer_json`.
json reference_of(const fs::path& tokenizer_json, const std::vector<std::string>& texts) {
  const std::string dir = make_temp_dir("tokenizer-reference");
  const std::string texts_file = dir + "/texts.json", out_file = dir + "/out.json";
  std::ofstream(texts_file) << json(texts).dump();
  run_ok({"node", (kReferences / "tokenize.js").string(), tokenizer_json.string(), texts_file,
          out_file});
  std::ifstream in(out_file);
  return json::parse(in);
}

bool have_references() { return fs::is_directory(kReferences / "node_modules"); }

// A build without PCRE2 or utf8proc (the GPU image) has a tokenizer that refuses every file.
#define SKIP_WITHOUT_UNICODE_LIBRARIES()          \
  if (!tokenizer::built_with_unicode_libraries()) \
  GTEST_SKIP() << "pipetrain was built without PCRE2 or utf8proc"

#define SKIP_WITHOUT_REFERENCES()                                                   \
  SKIP_WITHOUT_UNICODE_LIBRARIES();                                                 \
  if (!have_references())                                                           \
  GTEST_SKIP() << "the references are not installed: run scripts/setup (npm ci in " \
                  "tests/reference)"

// Every text encoded, with and without special tokens, and decoded, as the reference does.
void expect_as_reference(const Tokenizer& tokenizer, const fs::path& tokenizer_json,
                         const std::vector<std::string>& texts) {
  const json expected = reference_of(tokenizer_json, texts);
  ASSERT_EQ(expected.size(), texts.size());
  const auto batch = tokenizer.encode_batch(texts, true, 2);
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE("text " + std::to_string(i) + ": " + json(texts[i]).dump());
    const auto ids = tokenizer.encode(texts[i]);
    EXPECT_EQ(ids, expected[i].at("ids").get<std::vector<int64_t>>());
    EXPECT_EQ(batch[i], ids);
    EXPECT_EQ(tokenizer.encode(texts[i], false),
              expected[i].at("plain").get<std::vector<int64_t>>());
    EXPECT_EQ(tokenizer.decode(ids), expected[i].at("decoded").get<std::string>());
    EXPECT_EQ(tokenizer.decode(ids, true),
              expected[i].at("decoded_skipping_special").get<std::string>());
  }
}

std::vector<std::string> corpus() {
  std::ifstream in(kReferences / "tokenizer_corpus.json");
  return json::parse(in).get<std::vector<std::string>>();
}

// `components` written as a tokenizer.json.
fs::path write_tokenizer(const json& components) {
  const std::string dir = make_temp_dir("tokenizer-file");
  const fs::path path = fs::path(dir) / "tokenizer.json";
  std::ofstream(path) << components.dump();
  return path;
}

// The UTF-8 characters of `word`.
std::vector<std::string> characters_of(const std::string& word) {
  std::vector<std::string> chars;
  for (size_t at = 0; at < word.size();) {
    size_t end = at + 1;
    while (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) ++end;
    chars.push_back(word.substr(at, end - at));
    at = end;
  }
  return chars;
}

// A BPE model whose vocabulary is `symbols` and the prefixes of `words`, with the merges that
// build each word from the left.
json bpe_model(const std::vector<std::string>& symbols, const std::vector<std::string>& words,
               json options = json::object()) {
  json vocab = json::object();
  for (const std::string& symbol : symbols) vocab[symbol] = static_cast<int>(vocab.size());
  // Each word's merges, left to right: "h e", "he l", "hel l", ...
  json merges = json::array();
  for (const std::string& word : words) {
    const std::vector<std::string> chars = characters_of(word);
    std::string prefix = chars[0];
    for (size_t i = 1; i < chars.size(); ++i) {
      const std::string& next = chars[i];
      merges.push_back(json::array({prefix, next}));
      prefix += next;
      if (!vocab.contains(prefix)) vocab[prefix] = static_cast<int>(vocab.size());
    }
  }
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  model.update(options);
  return model;
}

json added_token(int id, const std::string& content, bool special, json flags = json::object()) {
  json token = {{"id", id},          {"content", content}, {"single_word", false},
                {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
                {"special", special}};
  token.update(flags);
  return token;
}

std::vector<std::string> printable_ascii() {
  std::vector<std::string> symbols;
  for (char c = ' '; c <= '~'; ++c) symbols.emplace_back(1, c);
  return symbols;
}

const std::vector<std::string> kComponentTexts = {
    "",
    "hello world",
    "Hello World, HELLO again: hello-world hello_world",
    "  two  spaces   three   ",
    "digits 1234567 and 3.14, 2024-12-07",
    "[USER]   hello   [USER]x[USER]",
    "hellohello hello. (hello) xhello hellox",
    "caf\u00e9 cafe\u0301 \uff21\uff22 \u2460 \u00bd \u0130stanbul STRASSE stra\u00dfe",
    "\u4f60\u597d world \U0001F600 \u0416",
    "tab\there\nnew line\r\nend",
    "<s>already bos</s> and <unk>",
    "---***---***",
};

// SentencePiece's layout as Llama 2 and Mistral write it: the normalizer makes spaces U+2581 and
// prepends one; bytes the vocabulary lacks fall back to <0x..> tokens.
TEST(TokenizerComponents, SentencePieceStyleWithByteFallbackMatchesTheReference) {
  SKIP_WITHOUT_REFERENCES();
  std::vector<std::string> symbols = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    symbols.emplace_back(name);
  }
  for (const char* symbol : {"\u2581", "h", "e", "l", "o", "w", "r", "d", "a", "c"}) {
    symbols.emplace_back(symbol);
  }
  const json file = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {added_token(0, "<unk>", true), added_token(1, "<s>", true), added_token(2, "</s>", true),
        // The reference numbers an added token the model lacks on from the model's vocabulary
        // (281 here), whatever id the file gives it.
        added_token(300, "[USER]", true, {{"lstrip", true}, {"rstrip", true}})}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"model", bpe_model(symbols, {"\u2581hello", "\u2581world", "ll", "or"},
                          {{"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}})},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
  };
  const fs::path path = write_tokenizer(file);
  expect_as_reference(Tokenizer::from_file(path.string()), path, kComponentTexts);
}

// Normal forms, lowercase, accents stripped, then whitespace, digits, punctuation and split
// behaviours; a BPE with a continuing-subword prefix, an end-of-word suffix and an unknown token
// that is not fused; added tokens matched in the normalized text, one a single word.
TEST(TokenizerComponents, NormalizersSplitsAndSubwordMarksMatchTheReference) {
  SKIP_WITHOUT_REFERENCES();
  std::vector<std::string> symbols = {"[UNK]"};
  for (const std::string& c : printable_ascii()) {
    symbols.push_back(c);
    symbols.push_back("##" + c);
    symbols.push_back(c + "</w>");
    symbols.push_back("##" + c + "</w>");
  }
  const json file = {
      {"version", "1.0"},
      {"added_tokens",
       {added_token(0, "[UNK]", true), added_token(381, "hello", false, {{"single_word", true}}),
        added_token(382, "HELLO-", false)}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFKD"}},
          {{"type", "StripAccents"}},
          {{"type", "Lowercase"}},
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
          {{"type", "Replace"}, {"pattern", {{"Regex", "\\s{2,}"}}}, {"content", " "}}}}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "WhitespaceSplit"}},
          {{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "Punctuation"}, {"behavior", "Isolated"}},
          {{"type", "Split"},
           {"pattern", {{"String", "o"}}},
           {"behavior", "MergedWithPrevious"},
           {"invert", false}},
          {{"type", "Split"},
           {"pattern", {{"Regex", "l+"}}},
           {"behavior", "MergedWithNext"},
           {"invert", false}},
          {{"type", "Split"},
           {"pattern", {{"Regex", "[a-f]"}}},
           {"behavior", "Contiguous"},
           {"invert", true}}}}}},
      {"model", bpe_model(symbols, {},
                          {{"unk_token", "[UNK]"},
                           {"continuing_subword_prefix", "##"},
                           {"end_of_word_suffix", "</w>"}})},
      {"post_processor",
       {{"type", "RobertaProcessing"},
        {"sep", {"[UNK]", 0}},
        {"cls", {"hello", 381}},
        {"trim_offsets", true},
        {"add_prefix_space", false}}},
      {"decoder", {{"type", "Fuse"}}},
  };
  const fs::path path = write_tokenizer(file);
  expect_as_reference(Tokenizer::from_file(path.string()), path, kComponentTexts);
}

// Metaspace as a pre-tokenizer (a symbol prepended to the text's first piece alone) and
// decoder; Whitespace's word split; NFC and a regular expression removed; ignore_merges.
TEST(TokenizerComponents, MetaspaceWhitespaceAndIgnoreMergesMatchTheReference) {
  SKIP_WITHOUT_REFERENCES();
  std::vector<std::string> symbols = printable_ascii();
  symbols.insert(symbols.end(), {"\u2581", "\u2581hello", "\u00e9", "\u4f60", "[SEP]"});
  const json file = {
      {"version", "1.0"},
      {"added_tokens", {added_token(static_cast<int>(symbols.size()) + 40, "[SEP]", true)}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "[0-9]+"}}},
           {"behavior", "Removed"},
           {"invert", false}},
          {{"type", "Metaspace"},
           {"replacement", "\u2581"},
           {"prepend_scheme", "first"},
           {"split", true}}}}}},
      {"model", bpe_model(symbols, {"world", "\u2581wor"}, {{"ignore_merges", true}})},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Metaspace"},
        {"replacement", "\u2581"},
        {"prepend_scheme", "first"},
        {"split", true}}},
  };
  const fs::path path = write_tokenizer(file);
  std::vector<std::string> texts = kComponentTexts;
  texts.push_back("[SEP] after a special token [SEP]hello");
  expect_as_reference(Tokenizer::from_file(path.string()), path, texts);

  json whitespace = file;
  whitespace["pre_tokenizer"] = {{"type", "Whitespace"}};
  const fs::path whitespace_path = write_tokenizer(whitespace);
  expect_as_reference(Tokenizer::from_file(whitespace_path.string()), whitespace_path, texts);
}

// A small valid tokenizer.json, for the refusals below to break one part of.
json small_tokenizer() {
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"model", bpe_model(printable_ascii(), {"hello"})},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}}};
}

// The error from_file throws for `file`.
std::string refusal_of(const json& file) {
  const fs::path path = write_tokenizer(file);
  const std::string error =
      error_of<std::invalid_argument>([&] { Tokenizer::from_file(path.string()); });
  EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  return error;
}

TEST(Tokenizer, AComponentThatIsNotImplementedIsRefusedNamingItAndTheFile) {
  SKIP_WITHOUT_UNICODE_LIBRARIES();
  const std::vector<std::pair<std::string, json>> unimplemented = {
      {"model", {{"type", "WordPiece"}, {"vocab", json::object()}}},
      {"normalizer", {{"type", "BertNormalizer"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"}, {"pretokenizers", {{{"type", "BertPreTokenizer"}}}}}},
      {"post_processor", {{"type", "SomeProcessing"}}},
      {"decoder", {{"type", "WordPiece"}}},
  };
  for (const auto& [key, component] : unimplemented) {
    json file = small_tokenizer();
    file[key] = component;
    const std::string name = component.contains("pretokenizers")
                                 ? "BertPreTokenizer"
                                 : component["type"].get<std::string>();
    const std::string error = refusal_of(file);
    EXPECT_NE(error.find("'" + name + "' is not implemented"), std::string::npos) << error;
  }
}

TEST(Tokenizer, AFileThatCannotBeReadAsTheReferenceReadsItIsRefused) {
  SKIP_WITHOUT_UNICODE_LIBRARIES();
  json dropout = small_tokenizer();
  dropout["model"]["dropout"] = 0.1;
  EXPECT_NE(refusal_of(dropout).find("dropout 0.1"), std::string::npos);

  json unknown_merge = small_tokenizer();
  unknown_merge["model"]["merges"].push_back(json::array({"h", "\u00e9"}));
  EXPECT_NE(refusal_of(unknown_merge).find("'\u00e9', which is not in the vocabulary"),
            std::string::npos);

  json padding = small_tokenizer();
  padding["padding"] = {{"strategy", "BatchLongest"}};
  EXPECT_NE(refusal_of(padding).find("padding"), std::string::npos);

  json no_model = small_tokenizer();
  no_model.erase("model");
  EXPECT_NE(refusal_of(no_model).find("model"), std::string::npos);

  const std::string dir = make_temp_dir("tokenizer-files");
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              Tokenizer::from_file(dir);
            }).find(dir + "/tokenizer.json does not exist"),
            std::string::npos);
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": ";
  EXPECT_NE(
      error_of<std::invalid_argument>([&] { Tokenizer::from_file(dir); }).find("is not valid JSON"),
      std::string::npos);
}

TEST(Tokenizer, AConfigNamingATokenTheFileLacksIsRefused) {
  SKIP_WITHOUT_UNICODE_LIBRARIES();
  const fs::path path = write_tokenizer(small_tokenizer());
  std::ofstream(path.parent_path() / "tokenizer_config.json")
      << json{{"eos_token", {{"content", "</s>"}, {"__type", "AddedToken"}}}}.dump();
  const std::string error =
      error_of<std::invalid_argument>([&] { Tokenizer::from_file(path.parent_path().string()); });
  EXPECT_NE(error.find("tokenizer_config.json: its eos_token '</s>' is not a token of"),
            std::string::npos)
      << error;

  std::ofstream(path.parent_path() / "tokenizer_config.json")
      << json{{"eos_token", "hello"}, {"bos_token", nullptr}}.dump();
  const Tokenizer tokenizer = Tokenizer::from_file(path.parent_path().string());
  EXPECT_EQ(tokenizer.eos_token_id(), tokenizer.token_to_id("hello"));
  EXPECT_FALSE(tokenizer.bos_token_id());
  EXPECT_EQ(tokenizer.encode("hello"), std::vector<int64_t>{*tokenizer.eos_token_id()});
}

TEST(Tokenizer, AppliesTheChatTemplateAsTransformers) {
  SKIP_WITHOUT_REFERENCES();
  const Tokenizer qwen3 = Tokenizer::from_file(real_tokenizer("qwen3"));
  const std::vector<ChatMessage> conversation = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
  // Rendered by Python's Jinja as transformers sets it up (trim_blocks, lstrip_blocks), from the
  // same tokenizer_config.json.
  EXPECT_EQ(qwen3.apply_chat_template(conversation, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(qwen3.apply_chat_template({{"user", "Hi"}}, true, R"({"enable_thinking": false})"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const auto ids = qwen3.encode(qwen3.apply_chat_template({{"user", "Hi"}}), false);
  EXPECT_EQ(ids.front(), qwen3.token_to_id("<|im_start|>"));

  const Tokenizer llama3 = Tokenizer::from_file(real_tokenizer("llama3"));
  EXPECT_EQ(llama3.apply_chat_template({{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  const Tokenizer gpt2 = Tokenizer::from_file(real_tokenizer("gpt2"));
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              gpt2.apply_chat_template({{"user", "Hi"}});
            }).find("has no chat template"),
            std::string::npos);
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              qwen3.apply_chat_template({}, false, "[1]");
            }).find("must be a JSON object"),
            std::string::npos);
}

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, EncodesAndDecodesTheCorpusAsHuggingFaceTokenizers) {
  SKIP_WITHOUT_REFERENCES();
  const fs::path folder = real_tokenizer(GetParam());
  const Tokenizer tokenizer = Tokenizer::from_file(folder.string());
  expect_as_reference(tokenizer, folder / "tokenizer.json", corpus());
}

TEST(Tokenizer, DecodingTheEncodingGivesTheTextBackAsTheNormalizerLeftIt) {
  SKIP_WITHOUT_REFERENCES();
  // GPT-2's and Llama 3's files have no normalizer: every text comes back as it was.
  for (const std::string model : {"gpt2", "llama3"}) {
    const Tokenizer tokenizer = Tokenizer::from_file(real_tokenizer(model));
    for (const std::string& text : corpus()) {
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(text, false)), text) << model;
    }
  }
  // Qwen3's normalizes to NFC first.
  const Tokenizer qwen3 = Tokenizer::from_file(real_tokenizer("qwen3"));
  EXPECT_EQ(qwen3.decode(qwen3.encode("cafe\u0301 \u1112\u1161\u11ab")), "caf\u00e9 \ud55c");
}

INSTANTIATE_TEST_SUITE_P(Models, RealTokenizer, ::testing::Values("gpt2", "llama3", "qwen3"));

TEST(Tokenizer, ReadsTheConfigsSpecialTokens) {
  SKIP_WITHOUT_REFERENCES();
  const Tokenizer qwen3 = Tokenizer::from_file(real_tokenizer("qwen3"));
  EXPECT_EQ(qwen3.eos_token_id(), qwen3.token_to_id("<|im_end|>"));
  EXPECT_EQ(qwen3.pad_token_id(), 151643);
  EXPECT_FALSE(qwen3.bos_token_id());
  EXPECT_NE(qwen3.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(qwen3.vocab_size(), 151669);
  const Tokenizer gpt2 = Tokenizer::from_file(real_tokenizer("gpt2"));
  EXPECT_EQ(gpt2.eos_token_id(), 50256);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.id_to_token(50256), "<|endoftext|>");
  EXPECT_EQ(gpt2.id_to_token(15496), "Hello");
  EXPECT_FALSE(gpt2.id_to_token(50257));
}

TEST(Tokenizer, TextThatIsNotUtf8IsRefusedNamingTheByte) {
  SKIP_WITHOUT_REFERENCES();
  const Tokenizer gpt2 = Tokenizer::from_file(real_tokenizer("gpt2"));
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              gpt2.encode("ok \xC3\x28 bad");
            }).find("byte 3 (0xC3)"),
            std::string::npos);
  EXPECT_NE(error_of<std::invalid_argument>([&] { gpt2.encode("\xED\xA0\x80"); }).find("byte 0"),
            std::string::npos);
  EXPECT_NE(error_of<std::invalid_argument>([&] { gpt2.encode("abc\xF0\x9F\x98"); }).find("byte 3"),
            std::string::npos);
}

TEST(Tokenizer, AnIdOutsideTheVocabularyIsRefused) {
  SKIP_WITHOUT_REFERENCES();
  const Tokenizer gpt2 = Tokenizer::from_file(real_tokenizer("gpt2"));
  EXPECT_NE(error_of<std::out_of_range>([&] {
              gpt2.decode({15496, 50257});
            }).find("50257"),
            std::string::npos);
}

}  // namespace pipetrain::testing::tokenizer_test
