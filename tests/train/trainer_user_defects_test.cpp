// The Trainer as a user's own program meets it: only <pipetrain/pipetrain.h>, a Module and data of
// the program's own, one process. Each test is a defect users ran into: a checkpoint saved after
// fit() or inside an accumulation window that resumed differently, a batch hook that saw no loss
// inside an accumulation window, callback metrics that stayed empty between logging steps, and
// weights that recomputed micro-batches under bf16-mixed left without gradients.
#include <gtest/gtest.h>
#include <pipetrain/pipetrain.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipetrain::testing::trainer_user_defects_test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 24, kBatchSize = 4;  // 6 batches an epoch

// A directory of its own for a test's runs, removed with it.
class TempDir {
 public:
  TempDir() {
    std::string name = (fs::temp_directory_path() / "pipetrain-user-XXXXXX").string();
    if (mkdtemp(name.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + name);
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Regression by Adam, whose learning rate a scheduler halves every 2 steps: a resumed run needs
// the moments, the scheduler's position and the data's to train as an uninterrupted one. Records
// each batch's loss as training_step returned it.
class Regression : public Module {
 public:
  Regression()
      : Module(torch::nn::Sequential(torch::nn::Linear(3, 8), torch::nn::Tanh(),
                                     torch::nn::Linear(8, 1))) {}
  explicit Regression(torch::nn::Sequential layers) : Module(std::move(layers)) {}
  explicit Regression(std::vector<LayerSpec> layers) : Module(std::move(layers)) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    losses.push_back(loss.item<double>());
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    OptimizerConfig config =
        std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.05));
    config.lr_scheduler = std::make_unique<StepLR>(*config.optimizer, 2, 0.5);
    config.interval = "step";
    return config;
  }
  std::vector<double> losses;
};

DataLoader shuffled_data() {
  torch::manual_seed(3);
  const auto x = torch::randn({kRows, 3});
  return DataLoader(TensorDataset(x, x.sum(1, true).tanh()),
                    DataLoaderOptions().batch_size(kBatchSize).shuffle(true).seed(5));
}

TrainerOptions quiet_options(const std::string& root) {
  return TrainerOptions()
      .strategy("single")
      .max_epochs(100)
      .loggers({})
      .enable_progress_bar(false)
      .enable_checkpointing(false)
      .num_sanity_val_steps(0)
      .default_root_dir(root);
}

// What on_train_batch_end saw, batch by batch.
class BatchEndRecorder : public Callback {
 public:
  void on_train_batch_end(Trainer& trainer, Module&, const TrainBatchOutputs& outputs, const Batch&,
                          int64_t batch_idx) override {
    batches.push_back(batch_idx);
    steps.push_back(trainer.global_step());
    losses.push_back(outputs.loss.defined() ? outputs.loss.item<double>() : std::nan(""));
    const auto& metrics = trainer.callback_metrics();
    const auto logged = metrics.find("train_loss");
    train_loss_metric.push_back(logged == metrics.end() ? std::nan("") : logged->second);
  }
  std::vector<int64_t> batches, steps;
  std::vector<double> losses, train_loss_metric;
};

// A fit of a Regression (built after its Trainer) under `options`, a BatchEndRecorder its callback.
struct RecordedFit {
  std::shared_ptr<BatchEndRecorder> seen = std::make_shared<BatchEndRecorder>();
  std::vector<double> losses;                      // the model's, as training_step returned them
  std::map<std::string, double> callback_metrics;  // the Trainer's, after fit()
};

RecordedFit fit_recording_batch_ends(TrainerOptions options) {
  RecordedFit fit;
  Trainer trainer(options.callbacks({fit.seen}));
  Regression model;
  trainer.fit(model, shuffled_data());
  fit.losses = model.losses;
  fit.callback_metrics = trainer.callback_metrics();
  return fit;
}

