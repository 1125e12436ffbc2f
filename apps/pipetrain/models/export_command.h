// `pipetrain export`: a checkpoint's weights as the Hugging Face folder of its model (gpt2, llama,
// qwen3), which transformers' from_pretrained reads.
#pragma once

#include <string>

#include <pipetrain/trainer_options.h>

#include "models/models.h"

namespace pipetrain::cli {

// `pipetrain export`'s flags.
struct ExportOptions {
  std::string format = "hf", ckpt_path, output, dtype = "bf16", max_shard_size = "5GB";
  std::string default_root_dir = TrainerOptions().default_root_dir();
  ModelOptions model = [] {
    ModelOptions gpt2;
    gpt2.name = "gpt2";
    return gpt2;
  }();
  bool model_given = false;  // --model given, rather than the run's config.json's
  bool overwrite = false;
};

// Writes the folder --output names. Throws std::invalid_argument for flags that do not fit the
// checkpoint's model, and for an --output that holds a checkpoint or files no export writes
// (unless --overwrite).
void export_checkpoint(const ExportOptions& options);

}  // namespace pipetrain::cli
