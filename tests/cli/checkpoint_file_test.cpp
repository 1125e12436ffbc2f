// Checkpoint files through the command: exact resume, loading across layouts, and damaged files
// rejected with a clear error that changes nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/safetensors.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::checkpoint_file_test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> command(const std::string& subcommand, const std::string& root,
                                 std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--batch-size", "32", "--seed", "5"});
  return csv_logged_command(subcommand, "mlp", root, 4, std::move(extra));
}

std::string last_checkpoint(const std::string& root) {
  return root + "/lightning_logs/version_0/checkpoints/last.ckpt";
}

// Losses of the steps a resumed run logged equal those of the same steps run without a stop.
void expect_exact_resume(const std::vector<std::string>& layout) {
  const auto root = make_temp_dir("resume");
  auto flags = layout;
  flags.insert(flags.end(), {"--every-n-train-steps", "10"});
  auto with = [&](std::vector<std::string> more) {
    auto all = flags;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  run_ok(command("fit", root + "/straight", with({"--max-steps", "30"})));
  run_ok(command("fit", root + "/stopped", with({"--max-steps", "20"})));
  run_ok(command("fit", root + "/stopped", with({"--max-steps", "30", "--ckpt-path", "last"})));

  const auto straight = read_csv_column(metrics_csv(root + "/straight", 0), "train_loss");
  const auto resumed = read_csv_column(metrics_csv(root + "/stopped", 1), "train_loss");
  const auto resumed_steps = read_csv_column(metrics_csv(root + "/stopped", 1), "step");
  ASSERT_EQ(straight.size(), 30u);
  ASSERT_EQ(resumed.size(), 10u);
  EXPECT_EQ(resumed_steps.front(), 20);
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i], straight[20 + i]) << "step " << 20 + i;  // exact: fp32 on CPU
  }
  fs::remove_all(root);
}

TEST(CheckpointFile, ResumeIsExactUnderSingle) { expect_exact_resume({"--strategy", "single"}); }

TEST(CheckpointFile, ResumeIsExactUnderPipeWithDropoutAndRecomputation) {
  expect_exact_resume({"--strategy", "pipe", "--devices", "2", "--chunks", "2", "--checkpoint",
                       "always", "--dropout", "0.2", "--schedule", "1f1b"});
}

TEST(CheckpointFile, SavedWithTwoStagesLoadsIntoOneAndThreeStages) {
  const auto root = make_temp_dir("layouts");
  run_ok(command("fit", root, {"--strategy", "pipe", "--devices", "2", "--max-steps", "8"}));
  const auto ckpt = last_checkpoint(root);
  // Each stage's process wrote its own layers (balance 7,8), nothing gathered; the index, as
  // Hugging Face's, says which file holds each tensor.
  EXPECT_FALSE(fs::exists(ckpt + "/model.safetensors"));
  const auto first = read_safetensors_header(ckpt + "/model-00001-of-00002.safetensors");
  const auto second = read_safetensors_header(ckpt + "/model-00002-of-00002.safetensors");
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  for (const auto& [name, entry] : first) EXPECT_LT(std::stoi(name), 7) << name;
  for (const auto& [name, entry] : second) EXPECT_GE(std::stoi(name), 7) << name;
  std::ifstream index_file(ckpt + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(index_file);
  EXPECT_EQ(index.at("weight_map").size(), first.size() + second.size());
  EXPECT_EQ(index.at("weight_map").at(first.begin()->first), "model-00001-of-00002.safetensors");
  EXPECT_EQ(index.at("weight_map").at(second.begin()->first), "model-00002-of-00002.safetensors");
  EXPECT_EQ(read_checkpoint_weights(ckpt).size(), first.size() + second.size());

  auto val_loss = [&](std::vector<std::string> layout) {
    layout.insert(layout.end(), {"--ckpt-path", ckpt});
    const auto eval_root = make_temp_dir("layouts-eval");
    run_ok(command("validate", eval_root, layout));
    const auto values = read_csv_column(metrics_csv(eval_root, 0), "val_loss");
    EXPECT_EQ(values.size(), 1u);
    return values.empty() ? -1.0 : values[0];
  };
  const double two = val_loss({"--strategy", "pipe", "--devices", "2"});
  const double one = val_loss({"--strategy", "single"});
  const double three = val_loss({"--strategy", "pipe", "--devices", "3", "--chunks", "2"});
  EXPECT_NEAR(one, two, 1e-6 * two);
  EXPECT_NEAR(three, two, 1e-6 * two);
  // And training resumes under another layout (what it resumes is checked in ddp_test).
  run_ok(
      command("fit", root,
              {"--strategy", "pipe", "--devices", "3", "--max-steps", "10", "--ckpt-path", ckpt}));
  // A shard missing, or an index that is not JSON: every rank refuses, naming the file.
  auto refused = [&](const std::string& name, const std::function<void(const std::string&)>& damage,
                     const std::string& phrase) {
    const auto broken = root + "/" + name + ".ckpt";
    fs::copy(ckpt, broken, fs::copy_options::recursive);
    damage(broken);
    const auto result =
        run_command(command("validate", make_temp_dir("layouts-broken"),
                            {"--strategy", "pipe", "--devices", "2", "--ckpt-path", broken}));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find(phrase), std::string::npos) << result.output;
  };
  refused(
      "no-shard",
      [](const std::string& dir) { fs::remove(dir + "/model-00002-of-00002.safetensors"); },
      "model.safetensors.index.json puts weights in model-00002-of-00002.safetensors, which is "
      "missing");
  refused(
      "bad-index",
      [](const std::string& dir) {
        std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc)
            << "{\"weight_map\": ";
      },
      "has a corrupt model.safetensors.index.json");
  fs::remove_all(root);
}

