// `pipetrain fit --document-masking true`: documents that prepare-data packed one after another
// (GPT-2's real tokenizer, tests/reference) train as if each were alone (the model side is
// proven equal to documents run alone in tests/nn/documents_test.cpp): under `pipe` on 2 stages,
// the documents crossing the stage boundary beside the activations, a small Llama logs the losses
// of one process (relative 1e-5, float32 sums in other orders), and they are not the losses
// without masking. prepare-data counts the documents that its EOS does not delimit (a chat
// template's end of turn), and fit refuses masking where it cannot find the documents: such data,
// token files without tokenizer_info.json, and a model that does not mask (gpt2).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "support/command.h"
#include "support/multiprocess.h"
#include "support/real_tokenizers.h"
#include "support/temp_dir.h"

namespace pipetrain::testing::document_masking_test {
namespace {

namespace fs = std::filesystem;

const std::string kGpt2 = real_tokenizer("gpt2");
const std::string kQwen3 = real_tokenizer("qwen3");

class DocumentMasking : public TempDirTest {
 protected:
  // `lines` as JSONL prepared with `tokenizer` into dir/`output`, every fourth validating.
  void prepare(const std::string& tokenizer, const std::string& format,
               const std::vector<std::string>& lines, const std::string& output) const {
    std::string jsonl;
    for (const auto& line : lines) jsonl += line + "\n";
    const std::string input = write(output + ".jsonl", jsonl);
    const auto result = run_command(pipetrain_command(
        {"prepare-data", "--tokenizer", tokenizer, "--format", format, "--input", input, "--output",
         dir + "/" + output, "--val-fraction", "0.25", "--name", "d"}));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  // Three steps of a 2-layer Llama of GPT-2's vocabulary on dir/data, with `extra` flags.
  CommandResult fit(const std::string& name, const std::vector<std::string>& extra,
                    const std::string& model = "llama") const {
    std::vector<std::string> flags = tiny_llama_flags(/*vocab_size=*/50304, /*block_size=*/32);
    flags.insert(flags.end(), {"--train-data", dir + "/data", "--max-steps", "3", "--batch-size",
                               "4", "--seed", "5", "--enable-progress-bar", "false"});
    if (model == "gpt2")
      flags = {"--n-layer",
               "1",
               "--n-embd",
               "16",
               "--n-head",
               "2",
               "--block-size",
               "32",
               "--train-data",
               dir + "/data",
               "--max-steps",
               "1",
               "--enable-progress-bar",
               "false"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return run_command(csv_logged_command("fit", model, dir + "/" + name, 2, flags), {},
                       std::chrono::seconds(300));
  }
  nlohmann::json tokenizer_info(const std::string& output) const {
    return nlohmann::json::parse(std::ifstream(dir + "/" + output + "/tokenizer_info.json"));
  }
};

// Documents of 3 to 12 words: several to a window of 32 tokens.
std::vector<std::string> short_documents() {
  std::vector<std::string> lines;
  const std::vector<std::string> words{"river", "stone", "the",   "quiet", "north", "light",
                                       "falls", "over",  "green", "hills", "and",   "rain"};
  for (int d = 0; d < 48; ++d) {
    std::string text;
    for (int w = 0; w < 3 + d % 10; ++w) text += (w ? " " : "") + words[(d * 7 + w * 5) % 12];
    lines.push_back(nlohmann::json{{"text", text + "."}}.dump());
  }
  return lines;
}

TEST_F(DocumentMasking, PackedDocumentsUnderPipeLogTheLossesOfOneProcess) {
  prepare(kGpt2, "jsonl", short_documents(), "data");
  EXPECT_EQ(tokenizer_info("data")["train"]["documents_not_delimited_by_eos"], 0);
  const std::vector<std::string> masking{"--document-masking", "true", "--val-check-interval", "3"};
  auto result = fit("single", masking);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // Without masking the same windows train otherwise.
  result = fit("unmasked", {});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto masked = read_csv_column(metrics_csv(dir + "/single"), "train_loss");
  const auto unmasked = read_csv_column(metrics_csv(dir + "/unmasked"), "train_loss");
  ASSERT_EQ(masked.size(), unmasked.size());
  EXPECT_GT(std::abs(masked.back() - unmasked.back()), 1e-4);
#ifdef PIPETRAIN_HAS_GLOO
  // Stage 0: the embedding and block 1; the documents cross to block 2 with the activations.
  std::vector<std::string> pipe{"--strategy", "pipe", "--devices", "2",
                                "--chunks",   "2",    "--balance", "2,3"};
  pipe.insert(pipe.end(), masking.begin(), masking.end());
  result = fit("pipe", pipe);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  expect_same_train_losses(dir + "/single", dir + "/pipe", 1e-5);
  const auto val_single = read_csv_column(metrics_csv(dir + "/single"), "val_loss");
  const auto val_pipe = read_csv_column(metrics_csv(dir + "/pipe"), "val_loss");
  ASSERT_EQ(val_single.size(), 1u);
  ASSERT_EQ(val_pipe.size(), 1u);
  EXPECT_NEAR(val_pipe[0], val_single[0], 1e-5 * val_single[0]);
#endif
}

TEST_F(DocumentMasking, IsRefusedWhereTheDocumentsCannotBeFound) {
  // Qwen3's EOS <|im_end|> ends every turn of a conversation too.
  prepare(
      kQwen3, "chat",
      {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]})",
       R"({"messages": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]})"},
      "chat");
  EXPECT_EQ(tokenizer_info("chat")["train"]["documents_not_delimited_by_eos"], 2);
  fs::rename(dir + "/chat", dir + "/data");
  auto result = fit("chat", {"--document-masking", "true", "--vocab-size", "151936"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("does not end 2 of its train documents alone"), std::string::npos)
      << result.output;

  // Token files without tokenizer_info.json say nothing of their documents.
  fs::remove_all(dir + "/data");
  prepare(kGpt2, "jsonl", short_documents(), "data");
  // One an older prepare-data wrote (no count of undelimited documents), and one that is not JSON.
  auto info = tokenizer_info("data");
  info["train"].erase("documents_not_delimited_by_eos");
  write("data/tokenizer_info.json", info.dump());
  result = fit("old", {"--document-masking", "true"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("prepare the data again"), std::string::npos) << result.output;
  write("data/tokenizer_info.json", "{\"eos_token_id\": 50256, ");
  result = fit("damaged", {"--document-masking", "true"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("is not JSON"), std::string::npos) << result.output;
  fs::remove(dir + "/data/tokenizer_info.json");
  result = fit("bare", {"--document-masking", "true"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("has no tokenizer_info.json"), std::string::npos) << result.output;

  result = fit("gpt2", {"--document-masking", "true"}, "gpt2");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("does not use --document-masking"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace pipetrain::testing::document_masking_test
