// `pipetrain prepare-data --format chat|prompt-completion`: examples of fine-tuning with a loss
// mask beside each shard. With Qwen3's real tokenizer (tests/reference) a conversation's tokens
// are its chat template's rendering and the mask is 1 exactly on the assistant turns (their
// content and the template's end of turn); a prompt-completion line is its prompt's ids, its
// completion's and EOS, the latter two masked in; bad lines are usage errors naming file and
// line; --model gpt refuses masked tokens; and a small Llama fine-tuned on the masked tokens under
// pipe and ddp logs the losses of one process (the mean over the unmasked targets of each global
// batch), validates as it, and resumes exactly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <pipetrain/tokenizer.h>

#include "support/command.h"
#include "support/real_tokenizers.h"
#include "support/temp_dir.h"

namespace pipetrain::testing::chat_data_test {
namespace {

namespace fs = std::filesystem;

const std::string kGpt2 = real_tokenizer("gpt2");
const std::string kQwen3 = real_tokenizer("qwen3");

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The values after a 1024-byte header, each `width` bytes (little-endian), and the header's count.
std::vector<int64_t> values_after_header(const std::string& path, size_t width, int32_t magic) {
  const std::string bytes = read_bytes(path);
  EXPECT_GE(bytes.size(), 1024u) << path;
  if (bytes.size() < 1024) return {};
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], magic) << path;
  std::vector<int64_t> values;
  for (size_t at = 1024; at + width <= bytes.size(); at += width) {
    uint32_t value = 0;
    std::memcpy(&value, bytes.data() + at, width);
    values.push_back(value);
  }
  EXPECT_EQ(static_cast<size_t>(header[2]), values.size()) << path;
  return values;
}

// A shard's tokens (32-bit: Qwen3's vocabulary needs them) and its mask.
struct MaskedTokens {
  std::vector<int64_t> tokens, mask;
};

MaskedTokens read_masked_shard(const std::string& bin, bool wide) {
  MaskedTokens shard;
  shard.tokens = values_after_header(bin, wide ? 4 : 2, wide ? 20240801 : 20240520);
  const std::string mask = bin.substr(0, bin.size() - 4) + ".mask";
  shard.mask = values_after_header(mask, 1, 20261207);
  EXPECT_EQ(shard.tokens.size(), shard.mask.size()) << bin;
  return shard;
}

// The runs of consecutive tokens whose mask is 1, decoded.
std::vector<std::string> decoded_masked_runs(const Tokenizer& tokenizer, const MaskedTokens& s) {
  std::vector<std::string> runs;
  std::vector<int64_t> run;
  for (size_t i = 0; i <= s.tokens.size(); ++i) {
    if (i < s.tokens.size() && s.mask[i] == 1) {
      run.push_back(s.tokens[i]);
    } else if (!run.empty()) {
      runs.push_back(tokenizer.decode(run));
      run.clear();
    }
  }
  return runs;
}

std::string message(const std::string& role, const std::string& content) {
  return nlohmann::json{{"role", role}, {"content", content}}.dump();
}

class ChatData : public TempDirTest {
 protected:
  CommandResult prepare(const std::string& tokenizer, const std::string& format,
                        const std::string& input, const std::string& output,
                        const std::string& val_fraction = "0") const {
    return run_command(pipetrain_command({"prepare-data", "--tokenizer", tokenizer, "--format",
                                          format, "--input", input, "--output", output,
                                          "--val-fraction", val_fraction, "--name", "d"}));
  }
};

TEST_F(ChatData, OnlyTheAssistantTurnsOfAQwenThreeConversationCarryLoss) {
  const std::string chat = "{\"messages\": [" + message("system", "You are terse.") + ", " +
                           message("user", "What is 2 + 2?") + ", " + message("assistant", "4.") +
                           "]}\n" + "{\"messages\": [" +
                           message("user", "Name a colour, then stop.") + ", " +
                           message("assistant", "Blue\u2014like the sky.\n") + "]}\n";
  const auto input = write("chat.jsonl", chat);
  const auto result = prepare(kQwen3, "chat", input, dir + "/out");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("with a loss mask each"), std::string::npos) << result.output;

  const Tokenizer qwen3 = Tokenizer::from_file(kQwen3);
  const auto shard = read_masked_shard(dir + "/out/d_train_000000.bin", /*wide=*/true);
  // The tokens are each conversation's rendering as transformers renders it, no EOS added.
  std::vector<int64_t> expected;
  for (const auto& messages : std::vector<std::vector<ChatMessage>>{
           {{"system", "You are terse."}, {"user", "What is 2 + 2?"}, {"assistant", "4."}},
           {{"user", "Name a colour, then stop."}, {"assistant", "Blue\u2014like the sky.\n"}}}) {
    const auto ids = qwen3.encode(qwen3.apply_chat_template(messages), false);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(shard.tokens, expected);
  // The masked tokens are the assistant turns: Qwen3's empty thinking of the last turn, the
  // content and the end of the turn.
  EXPECT_EQ(
      decoded_masked_runs(qwen3, shard),
      (std::vector<std::string>{"<think>\n\n</think>\n\n4.<|im_end|>\n",
                                "<think>\n\n</think>\n\nBlue\u2014like the sky.\n<|im_end|>\n"}));
  // No val shard has a mask without its tokens, and train data has no stray masks.
  EXPECT_FALSE(fs::exists(dir + "/out/d_train_000001.mask"));
}

