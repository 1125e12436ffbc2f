// The one place that knows the two libtorch versions pipetrain builds against: Debian's 1.13
// (CPU) and the 2.x of the GPU machines. Everything else spells c10d types through these names.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace pipetrain {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

}  // namespace pipetrain