// `run` throws std::invalid_argument saying `words`.
void expect_refused(const std::function<void()>& run, const std::string& words) {
  try {
    run();
    ADD_FAILURE() << "not refused: " << words;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

// The resumed fit trained the straight fit's batches from batch `from` on, bit for bit, and ends
// with its weights.
void expect_resumed_as_straight(const Regression& straight, const Regression& resumed,
                                size_t from) {
  const std::vector<double> tail(straight.losses.begin() + static_cast<std::ptrdiff_t>(from),
                                 straight.losses.end());
  EXPECT_EQ(resumed.losses, tail);
  const auto expected = straight.layers()->parameters();
  const auto actual = resumed.layers()->parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::equal(actual[i], expected[i]));
}

// A Regression fit 5 steps (built after its Trainer, which seeds the generator: the same initial
// weights in every test), then saved, once fit() has returned, as `dir`/after-fit.ckpt.
std::unique_ptr<Regression> fit_five_steps_and_save(const TempDir& dir, const DataLoader& loader) {
  Trainer run(quiet_options(dir / "first").max_steps(5));
  auto model = std::make_unique<Regression>();
  run.fit(*model, loader);
  run.save_checkpoint(dir / "after-fit.ckpt");
  return model;
}

// A checkpoint saved once fit() has returned holds all a resumed fit needs (Adam's moments, the
// scheduler's steps, where the data stood): fit 5 steps, save, resume to 8 in a new Trainer; its
// losses and weights are bit for bit those of 8 uninterrupted steps (CPU, fp32, the same
// arithmetic in the same order).
TEST(TrainerUserDefects, CheckpointSavedAfterFitResumesAsIfFitHadNeverStopped) {
  const TempDir dir;
  const auto loader = shuffled_data();
  // Each model is built after its Trainer, which seeds the generator: the same initial weights.
  Trainer straight_run(quiet_options(dir / "straight").max_steps(8));
  Regression straight;
  straight_run.fit(straight, loader);

  const auto first = fit_five_steps_and_save(dir, loader);

  Trainer resumed_run(quiet_options(dir / "resumed").max_steps(8));
  Regression resumed;
  resumed_run.fit(resumed, loader, nullptr, dir / "after-fit.ckpt");
  EXPECT_EQ(resumed_run.global_step(), 8);

  EXPECT_EQ(std::vector<double>(straight.losses.begin(), straight.losses.begin() + 5),
            first->losses);
  expect_resumed_as_straight(straight, resumed, 5);
}

// Regression with a validation loss.
class ValidatedRegression : public Regression {
 public:
  using Regression::Regression;
  void validation_step(const Batch& batch, int64_t) override {
    log("val_loss", torch::mse_loss(forward(batch.data), batch.target));
  }
};

// Saves a checkpoint at the first validation's end, as a user's callback might.
class SaveAtFirstValidation : public Callback {
 public:
  explicit SaveAtFirstValidation(std::string path) : path_(std::move(path)) {}
  void on_validation_end(Trainer& trainer, Module&) override {
    if (saved_batch < 0) {
      trainer.save_checkpoint(path_);
      saved_batch = trainer.fit_progress().batch_idx;
    }
  }
  int64_t saved_batch = -1;

 private:
  std::string path_;
};

// Fits 6 steps in windows of 2 batches under `setting`, saving at the first validation's end
// (after batch `saved_after`) as `dir`/`name`, then resumes a new Trainer from it: it trains the
// straight fit's batches from batch `resumes_at` on and ends as it does.
void expect_saved_at_first_validation_resumes(
    const TempDir& dir, const std::function<TrainerOptions(TrainerOptions)>& setting,
    const std::string& name, int64_t saved_after, size_t resumes_at) {
  const auto options = [&](const std::string& root) {
    return setting(quiet_options(dir / root).max_steps(6).accumulate_grad_batches(2));
  };
  const auto loader = shuffled_data();
  auto saver = std::make_shared<SaveAtFirstValidation>(dir / name);
  Trainer straight_run(options("straight").callbacks({saver}));
  ValidatedRegression straight;
  straight_run.fit(straight, loader, &loader);
  ASSERT_EQ(saver->saved_batch, saved_after);

  Trainer resumed_run(options("resumed"));
  ValidatedRegression resumed;
  resumed_run.fit(resumed, loader, &loader, dir / name);
  EXPECT_EQ(resumed_run.global_step(), 6);
  expect_resumed_as_straight(straight, resumed, resumes_at);
}

// A checkpoint saved inside an accumulation window (a validation every 3 batches, windows of 2)
// holds the weights from before the window and not the gradients it had accumulated: the resumed
// fit runs the whole window again and ends with the weights of an uninterrupted fit (it once
// resumed after the window's first batch and stepped on the second alone). A run that would
// start a window elsewhere (windows of 4 from batch 2) is refused.
TEST(TrainerUserDefects, CheckpointSavedInsideAnAccumulationWindowResumesTheWholeWindow) {
  const TempDir dir;
  const auto loader = shuffled_data();  // 6 batches an epoch
  const auto every_third_batch = [](TrainerOptions options) {
    return options.val_check_interval(BatchLimit::count(3));
  };
  // Saved after batches 0-2, inside the window of batches 2 and 3: resumed from batch 2.
  expect_saved_at_first_validation_resumes(dir, every_third_batch, "mid-window.ckpt", 3, 2);

  Trainer other_windows(
      every_third_batch(quiet_options(dir / "other").max_steps(6).accumulate_grad_batches(4)));
  ValidatedRegression refused;
  expect_refused([&] { other_windows.fit(refused, loader, &loader, dir / "mid-window.ckpt"); },
                 "at batch 2, which does not start an accumulation window of 4 batches");
}

// An epoch cut short by limit_train_batches (3 of 6 batches) ends in an accumulation window of one
// batch; a checkpoint saved at the validation after it once resumed at that window's first
// batch, as if inside a window, and trained it (and stepped) a second time.
TEST(TrainerUserDefects, CheckpointAfterAnEpochCutByLimitTrainBatchesResumesAtTheNextEpoch) {
  const TempDir dir;  // 6 batches an epoch (shuffled_data), 3 of them trained
  // Saved after the epoch's 3 batches, before its end: resumed from the next epoch's first.
  expect_saved_at_first_validation_resumes(
      dir, [](TrainerOptions options) { return options.limit_train_batches(BatchLimit::count(3)); },
      "epoch-end.ckpt", 3, 3);
}

// Counts the rows validation saw and logs the count at the epoch's end, as Lightning's users log
// what they gathered over an epoch from on_validation_epoch_end.
class CountsValidationRows : public ValidatedRegression {
 public:
  void on_validation_epoch_start() override { rows = 0; }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    ValidatedRegression::validation_step(batch, batch_idx);
    rows += batch.data.size(0);
  }
  void on_validation_epoch_end() override { log("val_rows", static_cast<double>(rows)); }
  int64_t rows = 0;
};

