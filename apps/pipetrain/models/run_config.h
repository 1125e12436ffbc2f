// The config.json fit keeps in a run's folder beside its checkpoints (gpt2, llama, qwen3): the
// model family and the shape a checkpoint's tensors do not say (heads, RoPE, norms), so that what
// reads a checkpoint back (a resume, validate, test, predict, export) builds the model it trained.
#pragma once

#include <string>

#include "models/models.h"

namespace pipetrain::cli {

// The run folder holding the config.json fit wrote for `checkpoint` (the folder above its
// checkpoints/ folder; "last.ckpt/" as a shell completes it too); empty where there is none.
std::string run_config_dir(const std::string& checkpoint);

// The model_type of `dir`/config.json ("gpt2", "llama", "qwen3"). Throws std::invalid_argument
// naming the file when it is not a JSON object with a model_type string.
std::string read_model_type(const std::string& dir);

// `options` for a model that reads `checkpoint` (a checkpoint's path; "" for none): where its run
// kept a config.json, the model is that run's: its family (options.name, unless `name_given`) and
// its shape, read from there (shape_from), which shape flags may only repeat. Throws
// std::invalid_argument when `name_given` and the run trained another family.
ModelOptions with_run_shape(ModelOptions options, bool name_given, const std::string& checkpoint);

}  // namespace pipetrain::cli
