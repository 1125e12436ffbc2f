#include "models/perplexity_logger.h"

#include <algorithm>
#include <cmath>

#include <pipetrain/trainer.h>

namespace pipetrain::cli {

void PerplexityLogger::on_validation_end(Trainer& trainer, Module&) {
  const auto loss = trainer.callback_metrics().find("val_loss");
  if (loss == trainer.callback_metrics().end()) return;
  // The row of the validation itself: its epoch and step.
  trainer.log_metrics({{"val_ppl", std::exp(loss->second)},
                       {"epoch", static_cast<double>(trainer.current_epoch())}},
                      std::max<int64_t>(trainer.global_step() - 1, 0));
}

}  // namespace pipetrain::cli
