// `pipetrain generate`: a small Qwen3 written as a Hugging Face folder with Qwen3's real tokenizer
// (tests/reference) continues a prompt with the text of nn::generate's tokens (streamed), a
// batch of prompts each as it continues alone, a chat turn through the chat template; a seed
// repeats a sampled continuation; missing prompts and bad options are usage errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/generate.h>
#include <pipetrain/tokenizer.h>

#include "models/hf_decoder.h"
#include "support/command.h"
#include "support/real_tokenizers.h"

namespace pipetrain::testing::generate_command_test {
namespace {

namespace fs = std::filesystem;

const std::string kQwen3 = real_tokenizer("qwen3");

class GenerateCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    config.vocab_size = 151936;
    config.n_layer = 2;
    config.n_embd = 16;
    config.n_head = 2;
    config.n_kv_head = 1;
    config.head_dim = 8;
    config.intermediate_size = 32;
    config.qk_norm = true;
    config.tie_word_embeddings = true;
    config.rope.theta(1e6);
    config.init_std = 0.3;  // decided logits: greedy choices far from ties
    torch::manual_seed(11);
    model = nn::decoder(config);
    std::map<std::string, at::Tensor> weights;
    for (const auto& item : model->named_parameters()) weights[item.key()] = item.value();
    cli::export_hf_decoder(weights, config, "qwen3", folder, cli::kHfDefaultMaxShardBytes,
                           at::kFloat, kQwen3);
  }
  void TearDown() override { fs::remove_all(folder); }

  // The folder's generation_config.json's EOS ids.
  std::vector<int64_t> eos_ids() const {
    const auto generation = nlohmann::json::parse(std::ifstream(folder + "/generation_config.json"));
    if (!generation.contains("eos_token_id")) return {};
    const auto& value = generation["eos_token_id"];
    return value.is_array() ? value.get<std::vector<int64_t>>()
                            : std::vector<int64_t>{value.get<int64_t>()};
  }
  // What the library makes after `ids`, with the folder's EOS, as text.
  std::string continuation(const std::vector<int64_t>& ids, int64_t new_tokens) const {
    const auto made = nn::generate(
        model, {ids}, nn::GenerationOptions().max_new_tokens(new_tokens).eos_token_ids(eos_ids()));
    return tokenizer.decode(made.front(), /*skip_special_tokens=*/true);
  }
  CommandResult generate(const std::vector<std::string>& flags) const {
    std::vector<std::string> argv{"generate", "--init-from", folder, "--accelerator", "cpu"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return run_command(pipetrain_command(argv));
  }

  nn::DecoderConfig config;
  torch::nn::Sequential model{nullptr};
  std::string folder = make_temp_dir("generate-command");
  Tokenizer tokenizer = Tokenizer::from_file(kQwen3);
};

TEST_F(GenerateCommand, ContinuesPromptsWithTheLibrarysTokens) {
  const std::string first = "The river runs", second = "Numbers: 1, 2,";
  auto result = generate({"--prompt", first, "--max-new-tokens", "12"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, first + continuation(tokenizer.encode(first), 12) + "\n");

  // Two prompts as one batch: each continues as it does alone.
  result = generate({"--prompt", first, "--prompt", second, "--max-new-tokens", "12"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, first + continuation(tokenizer.encode(first), 12) +
                               "\n---------------\n" + second +
                               continuation(tokenizer.encode(second), 12) + "\n");

  // A user turn of the chat template, the assistant's turn to come.
  result = generate({"--prompt", first, "--max-new-tokens", "6", "--chat"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto chat = tokenizer.encode(
      tokenizer.apply_chat_template({{"user", first}}, /*add_generation_prompt=*/true), false);
  EXPECT_EQ(result.output, first + continuation(chat, 6) + "\n");
}

TEST_F(GenerateCommand, PromptIdsPrintTheNewIds) {
  const auto result = generate({"--prompt-ids", "9707,1052", "--prompt-ids", "17", "--max-new-tokens",
                                "5", "--dtype", "fp32"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::string expected;
  for (const auto& made : nn::generate(model, {{9707, 1052}, {17}},
                                       nn::GenerationOptions().max_new_tokens(5).eos_token_ids(
                                           eos_ids()))) {
    for (size_t i = 0; i < made.size(); ++i) expected += (i ? "," : "") + std::to_string(made[i]);
    expected += "\n";
  }
  EXPECT_EQ(result.output, expected);
  EXPECT_EQ(generate({"--prompt-ids", "1,x"}).exit_code, 2);
}

TEST_F(GenerateCommand, ASeedRepeatsASampledContinuation) {
  const std::vector<std::string> sampling{"--prompt", "Once", "--max-new-tokens", "8",
                                          "--temperature", "1.0", "--top-k", "50", "--seed", "3"};
  const auto first = generate(sampling);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(generate(sampling).output, first.output);
}

TEST_F(GenerateCommand, RefusesMissingPromptsAndBadOptions) {
  auto result = generate({});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--prompt"), std::string::npos) << result.output;
  result = generate({"--prompt", "Hi", "--top-p", "0"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("top_p"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace pipetrain::testing::generate_command_test
