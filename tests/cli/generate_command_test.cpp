// `pipetrain generate`: a small Qwen3 written as a Hugging Face folder with Qwen3's real tokenizer
// (tests/reference) continues a prompt with the text of nn::generate's tokens (streamed), a
// batch of prompts each as it continues alone, a chat turn through the chat template, prompt ids
// with the new ids; a small Llama's checkpoint of fit generates as its export does; fit prints and
// logs samples at every validation (--sample-prompts); a seed
// repeats a sampled continuation; missing prompts and bad options are usage errors. A small GPT-2
// written as a Hugging Face folder with GPT-2's tokenizer continues as the library does, never
// with an id of its vocabulary's padding (50257 to 50303) however likely; a GPT-2 checkpoint of
// fit generates as the library does from its weights.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/hf_decoder.h>
#include <pipetrain/hf_gpt2.h>
#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/generate.h>
#include <pipetrain/nn/gpt2.h>
#include <pipetrain/tokenizer.h>

#include "models/generate_command.h"
#include "support/command.h"
#include "support/real_tokenizers.h"
#include "support/small_models.h"

namespace pipetrain::testing::generate_command_test {
namespace {

namespace fs = std::filesystem;

const std::string kQwen3 = real_tokenizer("qwen3");
const std::string kGpt2 = real_tokenizer("gpt2");

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
    export_hf_decoder(weights, config, "qwen3", folder, kHfDefaultMaxShardBytes, at::kFloat,
                      kQwen3);
  }
  void TearDown() override { fs::remove_all(folder); }

