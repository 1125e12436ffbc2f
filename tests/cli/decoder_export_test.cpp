// `pipetrain export --format hf` of a Llama: the shape comes from the config.json that fit keeps
// beside its checkpoints, so what the weights do not say (RoPE's theta, RMSNorm's epsilon, an
// untied head) reaches the folder without repeating fit's flags, and a flag that contradicts it is
// refused. The checkpoint is one of two stages (each stage's file its own layers): export reads it
// one output shard at a time, and writes the weights as trained.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/safetensors.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::decoder_export_test {
namespace {

namespace fs = std::filesystem;

TEST(DecoderExport, ReadsTheShapeFitKeptBesideItsCheckpoints) {
  const std::string dir = make_temp_dir("decoder-export");
  ASSERT_EQ(
      run_command(pipetrain_command({"prepare-data", "--input", "/usr/share/common-licenses/GPL-3",
                                     "--output", dir + "/data"}))
          .exit_code,
      0);
  // One step of fit under `root`, as two stages where the build has Gloo, the model as `model`
  // says.
  const auto fit = [&](const std::string& root, std::vector<std::string> model) {
    std::vector<std::string> argv{"fit", "--model", "llama"};
    argv.insert(argv.end(), model.begin(), model.end());
    argv.insert(argv.end(),
                {"--train-data", dir + "/data/train.bin", "--batch-size", "4", "--max-steps", "1",
                 "--limit-val-batches", "0", "--num-sanity-val-steps", "0", "--enable-progress-bar",
                 "false", "--default-root-dir", root, "--chunks", "2"});
#ifdef PIPETRAIN_HAS_GLOO
    argv.insert(argv.end(), {"--strategy", "pipe", "--devices", "2"});
#endif
    run_ok(pipetrain_command(argv));
  };
  std::vector<std::string> shape = tiny_llama_flags(256, 8);
  shape.insert(shape.end(), {"--rope-theta", "12345", "--rms-norm-eps", "0.0001",
                             "--tie-word-embeddings", "false"});
  fit(dir + "/run", shape);
  const auto export_command = [&](const std::string& output, std::vector<std::string> extra) {
    return pipetrain_command({"export", "--format", "hf", "--model", "llama", "--ckpt-path", "last",
                              "--default-root-dir", dir + "/run", "--output", output},
                             extra);
  };
  run_ok(export_command(dir + "/hf", {"--dtype", "fp32"}));
  const std::string checkpoint = dir + "/run/lightning_logs/version_0/checkpoints/last.ckpt";
#ifdef PIPETRAIN_HAS_GLOO
  EXPECT_TRUE(fs::exists(checkpoint + "/model.safetensors.index.json"));
#endif
  const auto trained = read_checkpoint_weights(checkpoint);
  const auto exported = load_safetensors(dir + "/hf/model.safetensors");
  EXPECT_TRUE(torch::equal(exported.at("model.embed_tokens.weight"), trained.at("0.weight")));
  EXPECT_TRUE(torch::equal(exported.at("model.layers.1.mlp.down_proj.weight"),
                           trained.at("2.mlp.down_proj.weight")));
  EXPECT_TRUE(torch::equal(exported.at("model.norm.weight"), trained.at("3.weight")));
  EXPECT_TRUE(torch::equal(exported.at("lm_head.weight"), trained.at("4.weight")));
  // Fit from the export (two stages, each reading only its own layers' tensors) at lr 0: the
  // weights it starts from are the trained ones, exactly. The folder names its tokenizer's bos and
  // eos ids, as a published model's does.
  {
    std::ifstream in(dir + "/hf/config.json");
    auto with_ids = nlohmann::json::parse(in);
    with_ids["bos_token_id"] = 250;
    with_ids["eos_token_id"] = nlohmann::json::array({251, 252});
    std::ofstream(dir + "/hf/config.json", std::ios::trunc) << with_ids.dump(2);
  }
  fit(dir + "/restarted", {"--init-from", dir + "/hf", "--lr", "0"});
  const auto restarted =
      read_checkpoint_weights(dir + "/restarted/lightning_logs/version_0/checkpoints/last.ckpt");
  ASSERT_EQ(restarted.size(), trained.size());
  for (const auto& [name, tensor] : trained) {
    EXPECT_TRUE(torch::equal(restarted.at(name), tensor)) << name;
  }
  std::ifstream file(dir + "/hf/config.json");
  const auto config = nlohmann::json::parse(file);
  EXPECT_EQ(config.at("rope_theta"), 12345.0);
  EXPECT_EQ(config.at("rms_norm_eps"), 0.0001);
  EXPECT_EQ(config.at("tie_word_embeddings"), false);
  EXPECT_EQ(config.at("num_key_value_heads"), 1);

  // Exported without --init-from, the run started from that folder keeps its bos and eos ids
  // (without them transformers takes LlamaConfig's 1 and 2, and generation stops at another token).
  run_ok(
      pipetrain_command({"export", "--format", "hf", "--model", "llama", "--ckpt-path", "last",
                         "--default-root-dir", dir + "/restarted", "--output", dir + "/hf-again"}));
  std::ifstream again_file(dir + "/hf-again/config.json");
  const auto again = nlohmann::json::parse(again_file);
  EXPECT_EQ(again.value("bos_token_id", nlohmann::json()), 250);
  EXPECT_EQ(again.value("eos_token_id", nlohmann::json()), nlohmann::json::array({251, 252}));

  const auto contradicted = run_command(export_command(dir + "/other", {"--rope-theta", "99"}));
  EXPECT_NE(contradicted.exit_code, 0);
  EXPECT_NE(contradicted.output.find("--rope-theta"), std::string::npos) << contradicted.output;
  EXPECT_FALSE(fs::exists(dir + "/other/config.json"));

  // Another model's tokenizer (a folder of another vocabulary) is refused, before anything is
  // written.
  fs::create_directories(dir + "/other-model");
  std::ofstream(dir + "/other-model/config.json")
      << R"({"model_type": "llama", "vocab_size": 1000})";
  std::ofstream(dir + "/other-model/tokenizer.json") << "{}";
  const auto other_tokenizer =
      run_command(export_command(dir + "/other-tokens", {"--init-from", dir + "/other-model"}));
  EXPECT_EQ(other_tokenizer.exit_code, 2) << other_tokenizer.output;
  EXPECT_NE(other_tokenizer.output.find("is of a model of 1000 tokens"), std::string::npos)
      << other_tokenizer.output;
  EXPECT_FALSE(fs::exists(dir + "/other-tokens"));

  // Without the run's config.json (a checkpoint copied elsewhere) the shape must be given: the
  // preset's RoPE and epsilon would fit these tensors as well, and describe another model.
  fs::remove(dir + "/run/lightning_logs/version_0/config.json");
  const auto unknown = run_command(export_command(dir + "/unknown", {}));
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("no config.json of the run"), std::string::npos) << unknown.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::testing::decoder_export_test
