// GPT-2 as a built-in model (`--model gpt2`): pipetrain::nn's gpt2_layers() trained as a
// LanguageModel, built per rank: each process builds (and, from a Hugging Face folder, reads) only
// the layers of its stages.
#pragma once

#include <string>

#include <pipetrain/callback.h>
#include <pipetrain/language_model.h>
#include <pipetrain/nn/gpt2.h>

namespace pipetrain::cli {

// nn::gpt2_layers(config) trained on next-token prediction, each layer drawn as nn::gpt2 draws it,
// from its own seed, then given its tensors of `init_from` (a Hugging Face GPT-2 folder, or "").
class Gpt2Model : public LanguageModel {
 public:
  explicit Gpt2Model(const nn::Gpt2Config& config, double lr = 6e-4);
  Gpt2Model(const nn::Gpt2Config& config, LanguageModelOptions options,
            const std::string& init_from = "");
};

// Logs val_ppl, the validation perplexity exp(val_loss), beside val_loss after every validation of
// a fit: the exponential of the epoch's mean loss (a mean of per-batch exponentials would not be
// a perplexity), so it cannot be a value the steps log.
class PerplexityLogger : public Callback {
 public:
  void on_validation_end(Trainer& trainer, Module& module) override;
};

}  // namespace pipetrain::cli