// A value log()ged from on_validation_epoch_end is one of the validation's metrics, as in
// Lightning; it was dropped without a word.
TEST(TrainerUserDefects, ValuesLoggedAtTheValidationEpochsEndAreMetrics) {
  const TempDir dir;
  Trainer trainer(quiet_options(dir / "run"));
  CountsValidationRows model;
  const auto metrics = trainer.validate(model, shuffled_data());
  ASSERT_TRUE(metrics.count("val_loss"));
  ASSERT_TRUE(metrics.count("val_rows"));
  EXPECT_EQ(metrics.at("val_rows"), static_cast<double>(kRows));
}

// Counts the batches an epoch trained and logs the count at the epoch's end, and the epoch's
// number at its start, as Lightning's users log from on_train_epoch_start/end.
class CountsTrainingBatches : public Regression {
 public:
  void on_train_epoch_start() override {
    batches = 0;
    log("epoch_begun", static_cast<double>(epochs++));
  }
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    ++batches;
    return Regression::training_step(batch, batch_idx);
  }
  void on_train_epoch_end() override {
    log("batches_seen", static_cast<double>(batches), LogOptions().on_step(per_step));
  }
  int64_t batches = 0, epochs = 0;
  bool per_step = false;
};

// What the callback_metrics held at each epoch's end, where ModelCheckpoint and EarlyStopping
// read what they monitor.
class EpochEndRecorder : public Callback {
 public:
  void on_train_epoch_end(Trainer& trainer, Module&) override {
    metrics.push_back(trainer.callback_metrics());
  }
  std::vector<std::map<std::string, double>> metrics;
};

