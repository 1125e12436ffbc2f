// GPT-2 to and from Hugging Face's layout: `pipetrain export --format hf-gpt2` of a trained
// checkpoint gives, read by a PyTorch re-implementation of GPT-2's forward that shares no code with
// pipetrain (tests/io/gpt2_reference.py), and where a Python has it by transformers'
// GPT2LMHeadModel.from_pretrained itself (tests/io/gpt2_transformers.py), the logits pipetrain
// computes (fp32, absolute 1e-4);
// `--init-from` of the export starts training from exactly those weights; bad folders and shapes
// are usage errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <pipetrain/hf_gpt2.h>
#include <pipetrain/language_model.h>
#include "pipetrain/checkpoint_io.h"
#include "pipetrain/safetensors.h"
#include "support/command.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::testing::hf_export_test {
namespace {

namespace fs = std::filesystem;

// A Python that imports `modules`: Debian's, else the first on PATH; "" when neither does.
std::string python_with(const std::string& modules) {
  for (const char* python : {"/usr/bin/python3", "python3"}) {
    if (run_command({python, "-c", "import " + modules}).exit_code == 0) return python;
  }
  return "";
}

class HfExport : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(run_command({PIPETRAIN_CLI, "prepare-data", "--input",
                           "/usr/share/common-licenses/GPL-3", "--output", dir + "/data"})
                  .exit_code,
              0);
  }
  void TearDown() override { fs::remove_all(dir); }
  // A tiny GPT-2 trained for `steps` steps into `root`; returns its last.ckpt.
  std::string fit(const std::string& root, int64_t steps, std::vector<std::string> extra) const {
    std::vector<std::string> argv{PIPETRAIN_CLI,
                                  "fit",
                                  "--model",
                                  "gpt2",
                                  "--train-data",
                                  dir + "/data/train.bin",
                                  "--max-steps",
                                  std::to_string(steps),
                                  "--batch-size",
                                  "4",
                                  "--vocab-size",
                                  "256",
                                  "--block-size",
                                  "8",
                                  "--num-sanity-val-steps",
                                  "0",
                                  "--limit-val-batches",
                                  "0",
                                  "--enable-progress-bar",
                                  "false",
                                  "--default-root-dir",
                                  root};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto result = run_command(argv);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return root + "/lightning_logs/version_0/checkpoints/last.ckpt";
  }
  // Trains the tiny GPT-2 into `checkpoint_` and exports it into `folder_`.
  void export_trained() {
    checkpoint_ = fit(dir + "/trained", 5, shape);
    const auto exported =
        run_command({PIPETRAIN_CLI, "export", "--format", "hf-gpt2", "--ckpt-path", checkpoint_,
                     "--output", folder_, "--n-head", "2"});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
  }
  // pipetrain's logits of the checkpoint for ids_.
  at::Tensor our_logits() const {
    auto gpt2 = nn::gpt2(tiny_gpt2_config(/*vocab_size=*/256, /*n_layer=*/2, /*block_size=*/8));
    load_weights(gpt2, read_checkpoint_weights(checkpoint_), checkpoint_);
    gpt2->eval();
    return gpt2->forward(torch::tensor(ids_).unsqueeze(0)).squeeze(0);
  }
  // `python script folder_ ids_...` prints the same logits as pipetrain.
  void expect_same_logits(const std::string& python, const std::string& script) const {
    std::vector<std::string> argv{python, std::string(PIPETRAIN_SOURCE_DIR) + "/tests/io/" + script,
                                  folder_};
    for (const int64_t id : ids_) argv.push_back(std::to_string(id));
    const auto reference = run_command(argv);
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    // The last line: a library may print notices before it.
    const auto trimmed = reference.output.substr(0, reference.output.find_last_not_of('\n') + 1);
    const auto rows = nlohmann::json::parse(trimmed.substr(trimmed.rfind('\n') + 1))
                          .get<std::vector<std::vector<float>>>();
    ASSERT_EQ(rows.size(), ids_.size());
    const auto ours = our_logits();
    for (size_t t = 0; t < rows.size(); ++t) {
      const auto theirs = torch::tensor(rows[t]);
      EXPECT_TRUE(torch::allclose(ours[static_cast<int64_t>(t)], theirs, 0, 1e-4))
          << script << ", position " << t << " differs by "
          << (ours[static_cast<int64_t>(t)] - theirs).abs().max().item<double>();
    }
  }

  const std::vector<std::string> shape{"--n-layer", "2", "--n-head", "2", "--n-embd", "16"};
  const std::vector<int64_t> ids_{84, 104, 101, 32, 71, 78, 85, 32};
  std::string dir = make_temp_dir("hf-export");
  std::string checkpoint_, folder_ = dir + "/hf";
};

