// The built-in models the `pipetrain` command trains, each with the data it trains on, so a
// newcomer sees a run work without writing code.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <pipetrain/data.h>
#include <pipetrain/module.h>

namespace pipetrain::cli {

struct ModelOptions {
  std::string name = "mlp";
  double lr = 0.001;
  double dropout = 0.0;
};

std::vector<std::string> model_names();
// Builds the model (draws its initial weights from the default generator).
std::unique_ptr<Module> make_model(const ModelOptions& options);
// The model's training data; the same on every rank and every run.
TensorDataset make_train_data(const std::string& model);

}  // namespace pipetrain::cli
