// The one place that creates c10d process groups, so that which backend exists (Gloo where its
// headers are, NCCL where Torch has CUDA) and how each is configured is decided here alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "util/compat.h"

namespace pipetrain {

// A Gloo group of `size` ranks rendezvousing through `store`, this process being `rank`. Gloo
// binds to loopback when `main_address` is local, so a run on one machine never listens on an
// external interface; otherwise GLOO_SOCKET_IFNAME picks the interface, as in PyTorch. Throws
// std::runtime_error when this build has no Gloo (a CUDA libtorch without Gloo headers).
ProcessGroupPtr make_gloo_group(const StorePtr& store, int64_t rank, int64_t size,
                                std::chrono::milliseconds timeout, const std::string& main_address);

// An NCCL group on CUDA device `device` (which it makes current). Throws std::runtime_error when
// Torch has no CUDA. Its operations run on NCCL's own streams, ordered after the work already
// queued on the current stream.
ProcessGroupPtr make_nccl_group(const StorePtr& store, int64_t rank, int64_t size,
                                std::chrono::milliseconds timeout, int64_t device);

// Whether make_nccl_group can work: Torch has CUDA and a GPU is visible.
bool cuda_available();

}  // namespace pipetrain