// Values log()ged from on_train_epoch_start/end are the epoch's metrics, seen by the callbacks'
// epoch-end hooks (they were dropped without a word); asking for them per step is refused.
TEST(TrainerUserDefects, ValuesLoggedAtTheTrainingEpochsStartAndEndAreMetrics) {
  const TempDir dir;
  auto recorder = std::make_shared<EpochEndRecorder>();
  Trainer trainer(quiet_options(dir / "run").max_epochs(2).callbacks({recorder}));
  CountsTrainingBatches model;
  trainer.fit(model, shuffled_data());
  ASSERT_EQ(recorder->metrics.size(), 2u);
  for (size_t epoch = 0; epoch < 2; ++epoch) {
    const auto& metrics = recorder->metrics[epoch];
    ASSERT_TRUE(metrics.count("batches_seen")) << "epoch " << epoch;
    ASSERT_TRUE(metrics.count("epoch_begun")) << "epoch " << epoch;
    EXPECT_EQ(metrics.at("batches_seen"), static_cast<double>(kRows / kBatchSize));
    EXPECT_EQ(metrics.at("epoch_begun"), static_cast<double>(epoch));
  }

  Trainer refusing(quiet_options(dir / "refused").max_epochs(1));
  CountsTrainingBatches per_step;
  per_step.per_step = true;
  expect_refused([&] { refusing.fit(per_step, shuffled_data()); },
                 "log(\"batches_seen\") with on_step(true) in an epoch's hook");
}

// Validating every 7 batches of an epoch of 6 would never validate: refused, naming both.
TEST(TrainerUserDefects, AValidationIntervalLongerThanTheEpochIsRefused) {
  const TempDir dir;
  const auto loader = shuffled_data();
  Trainer trainer(
      quiet_options(dir / "run").max_epochs(1).val_check_interval(BatchLimit::count(7)));
  Regression model;
  expect_refused([&] { trainer.fit(model, loader, &loader); },
                 "val_check_interval 7 is more than the epoch's 6 training batches");
}

// A fraction of the batches that comes to none of them (0.1 of 6) trained 1000 empty epochs, or
// skipped validation, without a word: refused, naming the option and the least fraction that
// keeps a batch, as Lightning refuses it. A fraction of 0.0 still skips on purpose.
TEST(TrainerUserDefects, ABatchFractionThatLeavesNoBatchIsRefused) {
  const TempDir dir;
  const auto loader = shuffled_data();  // 6 batches an epoch
  Trainer training(quiet_options(dir / "train").limit_train_batches(BatchLimit::fraction(0.1)));
  Regression model;
  expect_refused([&] { training.fit(model, loader); },
                 "limit_train_batches 0.1 of the 6 batches there are is none of them");

  Trainer validating(quiet_options(dir / "val").limit_val_batches(BatchLimit::fraction(0.1)));
  ValidatedRegression validated;
  expect_refused([&] { validating.fit(validated, loader, &loader); },
                 "limit_val_batches 0.1 of the 6 batches there are is none of them");
  expect_refused([&] { validating.validate(validated, loader); }, "limit_val_batches 0.1");

  Trainer skipping(
      quiet_options(dir / "skip").max_epochs(1).limit_val_batches(BatchLimit::fraction(0.0)));
  ValidatedRegression skipped;
  EXPECT_NO_THROW(skipping.fit(skipped, loader, &loader));
  EXPECT_EQ(skipped.losses.size(), 6u);
}

// Logs from a Callback's epoch end through the module, as Lightning's callbacks call
// pl_module.log().
class LogsThroughTheModule : public Callback {
 public:
  void on_train_epoch_end(Trainer&, Module& module) override { module.log("from_callback", 1.0); }
};

// Regression that logs from predict_step.
class LogsWhilePredicting : public Regression {
 public:
  at::Tensor predict_step(const Batch& batch, int64_t batch_idx) override {
    log("predicted_rows", static_cast<double>(batch.data.size(0)));
    return Regression::predict_step(batch, batch_idx);
  }
};