TEST_F(HfExport, AnExportGivesAnIndependentGpt2TheSameLogitsAndTrainsOnFromThere) {
  export_trained();
  const std::string checkpoint = checkpoint_, folder = folder_;
  std::ifstream config_file(folder + "/config.json");
  const auto config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config.at("model_type"), "gpt2");
  EXPECT_EQ(config.at("n_layer"), 2);
  EXPECT_EQ(config.at("n_positions"), 8);
  EXPECT_EQ(config.at("vocab_size"), 256);
  const auto stored = load_safetensors(folder + "/model.safetensors");
  EXPECT_EQ(stored.count("lm_head.weight"), 0u);  // tied to wte
  EXPECT_EQ(stored.at("transformer.h.0.attn.c_attn.weight").sizes(),
            (std::vector<int64_t>{16, 48}));  // Conv1D: [in, out]

  const std::string python = python_with("torch");
  if (python.empty()) GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  expect_same_logits(python, "gpt2_reference.py");

  // A run started from the export with lr 0 keeps its weights exactly.
  const std::string restarted = fit(dir + "/restarted", 1, {"--init-from", folder, "--lr", "0"});
  const auto before = read_checkpoint_weights(checkpoint),
             after = read_checkpoint_weights(restarted);
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, tensor] : before) {
    EXPECT_TRUE(torch::equal(after.at(name), tensor)) << name;
  }

  // A shape flag that contradicts the folder's config.json is refused, not ignored.
  const auto contradicted = run_command(
      {PIPETRAIN_CLI, "fit", "--model", "gpt2", "--train-data", dir + "/data/train.bin",
       "--init-from", folder, "--block-size", "16", "--default-root-dir", dir + "/contradicted"});
  EXPECT_EQ(contradicted.exit_code, 2) << contradicted.output;
  EXPECT_NE(contradicted.output.find("holds a GPT-2 of its own shape (config.json)"),
            std::string::npos)
      << contradicted.output;
}

// What users of an export run: transformers itself (on machines whose Python has it).
TEST_F(HfExport, TransformersLoadsTheExportWithTheSameLogits) {
  const std::string python = python_with("torch, transformers");
  if (python.empty()) GTEST_SKIP() << "no Python with torch and transformers";
  export_trained();
  expect_same_logits(python, "gpt2_transformers.py");
}