class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root = make_temp_dir("damaged");
    run_ok(command("fit", root, {"--max-steps", "3"}));
    ckpt = last_checkpoint(root);
    weights = ckpt + "/model.safetensors";
    original = read_bytes(weights);
  }
  void TearDown() override { fs::remove_all(root); }

  static std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  // Resuming from the damaged file fails with `phrase` in the message and writes nothing.
  void expect_rejected(const std::string& phrase) {
    const auto damaged = read_bytes(weights);
    const auto before = fs::last_write_time(ckpt + "/trainer_state.json");
    const auto result =
        run_command(command("fit", root, {"--max-steps", "6", "--ckpt-path", ckpt}));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(phrase), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(weights), std::string::npos) << result.output;
    EXPECT_EQ(read_bytes(weights), damaged);
    EXPECT_EQ(fs::last_write_time(ckpt + "/trainer_state.json"), before);
    EXPECT_FALSE(fs::exists(root + "/lightning_logs/version_1/checkpoints"));
  }

  std::string root, ckpt, weights, original;
};

TEST_F(DamagedCheckpoint, Truncated) {
  write_bytes(weights, original.substr(0, original.size() / 2));
  expect_rejected("truncated");
}

TEST_F(DamagedCheckpoint, MissingTensor) {
  auto tensors = load_safetensors(weights);
  tensors.erase("2.weight");
  save_safetensors(weights, tensors);
  expect_rejected("has no tensor '2.weight'");
}

TEST_F(DamagedCheckpoint, WrongShape) {
  auto tensors = load_safetensors(weights);
  tensors["2.weight"] = tensors["2.weight"].slice(0, 0, 3).clone();
  save_safetensors(weights, tensors);
  expect_rejected("holds '2.weight' with shape [3, 128]");
}

TEST_F(DamagedCheckpoint, MissingFolder) {
  const auto result = run_command(command("validate", root, {"--ckpt-path", root + "/nope.ckpt"}));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("nope.ckpt does not exist"), std::string::npos) << result.output;
}

// What nobody reads again is not left behind: the run folder of a resume that failed, and the
// unfinished folder of a save that was killed, once the run resumes.
TEST_F(DamagedCheckpoint, AFailedResumeLeavesNoRunFolderAndAResumeRemovesKilledSaves) {
  const std::string killed_save =
      root + "/lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt";
  fs::create_directories(killed_save + ".partial");
  std::ofstream(killed_save + ".partial/rank-0.pt") << "half";
  write_bytes(weights, original.substr(0, original.size() / 2));
  for (const auto& subcommand : {"fit", "validate"}) {
    const auto failed = run_command(command(subcommand, root, {"--ckpt-path", ckpt}));
    EXPECT_EQ(failed.exit_code, 1) << failed.output;
    EXPECT_FALSE(fs::exists(root + "/lightning_logs/version_1")) << subcommand;
  }
  EXPECT_TRUE(fs::exists(killed_save + ".partial"));  // a failed resume changes nothing there

  write_bytes(weights, original);
  run_ok(command("fit", root, {"--max-steps", "4", "--ckpt-path", "last"}));
  EXPECT_TRUE(fs::exists(root + "/lightning_logs/version_1/checkpoints/last.ckpt"));
  EXPECT_FALSE(fs::exists(killed_save + ".partial"));
  EXPECT_TRUE(fs::exists(ckpt));
}