// log() where nothing records it (a Callback's hook, predict_step) dropped the value without a
// word: refused, naming the value and where log() records.
TEST(TrainerUserDefects, ALogWithNowhereToGoIsRefusedNotDropped) {
  const TempDir dir;
  const auto loader = shuffled_data();
  Trainer from_callback(quiet_options(dir / "callback")
                            .max_epochs(1)
                            .callbacks({std::make_shared<LogsThroughTheModule>()}));
  Regression model;
  expect_refused([&] { from_callback.fit(model, loader); },
                 "log(\"from_callback\") here has nowhere to go");

  Trainer predicting(quiet_options(dir / "predict"));
  LogsWhilePredicting predictor;
  expect_refused([&] { predicting.predict(predictor, loader); },
                 "log(\"predicted_rows\") here has nowhere to go");

  // A step called by hand on a module no Trainer has set up warns, as Lightning's, and goes on.
  Regression by_hand;
  const Batch batch{torch::randn({4, 3}), torch::randn({4, 1})};
  EXPECT_NO_THROW(by_hand.training_step(batch, 0));
}

// Regression whose optimizer trains the last layer alone (a head fine-tuned), the first layer's
// weights still requiring gradients.
class HeadOnlyRegression : public Regression {
 public:
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(layers()->ptr(2)->parameters(),
                                               torch::optim::SGDOptions(0.1));
  }
};

// Clipping by norm covers the optimizer's parameters, as Lightning's clip_gradients does: the
// first layer's gradients (never stepped, never cleared by the optimizer's zero_grad) counted in
// the norm and grew step by step, shrinking the head's updates without a word. The head trains as
// a plain LibTorch loop clipping the optimizer's parameters trains it.
TEST(TrainerUserDefects, ClippingCoversTheOptimizersParametersAlone) {
  const TempDir dir;
  torch::manual_seed(3);
  const auto x = torch::randn({kRows, 3});
  const auto y = x.sum(1, true).tanh();
  const DataLoader loader(TensorDataset(x, y), DataLoaderOptions().batch_size(kBatchSize));
  constexpr double kClip = 0.05;
  Trainer trainer(
      quiet_options(dir / "run").max_steps(kRows / kBatchSize).gradient_clip_val(kClip));
  HeadOnlyRegression model;

  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model.layers()->clone());
  torch::optim::SGD sgd(reference->ptr(2)->parameters(), torch::optim::SGDOptions(0.1));
  for (int64_t first = 0; first < kRows; first += kBatchSize) {
    const auto rows = torch::indexing::Slice(first, first + kBatchSize);
    torch::mse_loss(reference->forward(x.index({rows})), y.index({rows})).backward();
    torch::nn::utils::clip_grad_norm_(sgd.param_groups()[0].params(), kClip);
    sgd.step();
    sgd.zero_grad();
  }

  trainer.fit(model, loader);
  const auto trained = model.layers()->ptr(2)->parameters();
  const auto expected = reference->ptr(2)->parameters();
  ASSERT_EQ(trained.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(trained[i], expected[i], 1e-5, 1e-7))
        << "head parameter " << i << " differs by "
        << (trained[i] - expected[i]).abs().max().item<double>();
  }
}

// A fit of 5 steps, saved, resumed to 8 by a `Resumed` model, is refused saying `words`.
template <typename Resumed>
void expect_resume_refused(const std::string& words) {
  const TempDir dir;
  const auto loader = shuffled_data();
  fit_five_steps_and_save(dir, loader);
  Trainer resumed_run(quiet_options(dir / "resumed").max_steps(8));
  Resumed resumed;
  expect_refused([&] { resumed_run.fit(resumed, loader, nullptr, dir / "after-fit.ckpt"); }, words);
}

// Regression whose learning rate halves every 3 steps, not 2.
class RegressionOfSlowerDecay : public Regression {
 public:
  OptimizerConfig configure_optimizers() override {
    OptimizerConfig config = Regression::configure_optimizers();
    config.lr_scheduler = std::make_unique<StepLR>(*config.optimizer, 3, 0.5);
    return config;
  }
};

