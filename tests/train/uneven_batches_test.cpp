// Data that does not split evenly over replicas, against one process on the same data: what
// validate, test and predict return must cover every row once, whatever the layout.
#include <gtest/gtest.h>
#include <pipetrain/pipetrain.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "support/multiprocess.h"

namespace pipetrain::testing::uneven_batches_test {
namespace {

namespace fs = std::filesystem;

// y = 1.5 x + 0.25 against targets 2x: every row's error differs, so a row left out shows.
class Line : public Module {
 public:
  Line() : Module(torch::nn::Sequential(torch::nn::Linear(1, 1))) {
    torch::NoGradGuard no_grad;
    for (auto& p : layers()->named_parameters()) {
      p.value().fill_(p.key().find("weight") != std::string::npos ? 1.5 : 0.25);
    }
  }
  at::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::mse_loss(forward(batch.data), batch.target);
  }
  void validation_step(const Batch& batch, int64_t) override {
    log("val_loss", torch::mse_loss(forward(batch.data), batch.target));
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};

// `rows` rows in batches of 2 per replica.
DataLoader rows_of(int64_t rows) {
  const auto x = torch::arange(rows, torch::kFloat32).unsqueeze(1);
  return DataLoader(TensorDataset(x, 2 * x), DataLoaderOptions().batch_size(2));
}

TrainerOptions quiet(const std::string& strategy, int64_t devices, const std::string& root) {
  return TrainerOptions()
      .strategy(strategy)
      .devices(devices)
      .loggers({})
      .enable_progress_bar(false)
      .default_root_dir(root);
}

// Validates and predicts on `rows` rows; rank 0 writes val_loss and the predictions to `path`.
void evaluate(const std::string& strategy, int64_t devices, int64_t rows, const std::string& path) {
  Trainer trainer(quiet(strategy, devices, fs::path(path).parent_path().string()));
  Line model;
  const auto loader = rows_of(rows);
  const auto metrics = trainer.validate(model, loader);
  const auto predictions = trainer.predict(model, loader);
  if (!trainer.is_global_zero()) return;
  save_safetensors(path, {{"val_loss", torch::tensor(metrics.at("val_loss"), torch::kFloat64)},
                          {"predictions", torch::cat(predictions)}});
}

PIPETRAIN_WORKER(uneven_evaluation_worker) {
  evaluate(env_or("UNEVEN_STRATEGY", "ddp"), std::stoll(env_or("UNEVEN_DEVICES", "2")),
           std::stoll(env_or("UNEVEN_ROWS", "5")), env_or("UNEVEN_OUT", ""));
}

class UnevenBatches : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  std::string dir = make_temp_dir("uneven-batches");
};

// 5 rows in global batches of 2 x 2: the last global batch has one row, fewer than the replicas.
// One process validates and predicts all 5; so must two replicas, not silently leave the fifth row
// out; nor may two replicas given a single row return nothing.
TEST_F(UnevenBatches, ValidateAndPredictCoverEveryRowUnderDataParallelism) {
  struct Case {
    int devices;
    int64_t rows;
  };
  for (const Case& c : {Case{2, 5}, Case{3, 5}, Case{2, 1}}) {
    const std::string name = std::to_string(c.devices) + "-" + std::to_string(c.rows);
    SCOPED_TRACE("ddp on " + std::to_string(c.devices) + " devices, " + std::to_string(c.rows) +
                 " rows");
    const std::string single = dir + "/single-" + name + ".safetensors";
    evaluate("single", 1, c.rows, single);
    const auto expected = load_safetensors(single);
    ASSERT_EQ(expected.at("predictions").size(0), c.rows);
    const std::string out = dir + "/ddp-" + name + ".safetensors";
    ASSERT_EQ(run_ranks(c.devices, "uneven_evaluation_worker",
                        {{"UNEVEN_STRATEGY", "ddp"},
                         {"UNEVEN_DEVICES", std::to_string(c.devices)},
                         {"UNEVEN_ROWS", std::to_string(c.rows)},
                         {"UNEVEN_OUT", out}}),
              0);
    const auto actual = load_safetensors(out);
    EXPECT_NEAR(actual.at("val_loss").item<double>(), expected.at("val_loss").item<double>(), 1e-6);
    ASSERT_EQ(actual.at("predictions").sizes(), expected.at("predictions").sizes());
    EXPECT_TRUE(torch::allclose(actual.at("predictions"), expected.at("predictions")));
  }
}

}  // namespace
}  // namespace pipetrain::testing::uneven_batches_test
