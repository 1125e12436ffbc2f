// pipetrain::LanguageModel: its optimizer (decay on matrices and embeddings alone, AdamW's options,
// two groups on every stage), its schedule, its loss over the targets not masked, and a model of
// one's own trained and evaluated through it in a Trainer.
#include "pipetrain/language_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/fused_adamw.h"
#include "pipetrain/loss_mask.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace pipetrain::testing::language_model_test {
namespace {

constexpr int64_t kVocabulary = 12, kWidth = 16, kLength = 6;

// Token ids [B, T] -> logits [B, T, vocabulary], with a gain and a bias (1-D) beside the
// embedding and the head's matrix.
torch::nn::Sequential tiny_model() {
  return torch::nn::Sequential(torch::nn::Embedding(kVocabulary, kWidth),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})),
                               torch::nn::Linear(kWidth, kVocabulary));
}

const torch::optim::AdamWOptions& adamw_options(const torch::optim::OptimizerParamGroup& group) {
  return static_cast<const torch::optim::AdamWOptions&>(group.options());
}

TEST(LanguageModel, DecaysMatricesAndEmbeddingsOnlyWithTheOptionsGiven) {
  LanguageModel model(
      tiny_model(), LanguageModelOptions().lr(2e-3).weight_decay(0.05).betas({0.8, 0.9}).eps(1e-6));
  auto config = model.configure_optimizers();
  ASSERT_NE(dynamic_cast<FusedAdamW*>(config.optimizer.get()), nullptr);
  EXPECT_EQ(config.lr_scheduler, nullptr);  // constant, no warmup: nothing to schedule
  const auto& groups = config.optimizer->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  // The embedding and the head's weight; the LayerNorm's gain and bias and the head's bias.
  ASSERT_EQ(groups[0].params().size(), 2u);
  ASSERT_EQ(groups[1].params().size(), 3u);
  for (const auto& parameter : groups[0].params()) EXPECT_EQ(parameter.dim(), 2);
  for (const auto& parameter : groups[1].params()) EXPECT_EQ(parameter.dim(), 1);
  EXPECT_EQ(adamw_options(groups[0]).weight_decay(), 0.05);
  EXPECT_EQ(adamw_options(groups[1]).weight_decay(), 0.0);
  for (const auto& group : groups) {
    EXPECT_EQ(adamw_options(group).lr(), 2e-3);
    EXPECT_EQ(adamw_options(group).betas(), std::make_tuple(0.8, 0.9));
    EXPECT_EQ(adamw_options(group).eps(), 1e-6);
  }
}

TEST(LanguageModel, KeepsTwoGroupsOnAStageWithoutGainsOrBiases) {
  // A first stage holding the embedding alone: the second group is there, empty.
  LanguageModel model(torch::nn::Sequential(torch::nn::Embedding(kVocabulary, kWidth)));
  const auto config = model.configure_optimizers();
  const auto& groups = config.optimizer->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params().size(), 1u);
  EXPECT_TRUE(groups[1].params().empty());
  // The recipe GPT-2, Llama and Qwen3 train with, by default.
  EXPECT_EQ(adamw_options(groups[0]).lr(), 6e-4);
  EXPECT_EQ(adamw_options(groups[0]).weight_decay(), 0.1);
  EXPECT_EQ(adamw_options(groups[0]).betas(), std::make_tuple(0.9, 0.95));
  EXPECT_EQ(adamw_options(groups[0]).eps(), 1e-8);
}

TEST(LanguageModel, WarmsUpThenDecaysEveryOptimizerStep) {
  LanguageModel model(
      tiny_model(),
      LanguageModelOptions().lr(1e-2).lr_schedule("cosine").warmup_steps(2).decay_steps(6).min_lr(
          1e-3));
  const auto config = model.configure_optimizers();
  ASSERT_NE(config.lr_scheduler, nullptr);
  EXPECT_EQ(config.interval, "step");
  // Warmup (s + 1) / 2 of the peak, then cosine from step 2 to min_lr at step 6, both groups.
  const auto expect_lr = [&](int64_t step, double lr) {
    for (const double group_lr : config.lr_scheduler->lrs_at(step)) {
      EXPECT_NEAR(group_lr, lr, 1e-12) << "step " << step;
    }
  };
  expect_lr(0, 5e-3);
  expect_lr(1, 1e-2);
  expect_lr(2, 1e-2);
  expect_lr(4, 1e-3 + 9e-3 * 0.5);
  expect_lr(6, 1e-3);
  expect_lr(9, 1e-3);
  // Warmup alone schedules too, constant after it.
  LanguageModel warmed(tiny_model(), LanguageModelOptions().lr(1e-2).warmup_steps(4));
  const auto warmup = warmed.configure_optimizers();
  ASSERT_NE(warmup.lr_scheduler, nullptr);
  EXPECT_NEAR(warmup.lr_scheduler->lrs_at(0).at(0), 2.5e-3, 1e-12);
  EXPECT_NEAR(warmup.lr_scheduler->lrs_at(10).at(1), 1e-2, 1e-12);
}