// A checkpoint holds its scheduler's step count; a resume under a schedule of other rates at that
// step (the user's own StepLR, changed between the runs) would jump from 0.0125 to 0.025, and is
// refused, naming both.
TEST(TrainerUserDefects, AResumeUnderAnotherScheduleIsRefusedNotJumped) {
  expect_resume_refused<RegressionOfSlowerDecay>(
      "with learning rates 0.0125, and this run's schedule gives 0.025 there");
}

// Regression at Adam's constant rate: no scheduler.
class RegressionAtAConstantRate : public Regression {
 public:
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.05));
  }
};

// A resume without the scheduler the checkpoint was trained with (the command's default
// --lr-schedule constant, forgotten on the resume of a decaying run) once trained on at the
// optimizer's own 0.05 where the run had stopped at 0.0125; it is refused as another schedule is.
TEST(TrainerUserDefects, AResumeWithoutTheCheckpointsSchedulerIsRefusedNotJumped) {
  expect_resume_refused<RegressionAtAConstantRate>(
      "with learning rates 0.0125, and this run's schedule gives 0.05 there");
}

// A layer whose weight is another layer's tensor (an output head tied to its embedding).
class SharedWeightImpl : public torch::nn::Module {
 public:
  explicit SharedWeightImpl(const at::Tensor& shared) {
    weight = register_parameter("weight", shared);
  }
  at::Tensor forward(const at::Tensor& x) { return torch::matmul(x, weight.t()); }
  at::Tensor weight;
};
TORCH_MODULE(SharedWeight);

// Regression through two uses of one 3 x 3 matrix, which the user froze, by AdamW with weight
// decay over parameters() (AdamW, as in PyTorch, steps only parameters with a gradient).
class RegressionWithAFrozenTie : public Regression {
 public:
  RegressionWithAFrozenTie() : Regression(frozen_tie()) {}
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::AdamW>(
        parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  }
  static torch::nn::Sequential frozen_tie() {
    torch::nn::Linear first(3, 3);
    torch::nn::Sequential layers(first, torch::nn::Tanh(), SharedWeight(first->weight),
                                 torch::nn::Linear(3, 1));
    first->weight.set_requires_grad(false);  // after register_parameter, which sets it
    return layers;
  }
};

// A frozen parameter registered in two layers (a tie) once got a gradient of zeros at every step
// from the tied parameters' reduction, so the optimizer stepped it: AdamW's weight decay shrank
// the frozen matrix.
TEST(TrainerUserDefects, AFrozenTiedParameterStaysAsItWas) {
  const TempDir dir;
  Trainer run(quiet_options(dir / "frozen").max_steps(3));
  RegressionWithAFrozenTie model;
  const auto frozen = model.layers()->named_parameters()["0.weight"];
  const auto before = frozen.clone();
  run.fit(model, shuffled_data());
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_TRUE(torch::equal(frozen, before));
}

// A model built per rank is built by the first Trainer that sets it up; a second Trainer of the
// same layout evaluates the trained layers, not layers built afresh, and another layout is
// refused rather than rebuilt.
class RegressionBuiltPerRank : public ValidatedRegression {
 public:
  RegressionBuiltPerRank()
      : ValidatedRegression(std::vector<LayerSpec>{layer([] { return torch::nn::Linear(3, 8); }),
                                                   layer([] { return torch::nn::Tanh(); }),
                                                   layer([] { return torch::nn::Linear(8, 1); })}) {
  }
};

TEST(TrainerUserDefects, AModelBuiltPerRankKeepsItsTrainedLayersUnderASecondTrainer) {
  const TempDir dir;
  const auto loader = shuffled_data();
  RegressionBuiltPerRank model;
  Trainer first(quiet_options(dir / "first").max_steps(5));
  first.fit(model, loader);
  std::vector<at::Tensor> trained;
  for (const auto& p : model.layers()->parameters()) trained.push_back(p.detach().clone());
  ASSERT_EQ(trained.size(), 4u);
  Trainer second(quiet_options(dir / "second"));
  const auto metrics = second.validate(model, loader);
  ASSERT_FALSE(metrics.empty());
  const auto now = model.layers()->parameters();
  ASSERT_EQ(now.size(), trained.size());
  for (size_t i = 0; i < trained.size(); ++i) EXPECT_TRUE(torch::equal(now[i], trained[i]));
  try {
    model.build_layers({true, true, false}, 0);
    ADD_FAILURE() << "another layout was built afresh";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("built per rank for another layout"), std::string::npos)
        << e.what();
  }
}