// The heads leave no trace in the weights: export takes them from the config.json fit wrote in the
// run's folder (4 heads here, where 2 would load in transformers just as well, and wrongly), a
// contradicting --n-head is refused, and without that file --n-head is needed (no guess from a
// released size's depth and width). A folder to start from needs its files.
TEST_F(HfExport, TheHeadsComeFromTheRunsConfigOrFromNHeadAndAFolderNeedsItsFiles) {
  const std::string checkpoint =
      fit(dir + "/trained", 1, {"--n-layer", "2", "--n-head", "4", "--n-embd", "16"});
  const auto exported = run_command(
      {PIPETRAIN_CLI, "export", "--ckpt-path", checkpoint + "/", "--output", dir + "/hf"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  std::ifstream config(dir + "/hf/config.json");
  EXPECT_EQ(nlohmann::json::parse(config).at("n_head"), 4);

  const auto contradicted = run_command({PIPETRAIN_CLI, "export", "--ckpt-path", checkpoint,
                                         "--output", dir + "/hf2", "--n-head", "2"});
  EXPECT_EQ(contradicted.exit_code, 2) << contradicted.output;
  EXPECT_NE(contradicted.output.find("config.json says 4"), std::string::npos)
      << contradicted.output;

  fs::remove(dir + "/trained/lightning_logs/version_0/config.json");
  const auto unknown =
      run_command({PIPETRAIN_CLI, "export", "--ckpt-path", checkpoint, "--output", dir + "/hf3"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("the heads of a GPT-2 are not in its weights"), std::string::npos)
      << unknown.output;

  const auto missing =
      run_command({PIPETRAIN_CLI, "fit", "--model", "gpt2", "--train-data", dir + "/data/train.bin",
                   "--init-from", dir + "/nothing", "--default-root-dir", dir + "/r"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("no config.json there"), std::string::npos) << missing.output;
}

// A folder whose config.json asks for arithmetic pipetrain's GPT-2 does not have (attention
// scaled by the layer's index, as the Stanford CRFM runs were trained) is refused, not loaded.
TEST_F(HfExport, AFolderOfAnotherAttentionScalingIsRefused) {
  export_trained();
  nlohmann::json config = nlohmann::json::parse(std::ifstream(folder_ + "/config.json"));
  config["scale_attn_by_inverse_layer_idx"] = true;
  std::ofstream(folder_ + "/config.json") << config.dump(2);
  const auto refused =
      run_command({PIPETRAIN_CLI, "fit", "--model", "gpt2", "--train-data", dir + "/data/train.bin",
                   "--init-from", folder_, "--default-root-dir", dir + "/r"});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("scale_attn_by_inverse_layer_idx"), std::string::npos)
      << refused.output;
}

// A folder whose config.json does not describe its weights is refused naming the tensor before
// any layer is built (a vocabulary of 1e12 would be met by the allocator); weights that are not
// finite name the folder (the first loss would be NaN, and the learning rate blamed); a damaged
// weights file is the usage error a missing one is.
TEST_F(HfExport, AFolderWhoseConfigOrWeightsAreWrongIsRefusedNamingIt) {
  export_trained();
  const auto fit_from = [&](const std::string& folder) {
    return run_command({PIPETRAIN_CLI, "fit", "--model", "gpt2", "--train-data",
                        dir + "/data/train.bin", "--init-from", folder, "--max-steps", "1",
                        "--batch-size", "4", "--default-root-dir", dir + "/r"});
  };
  const auto copy = [&](const std::string& name) {
    fs::copy(folder_, dir + "/" + name, fs::copy_options::recursive);
    return dir + "/" + name;
  };
  const auto expect_refused = [&](const std::string& folder, const std::string& says) {
    const auto result = fit_from(folder);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(folder + "/model.safetensors" + says), std::string::npos)
        << result.output;
  };
  const std::string huge = copy("huge");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(huge + "/config.json"));
  config["vocab_size"] = int64_t{1'000'000'000'000};
  std::ofstream(huge + "/config.json", std::ios::trunc) << config.dump(2);
  expect_refused(huge,
                 ": tensor transformer.wte.weight has shape [256, 16], not the "
                 "[1000000000000, 16]");

  const std::string nan = copy("nan");
  auto weights = load_safetensors(nan + "/model.safetensors");
  weights.at("transformer.h.1.mlp.c_fc.weight")[0][0] = std::nan("");
  save_safetensors(nan + "/model.safetensors", weights, {{"format", "pt"}});
  expect_refused(nan, ": tensor \"2.mlp.c_fc.weight\" holds NaN or infinite values");

  const std::string damaged = copy("damaged");
  std::ofstream(damaged + "/model.safetensors", std::ios::trunc) << "garbage";
  expect_refused(damaged, ": the file is 7 bytes");
}

}  // namespace
}  // namespace pipetrain::testing::hf_export_test
