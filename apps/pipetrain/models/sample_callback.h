// Samples while training (`fit --sample-prompts FILE`), as nanoGPT and llm.c print them: at the
// end of every validation, rank 0 continues each prompt greedily for a few tokens with the model
// as it stands (nn::generate), prints the text and logs it to TensorBoard's Text tab (tags
// sample_0, sample_1, ... at the global step).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pipetrain/callback.h>

#include "models/models.h"

namespace pipetrain::cli {

// The callback for `model` (llama or qwen3), its prompts read from `prompts_file` (one a line,
// or JSONL {"prompt": ...}) and encoded by the model's tokenizer: the tokenizer.json of
// --init-from's folder, else the one tokenizer_info.json beside --train-data names. Throws
// std::invalid_argument for another model, no tokenizer found, or no prompts. The callback
// refuses, when fit starts, a process that does not hold the whole model (a pipeline's stages
// over several processes).
std::shared_ptr<Callback> sample_callback(const ModelOptions& model,
                                          const std::string& prompts_file, int64_t new_tokens);

}  // namespace pipetrain::cli
