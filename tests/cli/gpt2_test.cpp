// GPT-2 as the command builds it (--model gpt2): its tied head, and a
// small GPT-2 under `pipe` on 2 and 3 stages
// (the tied embedding on the first and last) with every schedule and checkpoint mode, fused
// gradient accumulation on and off, against `single` on the same data and initial weights,
// including a resume across layouts.
// Tolerance: fp32 on CPU, relative 1e-5 on per-step losses and absolute 1e-5 on the final
// weights, where only the order of sums differs (micro-batches, the tied gradient's two halves).
#include <pipetrain/hf_gpt2.h>
#include <pipetrain/language_model.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/safetensors.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::gpt2_test {
namespace {

namespace fs = std::filesystem;

nn::Gpt2Config small_config() {
  return tiny_gpt2_config(/*vocab_size=*/32, /*n_layer=*/3, /*block_size=*/8);
}

// Its optimizer is LanguageModel's (tests/train/language_model_test.cpp); its tie, as one process
// holding every layer builds it, is the token embedding's own tensor, trained once.
TEST(Gpt2, BuiltPerRankInOneProcessTheHeadIsTheTokenEmbedding) {
  LanguageModel model(nn::gpt2_layers(small_config()));
  model.build_layers(std::vector<bool>(model.layer_specs().size(), true), 0);
  EXPECT_TRUE(model.layers()->named_parameters()["0.wte.weight"].is_same(
      model.layers()
          ->named_parameters()[std::to_string(model.layer_specs().size() - 1) + ".weight"]));
  EXPECT_EQ(model.parameters().size(), model.layers()->parameters().size() - 1);
}

// Random token windows, the same on every rank.
TensorDataset token_windows() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(17);
  const auto tokens = torch::randint(0, 32, {48, 9}, generator, torch::kInt64);
  return {tokens.slice(1, 0, 8), tokens.slice(1, 1, 9)};
}

// Its fusion, where a layout fuses: the blocks' Linear layers too.
using Gpt2Run = PipeLayoutRun;

// Two epochs of 6 batches of 8 windows, shuffled, gradients clipped at 1 (the recipe's).
void train(const Gpt2Run& run) {
  Trainer trainer(run.trainer_options().max_epochs(2).gradient_clip_val(1.0));
  torch::manual_seed(5);
  LanguageModel model(nn::gpt2_layers(small_config()), LanguageModelOptions().lr(3e-3));
  const DataLoader loader(token_windows(), DataLoaderOptions().batch_size(8).shuffle(true).seed(2));
  trainer.fit(model, loader, nullptr, run.resume);
}

PIPETRAIN_WORKER(gpt2_worker) { train_from_env(train); }

class Gpt2Pipe : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  static void train_in_ranks(const Gpt2Run& run) { testing::train_in_ranks(run, "gpt2_worker"); }
  std::string dir = make_temp_dir("gpt2");
};

TEST_F(Gpt2Pipe, TwoAndThreeStagesTrainAsOneProcessInEveryScheduleAndCheckpointMode) {
  Gpt2Run single;
  single.root = dir + "/single";
  train(single);
  const auto expected = read_csv_column(metrics_csv(single.root), "train_loss");
  ASSERT_EQ(expected.size(), 12u);
  for (const auto& layout : std::vector<PipeLayout>{{2, "gpipe", "always"},
                                                    {2, "1f1b", "except_last"},
                                                    {2, "1f1b", "never"},
                                                    {2, "zbh1", "never"},
                                                    {3, "gpipe", "never"},
                                                    {3, "1f1b", "always"},
                                                    {3, "zbh1", "except_last"},
                                                    {2, "interleaved1f1b", "always", 2},
                                                    {2, "zbv", "never", 2},
                                                    {2, "gpipe", "never", 1, true},
                                                    {2, "1f1b", "always", 1, true},
                                                    {3, "zbh1", "never", 1, true}}) {
    Gpt2Run pipe;
    pipe.set_layout(layout, dir, /*chunks=*/4);
    SCOPED_TRACE(pipe.root);
    train_in_ranks(pipe);
    expect_same_losses(expected, read_csv_column(metrics_csv(pipe.root), "train_loss"), 1e-5);
    expect_same_weights(single.final_weights(), pipe.final_weights(), 1e-5);
  }
}

TEST_F(Gpt2Pipe, ACheckpointOfTwoStagesResumesInOneProcess) {
  Gpt2Run single;
  single.root = dir + "/single";
  train(single);
  Gpt2Run pipe;
  pipe.root = dir + "/pipe";
  pipe.strategy = "pipe";
  pipe.devices = 2;
  pipe.chunks = 2;
  pipe.max_steps = 4;  // mid-epoch 0
  train_in_ranks(pipe);
  Gpt2Run resumed;
  resumed.root = dir + "/resumed";
  resumed.resume = pipe.last_checkpoint();
  train(resumed);
  expect_same_losses(read_csv_column(metrics_csv(single.root), "train_loss"),
                     train_losses_in({metrics_csv(pipe.root), metrics_csv(resumed.root)}), 1e-5);
  expect_same_weights(single.final_weights(), resumed.final_weights(), 1e-5);
}

// Through the command: validation logs the perplexity of the epoch's mean loss.
TEST_F(Gpt2Pipe, TheCommandLogsValidationPerplexity) {
  ASSERT_EQ(run_command({PIPETRAIN_CLI, "prepare-data", "--input",
                         "/usr/share/common-licenses/GPL-3", "--output", dir + "/data"})
                .exit_code,
            0);
  const auto result = run_command(tiny_gpt2_fit_command(
      dir + "/run", dir + "/data/train.bin",
      {"--max-steps", "4", "--val-check-interval", "2", "--limit-val-batches", "3"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto loss = read_csv_column(metrics_csv(dir + "/run"), "val_loss");
  const auto perplexity = read_csv_column(metrics_csv(dir + "/run"), "val_ppl");
  ASSERT_EQ(loss.size(), 2u);
  ASSERT_EQ(perplexity.size(), loss.size());
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_NEAR(perplexity[i], std::exp(loss[i]), 1e-5 * std::exp(loss[i]));
  }
}

}  // namespace
}  // namespace pipetrain::testing::gpt2_test
