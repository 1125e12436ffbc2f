// What tests that train a user's model through the Trainer share: a run that logs every step to
// CSV and keeps last.ckpt, each rank's own tensors written out, and weights compared.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/module.h"
#include "pipetrain/safetensors.h"
#include "pipetrain/trainer_options.h"

namespace pipetrain::testing {

// Options for a run under `root`: train_loss per step in <root>/lightning_logs/version_0/
// metrics.csv (CSV only, no progress bar) and <root>/checkpoints/last.ckpt at every epoch's end.
TrainerOptions logged_run_options(const std::string& root);

// The parameters (and buffers) of the layers this rank holds, under their global names, to
// `path` as safetensors.
void save_local_tensors(const Module& module, const std::string& path);

// The safetensors files hold the same names with values within `tolerance` (absolute).
void expect_same_weights(const std::string& expected_path, const std::string& actual_path,
                         double tolerance);
void expect_same_weights(const TensorMap& expected, const TensorMap& actual, double tolerance);

// As many losses, each within `relative` of the expected one (named by its step on failure).
void expect_same_losses(const std::vector<double>& expected, const std::vector<double>& actual,
                        double relative);

}  // namespace pipetrain::testing
