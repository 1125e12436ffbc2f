#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <pipetrain/trainer.h>

#include "models/hf_gpt2.h"
#include "models/hf_layers.h"

namespace pipetrain::cli {

namespace {

// nn::gpt2_layers, each then given its tensors of `init_from` (a Hugging Face GPT-2 folder, or "").
std::vector<LayerSpec> layers_of(const nn::Gpt2Config& config, const std::string& init_from) {
  if (init_from.empty()) return nn::gpt2_layers(config);
  return layers_read_from(nn::gpt2_layers(config), init_from + "/model.safetensors",
                          [config, init_from](const auto& wanted) {
                            return read_hf_gpt2_weights(init_from, config, wanted);
                          });
}

}  // namespace

Gpt2Model::Gpt2Model(const nn::Gpt2Config& config, double lr)
    : Gpt2Model(config, LanguageModelOptions().lr(lr)) {}

Gpt2Model::Gpt2Model(const nn::Gpt2Config& config, LanguageModelOptions options,
                     const std::string& init_from)
    : LanguageModel(layers_of(config, init_from), std::move(options)) {}

void PerplexityLogger::on_validation_end(Trainer& trainer, Module&) {
  const auto loss = trainer.callback_metrics().find("val_loss");
  if (loss == trainer.callback_metrics().end()) return;
  // The row of the validation itself: its epoch and step.
  trainer.log_metrics({{"val_ppl", std::exp(loss->second)},
                       {"epoch", static_cast<double>(trainer.current_epoch())}},
                      std::max<int64_t>(trainer.global_step() - 1, 0));
}

}  // namespace pipetrain::cli