TEST_F(ChatData, APromptCompletionLineIsItsPromptThenItsCompletionAndEosWhichCarryLoss) {
  const auto input = write("pc.jsonl",
                           "{\"prompt\": \"Translate: chat\", \"completion\": \" cat\"}\n"
                           "{\"prompt\": \"2 + 3 =\", \"completion\": \" 5\"}\n");
  const auto result = prepare(kGpt2, "prompt-completion", input, dir + "/out");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const Tokenizer gpt2 = Tokenizer::from_file(kGpt2);
  std::vector<int64_t> tokens, mask;
  for (const auto& [prompt, completion] : std::vector<std::pair<std::string, std::string>>{
           {"Translate: chat", " cat"}, {"2 + 3 =", " 5"}}) {
    const auto p = gpt2.encode(prompt, true), c = gpt2.encode(completion, false);
    tokens.insert(tokens.end(), p.begin(), p.end());
    tokens.insert(tokens.end(), c.begin(), c.end());
    tokens.push_back(*gpt2.eos_token_id());
    mask.insert(mask.end(), p.size(), 0);
    mask.insert(mask.end(), c.size() + 1, 1);
  }
  const auto shard = read_masked_shard(dir + "/out/d_train_000000.bin", /*wide=*/false);
  EXPECT_EQ(shard.tokens, tokens);
  EXPECT_EQ(shard.mask, mask);
  // Text prepared again into the folder leaves no mask of the examples beside its shards.
  write("plain.txt", "Plain text, no masks.");
  ASSERT_EQ(run_command(pipetrain_command({"prepare-data", "--tokenizer", kGpt2, "--input",
                                           dir + "/plain.txt", "--output", dir + "/out",
                                           "--val-fraction", "0", "--name", "d"}))
                .exit_code,
            0);
  EXPECT_FALSE(fs::exists(dir + "/out/d_train_000000.mask"));
}

TEST_F(ChatData, TheCharacterGptRefusesMaskedTokens) {
  const auto input = write("pc.jsonl", "{\"prompt\": \"Say hi\", \"completion\": \" hi\"}\n");
  ASSERT_EQ(prepare(kGpt2, "prompt-completion", input, dir + "/out").exit_code, 0);
  const auto refused =
      run_command(pipetrain_command({"fit", "--model", "gpt", "--vocab-size", "50257",
                                     "--block-size", "2", "--train-data", dir + "/out"}));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--model gpt does not read loss masks"), std::string::npos)
      << refused.output;
}

TEST_F(ChatData, BadLinesAreUsageErrorsNamingFileAndLine) {
  const auto expect_error = [&](const std::string& tokenizer, const std::string& format,
                                const std::string& input, const std::string& says) {
    const auto result = prepare(tokenizer, format, input, dir + "/out");
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(says), std::string::npos) << result.output;
  };
  const std::string good =
      "{\"messages\": [" + message("user", "Hi") + ", " + message("assistant", "Hello.") + "]}\n";
  const auto broken = write("broken.jsonl", good + "{\"messages\": [\n");
  expect_error(kQwen3, "chat", broken, broken + ":2: not a line of JSON");
  const auto no_messages = write("no_messages.jsonl", good + "\n{\"turns\": []}\n");
  expect_error(kQwen3, "chat", no_messages, no_messages + ":3: no \"messages\" array");
  const auto no_role =
      write("no_role.jsonl", "{\"messages\": [{\"content\": \"Hi\"}, {\"role\": \"x\"}]}\n");
  expect_error(kQwen3, "chat", no_role, no_role + ":1: message 0 has no \"role\"");
  const auto no_content = write("no_content.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n");
  expect_error(kQwen3, "chat", no_content, no_content + ":1: message 0 has no \"content\"");
  const auto not_string =
      write("not_string.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}\n");
  expect_error(kQwen3, "chat", not_string,
               not_string + ":1: message 0's \"content\" is number, not a string");
  // Qwen3's template drops the thinking of assistant turns before the last user message: the
  // conversation up to the first turn is not the start of the whole one.
  const auto multi_turn =
      write("multi.jsonl", "{\"messages\": [" + message("user", "Hi") + ", " +
                               message("assistant", "Hello.") + ", " + message("user", "Bye") +
                               ", " + message("assistant", "Bye.") + "]}\n");
  expect_error(kQwen3, "chat", multi_turn,
               multi_turn + ":1: the chat template renders the conversation up to message 1");
  // GPT-2's tokenizer has no chat template.
  expect_error(kGpt2, "chat", write("gpt2.jsonl", good), "has no chat template");
  const auto no_completion = write("no_completion.jsonl", "{\"prompt\": \"a\"}\n");
  expect_error(kGpt2, "prompt-completion", no_completion,
               no_completion + ":1: the line has no \"completion\"");
  const auto no_prompt = write("no_prompt.jsonl", "[\"prompt\", \"completion\"]\n");
  expect_error(kGpt2, "prompt-completion", no_prompt,
               no_prompt + ":1: the line is not a JSON object");
}