// Before any fit there is no optimizer state to save: the save says so instead of writing a
// checkpoint that would resume with a fresh optimizer.
TEST(TrainerUserDefects, CheckpointBeforeAnyFitIsRefusedSayingWhy) {
  const TempDir dir;
  Trainer trainer(quiet_options(dir / "run"));
  try {
    trainer.save_checkpoint(dir / "early.ckpt");
    ADD_FAILURE() << "save_checkpoint before fit() wrote a checkpoint";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("has not run fit()"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "early.ckpt"));
}

// Under gradient accumulation on_train_batch_end runs for every batch, and on every one it gets
// that batch's loss as training_step returned it, not a NaN or nothing on the batches that only
// accumulate; global_step tells the batches that stepped the optimizer.
TEST(TrainerUserDefects, BatchEndHookGetsEveryBatchsLossUnderAccumulation) {
  const TempDir dir;
  const auto fit =
      fit_recording_batch_ends(quiet_options(dir / "run").max_epochs(1).accumulate_grad_batches(2));
  EXPECT_EQ(fit.seen->batches, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(fit.seen->steps, (std::vector<int64_t>{0, 1, 1, 2, 2, 3}));
  ASSERT_EQ(fit.seen->losses.size(), fit.losses.size());
  for (size_t batch = 0; batch < fit.losses.size(); ++batch) {
    EXPECT_TRUE(std::isfinite(fit.seen->losses[batch])) << "batch " << batch;
    EXPECT_EQ(fit.seen->losses[batch], fit.losses[batch]) << "batch " << batch;
  }
}

// callback_metrics holds the latest value of every logged metric after every batch, not only at
// logging steps (here there are none): what EarlyStopping and ModelCheckpoint read.
TEST(TrainerUserDefects, CallbackMetricsHoldTheLatestLoggedValueAfterEveryBatch) {
  const TempDir dir;
  const auto fit =
      fit_recording_batch_ends(quiet_options(dir / "run").max_steps(5).log_every_n_steps(1000));
  EXPECT_EQ(fit.seen->train_loss_metric, fit.losses);
  EXPECT_EQ(fit.callback_metrics.at("train_loss"), fit.losses.back());
}

// Regression by SGD (no Adam to turn a small difference into a sign's), with its parameters'
// values after fit().
class SgdRegression : public Regression {
 public:
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  std::vector<at::Tensor> weights() const {
    std::vector<at::Tensor> values;
    for (const auto& p : layers()->parameters()) values.push_back(p.detach().clone());
    return values;
  }
};

// Under bf16-mixed a micro-batch to be recomputed first runs forward without autograd, and
// autocast's cache kept the bf16 copies of the weights that forward made, copies without a path
// back to the weights: the later micro-batches' forwards and the recompute read them, and the
// weights got no gradient from any micro-batch of the step. A pipe recomputing its first
// micro-batch (checkpoint "except_last") must train as one that keeps every graph ("never"): the
// same arithmetic in the same order.
TEST(TrainerUserDefects, RecomputedMicroBatchesUnderBf16MixedTrainAsWithoutRecomputation) {
  const TempDir dir;
  std::map<std::string, std::vector<at::Tensor>> trained;
  for (const std::string checkpoint : {"never", "except_last"}) {
    Trainer trainer(quiet_options(dir / checkpoint)
                        .strategy("pipe")
                        .precision("bf16-mixed")
                        .max_steps(4)
                        .pipe(PipeOptions().chunks(2).checkpoint(checkpoint)));
    SgdRegression model;
    trainer.fit(model, shuffled_data());
    trained[checkpoint] = model.weights();
  }
  const auto& expected = trained["never"];
  const auto& actual = trained["except_last"];
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(actual[i], expected[i]))
        << "parameter " << i << " differs by "
        << (actual[i] - expected[i]).abs().max().item<double>();
  }
}

