// What joins a World's ranks in c10d terms: the run's store and this World's process group. Kept
// out of the public world.h so that a user's program never compiles c10d's headers; the library's
// own collectives (p2p, gradient sync, tied gradients, loss counts) reach them through here.
#pragma once

#include <atomic>
#include <memory>

#include "pipetrain/world.h"
#include "util/compat.h"

namespace pipetrain {
namespace detail {

struct WorldConnection {
  StorePtr store;                 // the run's, shared by every group of it
  ProcessGroupPtr process_group;  // this World's ranks alone; null for a group of one
  int store_port = 0;             // the TCPStore's port; 0 for a file store
  // Set once a call of the error exchange failed (the store's process closed or stopped): no
  // later one waits for it again. Shared by every group of the run.
  std::shared_ptr<std::atomic<bool>> store_failed = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace detail

// Null for a single process.
const ProcessGroupPtr& process_group(const World& world);
const StorePtr& store(const World& world);

// Gloo (Torch 1.13's) has no bfloat16 collectives. What a collective sends for `tensor`: a float32
// copy of a CPU bfloat16 tensor (it holds every bfloat16 value exactly, and a sum in it rounds
// once), otherwise the tensor itself; `back_from_wire` writes the collective's result back.
at::Tensor on_wire(const at::Tensor& tensor);
void back_from_wire(const at::Tensor& tensor, const at::Tensor& wire);

// Completes `work` of `world`'s process group: on CPU, blocks until it is done (or the world's
// timeout passes); on CUDA, makes the current stream wait for it, without blocking the host.
void wait(const World& world, const WorkPtr& work);

}  // namespace pipetrain
