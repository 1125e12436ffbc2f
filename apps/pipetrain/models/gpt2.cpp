#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <pipetrain/hf_gpt2.h>
#include <pipetrain/trainer.h>

namespace pipetrain::cli {

Gpt2Model::Gpt2Model(const nn::Gpt2Config& config, double lr)
    : Gpt2Model(config, LanguageModelOptions().lr(lr)) {}

Gpt2Model::Gpt2Model(const nn::Gpt2Config& config, LanguageModelOptions options,
                     const std::string& init_from)
    : LanguageModel(hf_gpt2_layers(config, init_from), std::move(options)) {}

void PerplexityLogger::on_validation_end(Trainer& trainer, Module&) {
  const auto loss = trainer.callback_metrics().find("val_loss");
  if (loss == trainer.callback_metrics().end()) return;
  // The row of the validation itself: its epoch and step.
  trainer.log_metrics({{"val_ppl", std::exp(loss->second)},
                       {"epoch", static_cast<double>(trainer.current_epoch())}},
                      std::max<int64_t>(trainer.global_step() - 1, 0));
}

}  // namespace pipetrain::cli