// A training score that never improves after the first epoch.
class ConstantScore : public Regression {
 public:
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    log("score", 1.0);
    return Regression::training_step(batch, batch_idx);
  }
};

// EarlyStopping checks at the end of each training epoch unless told otherwise, as Lightning's
// does where validation (if any) runs once at each epoch's end: monitoring a training metric of a
// fit without validation stops it (it never checked, and trained to max_epochs without a word).
TEST(TrainerUserDefects, EarlyStoppingChecksATrainingMetricWithoutValidation) {
  const TempDir dir;
  auto stopper =
      std::make_shared<EarlyStopping>(EarlyStoppingOptions().monitor("score").patience(1));
  Trainer trainer(quiet_options(dir / "run").max_epochs(10).callbacks({stopper}));
  ConstantScore model;
  trainer.fit(model, shuffled_data());
  // Epoch 0 sets the best score, epoch 1 does not improve on it: patience 1 is used up.
  EXPECT_EQ(trainer.current_epoch(), 2);
  EXPECT_EQ(stopper->stopped_epoch(), 1);
}

// Logs "score" as `options` say: 3 in every batch of epoch 0, 1 in epoch 1, 2 after.
class ScoredByEpoch : public Regression {
 public:
  explicit ScoredByEpoch(LogOptions options) : options(std::move(options)) {}
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    const int64_t epoch = batches++ / (kRows / kBatchSize);
    log("score", epoch == 0 ? 3.0 : epoch == 1 ? 1.0 : 2.0, options);
    return Regression::training_step(batch, batch_idx);
  }
  LogOptions options;
  int64_t batches = 0;
};

// A value logged both per step and per epoch is in callback_metrics under its own name too, as
// Lightning's: the step's value after a batch, the epoch's after the epoch. Only "score_step" and
// "score_epoch" were there, so ModelCheckpoint(monitor="score") found nothing and saved no best
// file, with a warning alone.
TEST(TrainerUserDefects, AValueLoggedPerStepAndPerEpochIsMonitoredByItsName) {
  const TempDir dir;
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath(dir / "checkpoints").monitor("score"));
  auto recorder = std::make_shared<EpochEndRecorder>();
  Trainer trainer(quiet_options(dir / "run").max_epochs(3).callbacks({recorder, checkpoint}));
  ScoredByEpoch model(LogOptions().on_step(true).on_epoch(true));
  trainer.fit(model, shuffled_data());
  ASSERT_EQ(recorder->metrics.size(), 3u);
  EXPECT_EQ(recorder->metrics[1].count("score"), 1u);
  EXPECT_EQ(recorder->metrics[1].count("score") ? recorder->metrics[1].at("score") : -1, 1.0);
  EXPECT_EQ(checkpoint->best_model_path(), dir / "checkpoints/epoch=1-step=12.ckpt");
  EXPECT_EQ(checkpoint->best_model_score(), std::optional<double>(1.0));
}

// Where validation runs once at the end of every epoch, ModelCheckpoint saves at the training
// epoch's end, after it, as Lightning's does: a training epoch's value is then the epoch's own.
// It saved at the validation's end, before the epoch's values existed, and refused the fit.
TEST(TrainerUserDefects, ModelCheckpointRanksByATrainingEpochValueWithValidation) {
  const TempDir dir;
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath(dir / "checkpoints").monitor("score"));
  Trainer trainer(quiet_options(dir / "run").max_epochs(3).callbacks({checkpoint}));
  ScoredByEpoch model(LogOptions().on_epoch(true).on_step(false));  // per epoch alone
  const auto loader = shuffled_data();
  trainer.fit(model, loader, &loader);
  EXPECT_EQ(checkpoint->best_model_path(), dir / "checkpoints/epoch=1-step=12.ckpt");
  EXPECT_EQ(checkpoint->best_model_score(), std::optional<double>(1.0));
}

}  // namespace
}  // namespace pipetrain::testing::trainer_user_defects_test