TEST(LanguageModel, RefusesANegativeRateOrDecayAndAnUnknownSchedule) {
  const auto error = [](const LanguageModelOptions& options) {
    return error_of<std::invalid_argument>(
        [&] { LanguageModel(tiny_model(), options).configure_optimizers(); });
  };
  EXPECT_NE(error(LanguageModelOptions().lr(-1)).find("lr"), std::string::npos);
  EXPECT_NE(error(LanguageModelOptions().weight_decay(-0.1)).find("weight_decay"),
            std::string::npos);
  EXPECT_NE(error(LanguageModelOptions().lr_schedule("cosin").decay_steps(5)).find("cosin"),
            std::string::npos);
}

// Windows of random tokens, the target of some positions masked (none of one row, all but one of
// another), so that a mean over rows or over every position would differ from the right one.
Batch masked_batch() {
  torch::manual_seed(3);
  auto data = torch::randint(0, kVocabulary, {4, kLength}, torch::kInt64);
  auto target = torch::randint(0, kVocabulary, {4, kLength}, torch::kInt64);
  target.index_put_({1, torch::indexing::Slice(1)}, kMaskedTarget);
  target.index_put_({2, 0}, kMaskedTarget);
  target.index_put_({3, torch::indexing::Slice(0, 3)}, kMaskedTarget);
  return Batch(data, target);
}

at::Tensor cross_entropy_of(LanguageModel& model, const Batch& batch) {
  torch::NoGradGuard no_grad;
  const auto logits = model.layers()->forward(batch.data);
  // Torch's mean over the targets not ignored (its ignore_index is kMaskedTarget).
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocabulary}),
                                              batch.target.reshape({-1}));
}

TEST(LanguageModel, AMaskedLossIsTheMeanOverTheTargetsNotMasked) {
  torch::manual_seed(0);
  LanguageModel model(tiny_model(), LanguageModelOptions().masked_targets(true));
  const auto batch = masked_batch();
  const auto expected = cross_entropy_of(model, batch).item<double>();
  EXPECT_NEAR(model.training_step(batch, 0).item<double>(), expected, 1e-5);
  // Unmasked, every position is a target: the plain mean.
  LanguageModel plain(tiny_model());
  Batch whole(batch.data, batch.target.clamp_min(0));
  EXPECT_NEAR(plain.training_step(whole, 0).item<double>(),
              cross_entropy_of(plain, whole).item<double>(), 1e-5);
}

class LanguageModelFit : public TempDirTest {};

TEST_F(LanguageModelFit, AMaskedLossIsTheMeanOverTheTargetsNotMaskedOfTheWholeStep) {
  // One optimizer step at learning rate 0 over two accumulated batches of 2 rows, of 11 and 8
  // targets not masked: the step's loss is the mean over all 19, not the mean of the two batches'
  // means.
  Trainer trainer(TrainerOptions()
                      .max_steps(1)
                      .accumulate_grad_batches(2)
                      .log_every_n_steps(1)
                      .default_root_dir(dir)
                      .enable_progress_bar(false));
  LanguageModel model(tiny_model(), LanguageModelOptions().lr(0).masked_targets(true));
  const auto batch = masked_batch();
  const auto expected = cross_entropy_of(model, batch).item<double>();
  const double mean_of_means = (cross_entropy_of(model, batch.slice(0, 2)).item<double>() +
                                cross_entropy_of(model, batch.slice(2, 4)).item<double>()) /
                               2;
  ASSERT_GT(std::abs(mean_of_means - expected), 1e-3);  // the data tells the two apart
  trainer.fit(model, DataLoader(TensorDataset{batch.data, batch.target},
                                DataLoaderOptions().batch_size(2)));
  const auto logged = read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss");
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NEAR(logged[0], expected, 1e-5);
}

// A user's own tiny model learns a rule (each token's successor is the next id) through the
// class, logging train_loss and val_loss, and test_loss when tested.
TEST_F(LanguageModelFit, AModelOfOnesOwnLearnsAndLogsItsLosses) {
  Trainer trainer(
      TrainerOptions().max_epochs(6).log_every_n_steps(2).default_root_dir(dir).enable_progress_bar(
          false));
  torch::manual_seed(1);
  LanguageModel model(tiny_model(), LanguageModelOptions().lr(3e-2).warmup_steps(2));
  const auto data = torch::randint(0, kVocabulary, {64, kLength}, torch::kInt64);
  const TensorDataset windows{data, (data + 1) % kVocabulary};
  const DataLoader loader(windows, DataLoaderOptions().batch_size(16).shuffle(true));
  const DataLoader val_loader(windows, DataLoaderOptions().batch_size(32));
  trainer.fit(model, loader, &val_loader);
  const auto losses = read_csv_column(trainer.log_dir() + "/metrics.csv", "train_loss");
  ASSERT_GE(losses.size(), 2u);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  ASSERT_EQ(trainer.callback_metrics().count("val_loss"), 1u);
  EXPECT_LT(trainer.callback_metrics().at("val_loss"), 0.5 * losses.front());
  const auto tested = trainer.test(model, val_loader);
  ASSERT_EQ(tested.count("test_loss"), 1u);
  EXPECT_NEAR(tested.at("test_loss"), trainer.callback_metrics().at("val_loss"), 1e-4);
}

}  // namespace
}  // namespace pipetrain::testing::language_model_test