TEST(CheckpointFile, GradientClippingAndAccumulationUnderPipeEqualSingle) {
  const auto root = make_temp_dir("clip");
  const std::vector<std::string> common{
      "--max-steps", "12", "--gradient-clip-val", "0.05", "--accumulate-grad-batches", "2"};
  auto single = common;
  single.insert(single.end(), {"--strategy", "single"});
  auto pipe = common;
  pipe.insert(pipe.end(), {"--strategy", "pipe", "--devices", "3", "--chunks", "4"});
  run_ok(command("fit", root + "/single", single));
  run_ok(command("fit", root + "/pipe", pipe));
  const auto expected = read_csv_column(metrics_csv(root + "/single", 0), "train_loss");
  const auto actual = read_csv_column(metrics_csv(root + "/pipe", 0), "train_loss");
  ASSERT_EQ(expected.size(), 12u);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * expected[i]) << "step " << i;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::checkpoint_file_test

namespace pipetrain::testing::checkpoint_file_test {
namespace {

// `pipetrain fit` of the boring model (a checkpoint of ~14 KB, TensorBoard events growing ~100
// bytes a step) with no file allowed past `kilobytes`, as a full disk would refuse the write
// (SIGXFSZ ignored, so writes fail with EFBIG, as with ENOSPC).
CommandResult fit_with_file_size_limit(const std::string& root, int kilobytes,
                                       const std::string& loggers) {
  std::vector<std::string> argv{
      "bash",
      "-c",
      "trap '' XFSZ; ulimit -f " + std::to_string(kilobytes) + "; exec \"$0\" \"$@\"",
      PIPETRAIN_CLI,
      "fit",
      "--model",
      "boring",
      "--batch-size",
      "1",
      "--max-steps",
      "200",
      "--log-every-n-steps",
      "1",
      "--logger",
      loggers,
      "--default-root-dir",
      root};
  return run_command(argv);
}

// The run under `root` ended on a refused write as it should: exit status 1, the reason ("File too
// large") and every one of `words` (what it was writing) said, no crash through std::terminate,
// and nothing half-written left (no .partial checkpoint, no temporary file).
void expect_clean_write_failure(const CommandResult& result, const std::string& root,
                                const std::vector<std::string>& words) {
  EXPECT_EQ(result.exit_code, 1) << result.output;
  for (const auto& word : words) {
    EXPECT_NE(result.output.find(word), std::string::npos) << word << " in:\n" << result.output;
  }
  EXPECT_NE(result.output.find("File too large"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".partial"), std::string::npos) << entry.path();
    EXPECT_EQ(name.find(".tmp-"), std::string::npos) << entry.path();
  }
}

TEST(WriteErrors, AFailedCheckpointWriteSaysWhyAndLeavesNoPartialFolder) {
  const auto root = make_temp_dir("write-error-checkpoint");
  // rank-0.pt is ~8 KB; metrics.csv stays under 6 KB in epoch 0.
  expect_clean_write_failure(fit_with_file_size_limit(root, 6, "csv"), root,
                             {"cannot write", "rank-0.pt"});
  fs::remove_all(root);
}

TEST(WriteErrors, AFailedLogWriteKeepsThePreviousLastCkptIntact) {
  const auto root = make_temp_dir("write-error-log");
  // The events outgrow 12 KB in epoch 1.
  expect_clean_write_failure(fit_with_file_size_limit(root, 12, "csv,tensorboard"), root,
                             {"events.out.tfevents"});
  // Epoch 0's last.ckpt is whole: it resumes.
  const auto last = root + "/lightning_logs/version_0/checkpoints/last.ckpt";
  std::ifstream state(last + "/trainer_state.json");
  const std::string text((std::istreambuf_iterator<char>(state)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"global_step\": 64"), std::string::npos) << text;
  const auto validated = run_command({PIPETRAIN_CLI, "validate", "--model", "boring", "--ckpt-path",
                                      last, "--default-root-dir", root + "/validate"});
  EXPECT_EQ(validated.exit_code, 0) << validated.output;
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::checkpoint_file_test
