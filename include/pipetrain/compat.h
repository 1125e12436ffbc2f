// The one place that knows the two libtorch versions pipetrain builds against: Debian's 1.13
// (CPU) and the 2.x of the GPU machines. Everything else spells c10d types through these names.
// In 2.x the Gloo and NCCL process groups are c10d::Backends behind a dispatching ProcessGroup;
// pipetrain holds the backend itself, whose collectives have 1.13's signatures.
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace pipetrain {

#if TORCH_VERSION_MAJOR >= 2
using ProcessGroup = c10d::Backend;
#else
using ProcessGroup = c10d::ProcessGroup;
#endif
using ProcessGroupPtr = c10::intrusive_ptr<ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

}  // namespace pipetrain
