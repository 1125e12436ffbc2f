// `pipetrain prepare-data` and the language model trained from token files: a run split into two
// stages, an exact resume mid-epoch, 32-bit tokens in llm.c's Llama 3 shards, the learning-rate
// schedule of GPT-2 logged step by step, and bad files and flags refused with a usage error.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::token_data_test {
namespace {

namespace fs = std::filesystem;

class TokenData : public LicenseTokensTest {
 protected:
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
  EXPECT_EQ(train_losses_in({metrics_csv(dir + "/parts", 0), metrics_csv(dir + "/parts", 1)}),
            expected);
}

TEST_F(TokenData, ThirtyTwoBitShardsOfPrepareDataTrainTheLanguageModel) {
  run_ok({PIPETRAIN_CLI, "prepare-data", "--input", "/usr/share/common-licenses/GPL-3", "--output",
          dir + "/wide", "--file-format", "llmc", "--token-dtype", "uint32"});
  // llm.c's Llama 3 header (magic 20240801, version 7, the token count), then 4 bytes a token.
  std::ifstream in(dir + "/wide/train.bin", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1024u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(bytes.size(), 1024u + 4u * static_cast<size_t>(header[2]));

  const auto result = run_command(fit(dir + "/wide-run", 2, {}, dir + "/wide/train.bin"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(read_csv_column(metrics_csv(dir + "/wide-run"), "train_loss").size(), 2u);

  // A raw file cannot say it holds 32-bit tokens.
  const auto raw =
      run_command({PIPETRAIN_CLI, "prepare-data", "--input", "/usr/share/common-licenses/GPL-3",
                   "--output", dir + "/raw", "--token-dtype", "uint32"});
  EXPECT_EQ(raw.exit_code, 2) << raw.output;
  EXPECT_NE(raw.output.find("--token-dtype uint32 needs --file-format llmc"), std::string::npos)
      << raw.output;
}

TEST_F(TokenData, ACosineScheduleIsLoggedStepByStep) {
  std::vector<std::string> schedule{"--lr",   "1e-3",           "--lr-schedule",
                                    "cosine", "--warmup-steps", "2"};
  schedule.insert(schedule.end(), {"--min-lr", "1e-4", "--log-every-n-steps", "1"});
  schedule.insert(schedule.end(), {"--num-sanity-val-steps", "0", "--limit-val-batches", "1"});
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), schedule.begin(), schedule.end());
    return tiny_gpt2_fit_command(dir + "/cosine", dir + "/data/train.bin", extra);
  };
  run_ok(with({"--max-steps", "6"}));
  // Worked out by hand: warmup 1e-3 x 1/2, 2/2; then t = (step - 2) / 4 and
  // 1e-4 + 9e-4 x 0.5 x (1 + cos(pi t)): t = 0.25 gives 1e-4 + 9e-4 x 0.853553391.
  const std::vector<double> expected{5e-4, 1e-3, 1e-3, 8.68198052e-4, 5.5e-4, 2.31801948e-4};
  // Both param groups (matrices, and the rest) follow the schedule.
  for (const std::string group : {"pg1", "pg2"}) {
    SCOPED_TRACE(group);
    const auto lrs = read_csv_column(metrics_csv(dir + "/cosine"), "lr-AdamW/" + group);
    ASSERT_EQ(lrs.size(), expected.size());
    for (size_t step = 0; step < expected.size(); ++step) {
      EXPECT_NEAR(lrs[step], expected[step], 1e-6 * expected[step]) << "step " << step;
    }
  }

  // A resume under another schedule would jump: extending the run to 10 steps moves the cosine's
  // end, so its rate at step 6 is no longer the one the run stopped at; keeping the first run's
  // --decay-steps trains on at --min-lr.
  const auto resume = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--ckpt-path", "last", "--default-root-dir", dir + "/cosine"});
    return run_command(with(extra));
  };
  const auto jumped = resume({"--max-steps", "10"});
  EXPECT_EQ(jumped.exit_code, 2) << jumped.output;
  EXPECT_NE(jumped.output.find("and this run's schedule gives"), std::string::npos)
      << jumped.output;
  const auto extended = resume({"--max-steps", "10", "--decay-steps", "6"});
  EXPECT_EQ(extended.exit_code, 0) << extended.output;

  // A decay needs an end: --max-steps (or --decay-steps).
  const auto endless = run_command(with({}));
  EXPECT_EQ(endless.exit_code, 2) << endless.output;
  EXPECT_NE(endless.output.find("--lr-schedule cosine decays to --min-lr over the run: pass "
                                "--max-steps N (or --decay-steps N)"),
            std::string::npos)
      << endless.output;
  const auto unknown = run_command(with({"--max-steps", "6", "--lr-schedule", "cosin"}));
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("--lr-schedule cosin: use constant, cosine, linear"),
            std::string::npos)
      << unknown.output;
}

TEST_F(TokenData, BadFilesAndMisplacedFlagsAreUsageErrors) {
  std::ofstream(dir + "/odd.bin", std::ios::binary) << "abc";
  auto odd = run_command(fit(dir + "/odd", 2, {}, dir + "/odd.bin"));
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("token file " + dir + "/odd.bin has an odd number of bytes (3)"),
            std::string::npos)
      << odd.output;

  auto small_vocabulary = run_command(fit(dir + "/vocab", 2, {"--vocab-size", "50"}));
  EXPECT_EQ(small_vocabulary.exit_code, 2) << small_vocabulary.output;
  EXPECT_NE(small_vocabulary.output.find("not below the vocabulary size 50 (--vocab-size)"),
            std::string::npos)
      << small_vocabulary.output;

  auto mlp = run_command({PIPETRAIN_CLI, "fit", "--model", "mlp", "--train-data",
                          dir + "/data/train.bin", "--default-root-dir", dir + "/mlp"});
  EXPECT_EQ(mlp.exit_code, 2) << mlp.output;
  EXPECT_NE(mlp.output.find("token files are for the language models (--model gpt, gpt2"),
            std::string::npos)
      << mlp.output;

  auto missing = run_command(
      {PIPETRAIN_CLI, "prepare-data", "--input", dir + "/none.txt", "--output", dir + "/out"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("--input " + dir + "/none.txt: cannot read the file"),
            std::string::npos)
      << missing.output;
}

// No validation share writes no val.bin, and takes away an earlier one: fit reads the val.bin
// beside train.bin, which would have been empty (a stop) or of another text (a wrong val_loss).
TEST_F(TokenData, NoValidationShareLeavesNoValBinForFitToRead) {
  ASSERT_TRUE(fs::exists(dir + "/data/val.bin"));
  const auto prepared =
      run_command({PIPETRAIN_CLI, "prepare-data", "--input", "/usr/share/common-licenses/GPL-2",
                   "--output", dir + "/data", "--val-fraction", "0"});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  EXPECT_NE(prepared.output.find("and no val.bin"), std::string::npos) << prepared.output;
  EXPECT_FALSE(fs::exists(dir + "/data/val.bin"));
  const auto trained = run_command(fit(dir + "/run", 1));
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
}

}  // namespace
}  // namespace pipetrain::testing::token_data_test
