// Which checkpoint a `ckpt_path` names, as Lightning's `ckpt_path` argument: a path as it is,
// "last" or "best". One resolution for the Trainer's fit, validate, test and predict and for every
// command that reads a checkpoint (`pipetrain export` too), needing no Trainer.
#pragma once

#include <string>

namespace pipetrain {

// The newest `last.ckpt` under `default_root_dir`/lightning_logs (any version), or "" when there
// is none.
std::string find_last_checkpoint(const std::string& default_root_dir);

// `ckpt_path` as a checkpoint's path: a path as it is; "last", find_last_checkpoint's; "best", the
// best checkpoint the ModelCheckpoint callback recorded in that last.ckpt (found beside it where
// the run's folder has moved since). Throws std::runtime_error saying what to pass instead when
// "last" or "best" names nothing.
std::string resolve_checkpoint_path(const std::string& ckpt_path,
                                    const std::string& default_root_dir);

}  // namespace pipetrain