  // The folder's generation_config.json's EOS ids.
  std::vector<int64_t> eos_ids() const {
    const auto generation =
        nlohmann::json::parse(std::ifstream(folder + "/generation_config.json"));
    if (!generation.contains("eos_token_id")) return {};
    const auto& value = generation["eos_token_id"];
    return value.is_array() ? value.get<std::vector<int64_t>>()
                            : std::vector<int64_t>{value.get<int64_t>()};
  }
  // What the library makes after `ids`, with the folder's EOS, as text.
  std::string continuation(const std::vector<int64_t>& ids, int64_t new_tokens) const {
    const auto made = nn::generate(model, {ids},
                                   nn::GenerationOptions()
                                       .max_new_tokens(new_tokens)
                                       .eos_token_ids(eos_ids())
                                       .vocab_limit(tokenizer.vocab_size()));
    return cli::decode_generated(tokenizer, made.front());
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
  const auto result = generate({"--prompt-ids", "9707,1052", "--prompt-ids", "17",
                                "--max-new-tokens", "5", "--dtype", "fp32"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::string expected;
  for (const auto& made :
       nn::generate(model, {{9707, 1052}, {17}},
                    nn::GenerationOptions().max_new_tokens(5).eos_token_ids(eos_ids()))) {
    for (size_t i = 0; i < made.size(); ++i) expected += (i ? "," : "") + std::to_string(made[i]);
    expected += "\n";
  }
  EXPECT_EQ(result.output, expected);
  EXPECT_EQ(generate({"--prompt-ids", "1,x"}).exit_code, 2);

  // Over a pipeline of 2 processes, each reading its own layers (the tied head its embedding's
  // values): the same ids, printed once.
  const auto piped = generate({"--prompt-ids", "9707,1052", "--prompt-ids", "17",
                               "--max-new-tokens", "5", "--strategy", "pipe", "--devices", "2"});
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(piped.output, expected);
  // A balance of one's own; one that does not add up, or leaves the head without its norm.
  const auto balanced =
      generate({"--prompt-ids", "9707,1052", "--prompt-ids", "17", "--max-new-tokens", "5",
                "--strategy", "pipe", "--devices", "2", "--balance", "3,2"});
  ASSERT_EQ(balanced.exit_code, 0) << balanced.output;
  EXPECT_EQ(balanced.output, expected);
  for (const auto& [balance, says] : std::vector<std::pair<std::string, std::string>>{
           {"2,2", "balance 2,2 sums to 4"}, {"4,1", "final norm"}}) {
    const auto refused = generate(
        {"--prompt-ids", "17", "--strategy", "pipe", "--devices", "2", "--balance", balance});
    EXPECT_NE(refused.exit_code, 0) << balance;
    EXPECT_NE(refused.output.find(says), std::string::npos) << refused.output;
  }
  // 2 blocks spread over 3 processes, and a strategy generation has not.
  const auto too_many = generate({"--prompt-ids", "17", "--strategy", "pipe", "--devices", "3"});
  EXPECT_NE(too_many.exit_code, 0);
  EXPECT_NE(too_many.output.find("generates over 2 processes at most"), std::string::npos)
      << too_many.output;
  const auto ddp = generate({"--prompt-ids", "17", "--strategy", "ddp"});
  EXPECT_EQ(ddp.exit_code, 2);
  EXPECT_NE(ddp.output.find("--strategy ddp: use single or pipe"), std::string::npos) << ddp.output;
}

TEST_F(GenerateCommand, ACheckpointOfFitGeneratesAsItsExport) {
  const std::string run = make_temp_dir("generate-checkpoint");
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>((i * 7 + i / 5) % 64);
  std::ofstream(run + "/train.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  auto fit = tiny_llama_flags(/*vocab_size=*/64, /*block_size=*/16);
  fit.insert(fit.begin(), {"fit", "--model", "llama"});
  fit.insert(fit.end(),
             {"--train-data", run + "/train.bin", "--max-steps", "2", "--batch-size", "4", "--lr",
              "0.01", "--enable-progress-bar", "false", "--default-root-dir", run});
  ASSERT_EQ(run_command(pipetrain_command(fit)).exit_code, 0);
  const auto exported = run_command(
      pipetrain_command({"export", "--format", "hf", "--ckpt-path", "last", "--default-root-dir",
                         run, "--output", run + "/hf", "--dtype", "fp32"}));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::vector<std::string> prompt{"--prompt-ids",  "1,2,3", "--max-new-tokens", "8",
                                        "--accelerator", "cpu"};
  auto from_checkpoint = prompt;
  from_checkpoint.insert(from_checkpoint.begin(),
                         {"generate", "--ckpt-path", "last", "--default-root-dir", run});
  auto from_export = prompt;
  from_export.insert(from_export.begin(), {"generate", "--init-from", run + "/hf"});
  const auto a = run_command(pipetrain_command(from_checkpoint));
  const auto b = run_command(pipetrain_command(from_export));
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(a.output, b.output);
  // Text prompts need the tokenizer fit started from: a checkpoint holds none.
  const auto text = run_command(pipetrain_command(
      {"generate", "--ckpt-path", "last", "--default-root-dir", run, "--prompt", "Hi"}));
  EXPECT_EQ(text.exit_code, 2) << text.output;
  EXPECT_NE(text.output.find("pass --tokenizer"), std::string::npos) << text.output;
  fs::remove_all(run);
}

TEST_F(GenerateCommand, FitPrintsAndLogsSamplesAtEveryValidation) {
  const std::string run = make_temp_dir("generate-samples");
  std::ofstream(run + "/text.jsonl")
      << R"({"text": "The river runs to the sea, and the sea is wide."})"
         "\n"
      << R"({"text": "Stones fall; rivers rise; the hills stay green."})"
         "\n";
  std::ofstream(run + "/prompts.txt") << "The river\n{\"prompt\": \"Stones\"}\n";
  ASSERT_EQ(run_command(pipetrain_command({"prepare-data", "--tokenizer", kQwen3, "--input",
                                           run + "/text.jsonl", "--output", run + "/data",
                                           "--val-fraction", "0.5"}))
                .exit_code,
            0);
  const std::vector<std::string> fit{"fit",
                                     "--model",
                                     "qwen3",
                                     "--init-from",
                                     folder,
                                     "--train-data",
                                     run + "/data",
                                     "--block-size",
                                     "4",
                                     "--batch-size",
                                     "2",
                                     "--max-steps",
                                     "2",
                                     "--val-check-interval",
                                     "2",
                                     "--num-sanity-val-steps",
                                     "0",
                                     "--sample-prompts",
                                     run + "/prompts.txt",
                                     "--sample-new-tokens",
                                     "3",
                                     "--logger",
                                     "tensorboard",
                                     "--enable-progress-bar",
                                     "false",
                                     "--enable-checkpointing",
                                     "false",
                                     "--accelerator",
                                     "cpu",
                                     "--default-root-dir",
                                     run};
  const auto result = run_command(pipetrain_command(fit));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("sample 0 at step 2: The river"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("sample 1 at step 2: Stones"), std::string::npos) << result.output;
  // TensorBoard's text: the tag and the plugin's name in the events file.
  std::string events;
  for (const auto& entry : fs::directory_iterator(run + "/lightning_logs/version_0")) {
    if (entry.path().filename().string().rfind("events.out.tfevents", 0) == 0) {
      std::ifstream in(entry.path(), std::ios::binary);
      events.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  // Summary.Value: tag (1) "sample_1", then tensor (8): dtype (1) DT_STRING (7), shape (2) [1],
  // string_val (8) the text; then metadata (9): plugin_data (1) plugin_name (1) "text".
  const auto sample = events.find("\x0a\x08sample_1\x42");
  ASSERT_NE(sample, std::string::npos);
  const size_t tensor_size = static_cast<unsigned char>(events[sample + 11]);
  const std::string tensor = events.substr(sample + 12, tensor_size);
  EXPECT_EQ(tensor.substr(0, 9), std::string("\x08\x07\x12\x04\x12\x02\x08\x01\x42", 9));
  EXPECT_EQ(tensor.substr(10, 6), "Stones");
  EXPECT_EQ(events.substr(sample + 12 + tensor_size, 10), "\x4a\x08\x0a\x06\x0a\x04text");

#ifdef PIPETRAIN_HAS_GLOO
  // A pipeline over two processes holds no whole model to sample with.
  auto split = fit;
  split.insert(split.end(),
               {"--strategy", "pipe", "--devices", "2", "--default-root-dir", run + "/split"});
  const auto refused = run_command(pipetrain_command(split));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--sample-prompts generates with the whole model"),
            std::string::npos)
      << refused.output;
#endif
  fs::remove_all(run);
}

TEST_F(GenerateCommand, ASeedRepeatsASampledContinuation) {
  const std::vector<std::string> sampling{"--prompt",      "Once", "--max-new-tokens", "8",
                                          "--temperature", "1.0",  "--top-k",          "50",
                                          "--seed",        "3"};
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
  // Hostile prompt files: a JSON line that does not parse, one whose prompt is not a string, a
  // file that is not there; each named with its line.
  const std::string prompts = folder + "/prompts.jsonl";
  for (const auto& [text, line] : std::vector<std::pair<std::string, std::string>>{
           {"fine\n{\"prompt\": \"unclosed\n", "line 2"},
           {"{\"prompt\": 3}\n", "line 1"},
           {"\n\n{\"text\": \"no prompt\"}\n", "line 3"}}) {
    std::ofstream(prompts) << text;
    result = generate({"--prompts-file", prompts});
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("prompts.jsonl, " + line), std::string::npos) << result.output;
  }
  result = generate({"--prompts-file", folder + "/missing.txt"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("cannot be read"), std::string::npos) << result.output;
}

TEST(GenerateGpt2, AFolderContinuesAsTheLibraryWithinTheTokenizersIds) {
  const std::string folder = make_temp_dir("generate-gpt2");
  // GPT-2's padded vocabulary.
  const auto config = tiny_gpt2_config(/*vocab_size=*/50304, /*n_layer=*/2, /*block_size=*/32);
  torch::manual_seed(5);
  auto model = nn::gpt2(config);
  {
    // Decided logits, and padding rows every row prefers: ln_f adds 1 to every feature, and
    // padding rows are all ones, so their logits (about n_embd) beat the others'.
    torch::NoGradGuard no_grad;
    for (auto& parameter : model->parameters()) parameter.normal_(0, 0.3);
    auto& ln_f = *model->ptr<nn::LayerNormImpl>(3);
    ln_f.weight.fill_(0.1);
    ln_f.bias.fill_(1);
    model->ptr<nn::Gpt2EmbeddingImpl>(0)->wte->weight.narrow(0, 50257, 47).fill_(1);
  }
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : model->named_parameters()) weights[item.key()] = item.value();
  export_hf_gpt2(weights, config, folder);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(kGpt2) / file, fs::path(folder) / file);
  }
  const Tokenizer tokenizer = Tokenizer::from_file(folder);
  ASSERT_EQ(tokenizer.vocab_size(), 50257);
  const std::string prompt = "The river runs";
  const auto ids = tokenizer.encode(prompt);
  auto options = nn::GenerationOptions().max_new_tokens(6).eos_token_ids(
      {tokenizer.eos_token_id().value_or(50256)});
  // Left to itself the model makes padding ids alone, which decode to nothing.
  const auto free = nn::generate(model, {ids}, options).front();
  for (const int64_t id : free) EXPECT_GE(id, 50257);
  const auto made = nn::generate(model, {ids}, options.vocab_limit(50257)).front();
  for (const int64_t id : made) EXPECT_LT(id, 50257);
  const std::string text = cli::decode_generated(tokenizer, made);
  EXPECT_FALSE(text.empty());

  const auto result =
      run_command(pipetrain_command({"generate", "--init-from", folder, "--accelerator", "cpu",
                                     "--prompt", prompt, "--max-new-tokens", "6"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, prompt + text + "\n");
  fs::remove_all(folder);
}

TEST(GenerateGpt2, ACheckpointOfFitGeneratesAsTheLibraryFromItsWeights) {
  const std::string run = make_temp_dir("generate-gpt2-checkpoint");
  std::vector<uint16_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 256);
  std::ofstream(run + "/train.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  const auto fit =
      run_command(tiny_gpt2_fit_command(run, run + "/train.bin", {"--max-steps", "2"}));
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const auto result = run_command(pipetrain_command(
      {"generate", "--ckpt-path", "last", "--default-root-dir", run, "--prompt-ids", "72,101,108",
       "--max-new-tokens", "5", "--accelerator", "cpu"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;

  // tiny_gpt2_fit_command's shape.
  auto model = nn::gpt2(tiny_gpt2_config(/*vocab_size=*/256, /*n_layer=*/2, /*block_size=*/8));
  const std::string checkpoint = run + "/lightning_logs/version_0/checkpoints/last.ckpt";
  load_weights(model, read_checkpoint_weights(checkpoint), checkpoint);
  std::string expected;
  const auto made =
      nn::generate(model, {{72, 101, 108}}, nn::GenerationOptions().max_new_tokens(5)).front();
  for (size_t i = 0; i < made.size(); ++i) expected += (i ? "," : "") + std::to_string(made[i]);
  EXPECT_EQ(result.output, expected + "\n");
  // Its stages over 2 processes, the head on the second taking the embedding's trained values.
  const auto piped = run_command(pipetrain_command(
      {"generate", "--ckpt-path", "last", "--default-root-dir", run, "--prompt-ids", "72,101,108",
       "--max-new-tokens", "5", "--accelerator", "cpu", "--strategy", "pipe", "--devices", "2"}));
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(piped.output, expected + "\n");
  fs::remove_all(run);
}

}  // namespace
}  // namespace pipetrain::testing::generate_command_test
