#include "support/trainer_run.h"

#include <gtest/gtest.h>

#include <torch/torch.h>
#include <cmath>

#include "pipetrain/model_checkpoint.h"
#include "pipetrain/safetensors.h"

namespace pipetrain::testing {

TrainerOptions logged_run_options(const std::string& root) {
  return TrainerOptions()
      .log_every_n_steps(1)
      .loggers({"csv"})
      .enable_progress_bar(false)
      .default_root_dir(root)
      .callbacks({std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions().dirpath(root + "/checkpoints").save_last(true).save_top_k(0))});
}

void save_local_tensors(const Module& module, const std::string& path) {
  TensorMap mine;
  for (const auto& item : module.local_layers()->named_parameters()) {
    mine[item.key()] = item.value().detach().clone();
  }
  for (const auto& item : module.local_layers()->named_buffers()) {
    mine[item.key()] = item.value().detach().clone();
  }
  save_safetensors(path, mine);
}

void expect_same_weights(const std::string& expected_path, const std::string& actual_path,
                         double tolerance) {
  expect_same_weights(load_safetensors(expected_path), load_safetensors(actual_path), tolerance);
}

void expect_same_weights(const TensorMap& expected, const TensorMap& actual, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.count(name)) << name;
    const auto difference = (actual.at(name).to(torch::kDouble) - tensor.to(torch::kDouble)).abs();
    EXPECT_TRUE(difference.numel() == 0 || difference.max().item<double>() <= tolerance)
        << name << " differs by " << difference.max().item<double>();
  }
}

void expect_same_losses(const std::vector<double>& expected, const std::vector<double>& actual,
                        double relative) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], relative * std::abs(expected[i])) << "step " << i;
  }
}

}  // namespace pipetrain::testing
