#include "models/sample_callback.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <pipetrain/layer_spec.h>
#include <pipetrain/module.h>
#include <pipetrain/nn/generate.h>
#include <pipetrain/nn/gpt2.h>
#include <pipetrain/tokenizer.h>
#include <pipetrain/trainer.h>

#include "models/generate_command.h"
#include "models/tokenizer_info.h"

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;

class SampleCallback : public Callback {
 public:
  SampleCallback(Tokenizer tokenizer, std::vector<std::string> prompts, int64_t new_tokens)
      : tokenizer_(std::move(tokenizer)), prompts_(std::move(prompts)) {
    for (size_t i = 0; i < prompts_.size(); ++i) {
      ids_.push_back(tokenizer_.encode(prompts_[i]));
      if (ids_.back().empty()) {
        throw std::invalid_argument("--sample-prompts: prompt " + std::to_string(i + 1) +
                                    " has no tokens: give it some text");
      }
    }
    options_.max_new_tokens(new_tokens);
    if (const auto eos = tokenizer_.eos_token_id()) options_.eos_token_ids({*eos});
  }

  void on_fit_start(Trainer&, Module& module) override {
    const auto layers = module.layers();
    for (size_t i = 0; i < layers->size(); ++i) {
      if (!is_held(layers, static_cast<int64_t>(i))) {
        throw std::invalid_argument(
            "--sample-prompts generates with the whole model in one process, and this one "
            "holds some of its layers alone: sample under --strategy single or ddp (or pipe on "
            "one device)");
      }
    }
    // GPT-2's learned positions bound a prompt and its new tokens: refused now, not at the
    // first validation.
    if (const auto* gpt2 = layers->ptr(0)->as<nn::Gpt2EmbeddingImpl>()) {
      size_t longest = 0;
      for (const auto& ids : ids_) longest = std::max(longest, ids.size());
      const int64_t positions = static_cast<int64_t>(longest) + options_.max_new_tokens() - 1;
      if (positions > gpt2->options.block_size()) {
        throw std::invalid_argument(
            "--sample-prompts: a prompt of " + std::to_string(longest) + " tokens and " +
            std::to_string(options_.max_new_tokens()) + " new ones (--sample-new-tokens) need " +
            std::to_string(positions) + " positions; GPT-2's block size is " +
            std::to_string(gpt2->options.block_size()));
      }
    }
  }

  void on_validation_end(Trainer& trainer, Module& module) override {
    if (!trainer.is_global_zero()) return;
    auto options = options_;
    options.vocab_limit(tokenizer_vocab_limit(module.layers(), tokenizer_));
    const auto made = nn::generate(module.layers(), ids_, options);
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const std::string text = prompts_[i] + decode_generated(tokenizer_, made[i]);
      trainer.print("sample " + std::to_string(i) + " at step " +
                    std::to_string(trainer.global_step()) + ": " + text);
      trainer.log_text("sample_" + std::to_string(i), text, trainer.global_step());
    }
  }

 private:
  Tokenizer tokenizer_;
  std::vector<std::string> prompts_;
  std::vector<std::vector<int64_t>> ids_;
  nn::GenerationOptions options_;
};

// The tokenizer of --init-from's folder, else the one tokenizer_info.json beside the training
// data names; "" where neither is there.
std::string find_tokenizer(const ModelOptions& model) {
  if (!model.init_from.empty() && fs::exists(fs::path(model.init_from) / "tokenizer.json")) {
    return model.init_from;
  }
  const fs::path data(model.train_data);
  return recorded_tokenizer((fs::is_directory(data) ? data : data.parent_path()).string());
}

}  // namespace

std::shared_ptr<Callback> sample_callback(const ModelOptions& model,
                                          const std::string& prompts_file, int64_t new_tokens) {
  if (!is_hub_model(model.name)) {
    throw std::invalid_argument("--sample-prompts: --model " + model.name +
                                " is not generated from; gpt2, llama and qwen3 are");
  }
  const std::string tokenizer = find_tokenizer(model);
  if (tokenizer.empty()) {
    throw std::invalid_argument(
        "--sample-prompts needs the model's tokenizer: a tokenizer.json in --init-from's "
        "folder, or the tokenizer_info.json prepare-data writes beside --train-data");
  }
  auto prompts = read_prompts_file(prompts_file, "--sample-prompts");
  if (prompts.empty()) {
    throw std::invalid_argument("--sample-prompts " + prompts_file + " holds no prompts");
  }
  if (new_tokens <= 0) {
    throw std::invalid_argument("--sample-new-tokens must be positive, got " +
                                std::to_string(new_tokens));
  }
  return std::make_shared<SampleCallback>(Tokenizer::from_file(tokenizer), std::move(prompts),
                                          new_tokens);
}

}  // namespace pipetrain::cli
