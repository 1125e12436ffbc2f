// The built-in models the `pipetrain` command trains, each with the data it trains and validates
// on, so a newcomer sees a run work without writing code.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pipetrain/data.h>
#include <pipetrain/module.h>

#include "models/gpt.h"

namespace pipetrain::cli {

struct ModelOptions {
  std::string name = "mlp";
  double lr = 0.003;
  double dropout = 0.0;
  std::string corpus;  // gpt: a text file; empty: /usr/share/common-licenses
};

struct BuiltInModel {
  std::unique_ptr<Module> module;
  TensorDataset train;
  TensorDataset val;
  std::optional<CharVocabulary> vocabulary;  // gpt only
};

std::vector<std::string> model_names();
// Builds the model (its initial weights come from the default generator) and its data (the same
// on every rank and every run).
BuiltInModel make_model(const ModelOptions& options);

}  // namespace pipetrain::cli
