// The one place that creates c10d process groups, so that which backend exists (Gloo on Debian's
// CPU libtorch, NCCL where Torch has CUDA) and how each is configured is decided here alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "pipetrain/compat.h"

namespace pipetrain {

// A Gloo group of `size` ranks rendezvousing through `store`, this process being `rank`. Gloo
// binds to loopback when `main_address` is local, so a run on one machine never listens on an
// external interface; otherwise GLOO_SOCKET_IFNAME picks the interface, as in PyTorch.
ProcessGroupPtr make_gloo_group(const StorePtr& store, int64_t rank, int64_t size,
                                std::chrono::milliseconds timeout, const std::string& main_address);

}  // namespace pipetrain
