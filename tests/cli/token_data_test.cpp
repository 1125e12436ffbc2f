// `pipetrain prepare-data` and the language model trained from token files: a run split into two
// stages, an exact resume mid-epoch, and bad files refused with a usage error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::token_data_test {
namespace {

namespace fs = std::filesystem;

class TokenData : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto result =
        run_command({PIPETRAIN_CLI, "prepare-data", "--input", "/usr/share/common-licenses/GPL-3",
                     "--output", dir + "/data"});
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("wrote "), std::string::npos) << result.output;
  }
  void TearDown() override { fs::remove_all(dir); }
  // `pipetrain fit --model gpt` on the prepared files into `root`: a loss logged to CSV every step,
  // 2 validation batches, no progress bar, then `extra`.
  std::vector<std::string> fit(const std::string& root, int64_t max_steps,
                               std::vector<std::string> extra = {},
                               const std::string& train_data = "") const {
    // The logging flags go before `extra`, which has the last word.
    extra.insert(extra.begin(), {"--log-every-n-steps", "1", "--limit-val-batches", "2",
                                 "--enable-progress-bar", "false", "--logger", "csv"});
    return pipetrain_command({"fit", "--model", "gpt", "--train-data",
                              train_data.empty() ? dir + "/data/train.bin" : train_data,
                              "--max-steps", std::to_string(max_steps), "--batch-size", "8",
                              "--block-size", "16", "--default-root-dir", root},
                             extra);
  }
  std::string dir = make_temp_dir("token-data");
};

TEST_F(TokenData, TheLanguageModelTrainsFromPreparedFilesAcrossTwoStages) {
  const auto result = run_command(
      fit(dir + "/pipe", 6,
          {"--strategy", "pipe", "--devices", "2", "--chunks", "2", "--val-check-interval", "3"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto losses = read_csv_column(metrics_csv(dir + "/pipe"), "train_loss");
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front());
  // val.bin beside train.bin is the validation data.
  EXPECT_FALSE(read_csv_column(metrics_csv(dir + "/pipe"), "val_loss").empty());
}

TEST_F(TokenData, AResumeMidEpochContinuesWithTheBatchesOfAnUninterruptedRun) {
  ASSERT_EQ(run_command(fit(dir + "/whole", 10)).exit_code, 0);
  ASSERT_EQ(run_command(fit(dir + "/parts", 4)).exit_code, 0);
  const auto resumed = run_command(fit(dir + "/parts", 10, {"--ckpt-path", "last"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto expected = read_csv_column(metrics_csv(dir + "/whole"), "train_loss");
  auto seen = read_csv_column(metrics_csv(dir + "/parts", 0), "train_loss");
  const auto rest = read_csv_column(metrics_csv(dir + "/parts", 1), "train_loss");
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, expected);
}

TEST_F(TokenData, BadFilesAndMisplacedFlagsAreUsageErrors) {
  std::ofstream(dir + "/odd.bin", std::ios::binary) << "abc";
  auto odd = run_command(fit(dir + "/odd", 2, {}, dir + "/odd.bin"));
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("token file " + dir + "/odd.bin has an odd number of bytes (3)"),
            std::string::npos)
      << odd.output;

  auto small_vocabulary = run_command(fit(dir + "/vocab", 2, {"--vocab-size", "50"}));
  EXPECT_EQ(small_vocabulary.exit_code, 1) << small_vocabulary.output;
  EXPECT_NE(small_vocabulary.output.find("not below the vocabulary size 50 (--vocab-size)"),
            std::string::npos)
      << small_vocabulary.output;

  auto mlp = run_command({PIPETRAIN_CLI, "fit", "--model", "mlp", "--train-data",
                          dir + "/data/train.bin", "--default-root-dir", dir + "/mlp"});
  EXPECT_EQ(mlp.exit_code, 2) << mlp.output;
  EXPECT_NE(mlp.output.find("token files are for the language models (--model gpt, gpt2)"),
            std::string::npos)
      << mlp.output;

  auto missing = run_command(
      {PIPETRAIN_CLI, "prepare-data", "--input", dir + "/none.txt", "--output", dir + "/out"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("--input " + dir + "/none.txt: cannot read the file"),
            std::string::npos)
      << missing.output;
}

}  // namespace
}  // namespace pipetrain::testing::token_data_test
