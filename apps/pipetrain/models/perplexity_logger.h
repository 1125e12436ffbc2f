// val_ppl beside val_loss for the built-in language models (`--model gpt2`, llama, qwen3).
#pragma once

#include <pipetrain/callback.h>

namespace pipetrain::cli {

// Logs val_ppl, the validation perplexity exp(val_loss), beside val_loss after every validation of
// a fit: the exponential of the epoch's mean loss (a mean of per-batch exponentials would not be
// a perplexity), so it cannot be a value the steps log.
class PerplexityLogger : public Callback {
 public:
  void on_validation_end(Trainer& trainer, Module& module) override;
};

}  // namespace pipetrain::cli