// Conversations whose assistant turns are about half their tokens, enough for a few batches of
// 16-token windows.
std::string conversations() {
  std::string lines;
  for (int i = 0; i < 12; ++i) {
    const std::string n = std::to_string(i);
    lines += "{\"messages\": [" + message("user", "Count from " + n + " to " + n + " + 3.") + ", " +
             message("assistant", n + ", then one more, two more and three more.") + "]}\n";
  }
  return lines;
}

TEST_F(ChatData, ALlamaFineTunedOnConversationsUnderPipeAndDdpLogsTheLossesOfOneProcess) {
#ifndef PIPETRAIN_HAS_GLOO
  GTEST_SKIP() << "this libtorch has no Gloo for CPU ranks";
#endif
  // Every fourth conversation validates.
  ASSERT_EQ(prepare(kQwen3, "chat", write("chat.jsonl", conversations()), dir + "/data", "0.25")
                .exit_code,
            0);
  const int64_t vocabulary = Tokenizer::from_file(kQwen3).vocab_size();
  // Four steps of a 2-layer Llama of Qwen3's vocabulary on the masked tokens, global batches of 4
  // rows, under `strategy` (whose --batch-size is the rows of a replica).
  const auto fit = [&](const std::string& name, const std::vector<std::string>& strategy) {
    std::vector<std::string> flags = tiny_llama_flags(vocabulary, 16);
    flags.insert(flags.end(), {"--train-data", dir + "/data", "--max-steps", "4", "--seed", "5",
                               "--enable-progress-bar", "false"});
    flags.insert(flags.end(), strategy.begin(), strategy.end());
    flags.insert(flags.end(), {"--val-check-interval", "2"});
    const auto result = run_command(csv_logged_command("fit", "llama", dir + "/" + name, 2, flags),
                                    {}, std::chrono::seconds(300));
    EXPECT_EQ(result.exit_code, 0) << result.output;
  };
  fit("single", {"--strategy", "single", "--batch-size", "4"});
  ASSERT_EQ(read_csv_column(metrics_csv(dir + "/single"), "train_loss").size(), 4u);
  // Two micro-batches of two rows, whose unmasked targets differ in number: each micro-batch's
  // own mean, weighed by its rows, would give other losses.
  fit("pipe", {"--strategy", "pipe", "--devices", "2", "--chunks", "2", "--batch-size", "4"});
  fit("ddp", {"--strategy", "ddp", "--devices", "2", "--batch-size", "2"});
  // Sums over other groupings of the same targets: float32 rounding apart.
  expect_same_train_losses(dir + "/single", dir + "/pipe", 1e-5);
  expect_same_train_losses(dir + "/single", dir + "/ddp", 1e-5);
  // Validation's loss too is the mean over the unmasked targets (of two batches of 4 rows: the
  // pipe's; ddp's replicas validate on batches of 2).
  const auto val_single = read_csv_column(metrics_csv(dir + "/single"), "val_loss");
  const auto val_pipe = read_csv_column(metrics_csv(dir + "/pipe"), "val_loss");
  ASSERT_EQ(val_single.size(), 2u);
  ASSERT_EQ(val_pipe.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(val_pipe[i], val_single[i], 1e-5 * val_single[i]);
  // Stopped after two steps and resumed: the batches, masks and losses of the whole run.
  fit("parts", {"--strategy", "single", "--batch-size", "4", "--max-steps", "2"});
  fit("parts", {"--strategy", "single", "--batch-size", "4", "--ckpt-path", "last"});
  EXPECT_EQ(train_losses_in({metrics_csv(dir + "/parts", 0), metrics_csv(dir + "/parts", 1)}),
            read_csv_column(metrics_csv(dir + "/single"), "train_loss"));
}

}  // namespace
}  // namespace pipetrain::testing::chat_data_test
