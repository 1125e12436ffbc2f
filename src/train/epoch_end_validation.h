// When callbacks that act on validated values (EarlyStopping, ModelCheckpoint) act by default.
#pragma once

#include "pipetrain/trainer_options.h"

namespace pipetrain {

// Whether validation, where there is any, runs once at the end of every training epoch, before
// on_train_epoch_end: then those callbacks act at the epoch's end, with both the validation's and
// the training epoch's values current, as Lightning's do. Lightning compares val_check_interval
// with 1.0, which an interval of 1 batch equals too.
inline bool validates_at_every_epoch_end(const TrainerOptions& options) {
  return options.val_check_interval().value() == 1.0 && options.check_val_every_n_epoch() == 1;
}

}  // namespace pipetrain
