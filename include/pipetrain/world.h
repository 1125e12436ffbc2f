// The processes taking part in one training run, and the collectives pipetrain runs among them.
// A default-constructed World is a single process (rank 0 of 1), so code that runs in one
// process needs no `if (distributed)`. The c10d store and process group that join the ranks are
// the library's own (src/distributed/world_connection.h): nothing of c10d reaches this header.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

class ClusterEnvironment;
namespace detail {
struct WorldConnection;
}

class World {
 public:
  // Every blocking wait (store, send, receive) gives up after this long.
  static constexpr std::chrono::seconds kDefaultTimeout{300};

  World() = default;

  // Joins the run described by `env`: every rank meets the others in its rendezvous store (a file
  // under pipetrain's launcher, else a TCPStore that rank 0 or torchrun's agent serves at the main
  // address and port) and joins a process group through it: Gloo on CPU; on CUDA, NCCL with this
  // process on GPU LOCAL_RANK (one process per GPU, as torchrun runs it).
  static std::shared_ptr<World> connect(const ClusterEnvironment& env,
                                        std::chrono::milliseconds timeout = kDefaultTimeout,
                                        c10::DeviceType device_type = c10::DeviceType::CPU);

  // The ranks `ranks` (ascending global ranks, this one among them) as a World of their own, for
  // collectives and messages among them alone: rank() becomes the position in `ranks`. Every rank
  // in `ranks` calls it with the same `name`, which must be unique in the run. Errors published
  // in a group reach the whole run.
  std::shared_ptr<World> group(const std::vector<int64_t>& ranks, const std::string& name) const;
  // The same ranks with a process group of their own. NCCL runs each group's operations on a
  // stream of its own, so traffic in one direction never queues behind the other's. Every rank
  // calls it at the same point.
  std::shared_ptr<World> twin() const;

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  // The rank in the whole run of this World's rank `rank` (for messages).
  int64_t global_rank(int64_t rank) const { return ranks_.empty() ? rank : ranks_.at(rank); }
  int64_t local_rank() const { return local_rank_; }
  bool is_global_zero() const { return rank_ == 0; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Where this process computes: the CPU, or its GPU.
  c10::Device device() const { return device_; }

  // The store and process group behind this World (null for a single process): the library's
  // own, read through src/distributed/world_connection.h.
  const detail::WorldConnection* connection() const { return connection_.get(); }

  void barrier() const;
  // Sum of `value` over all ranks (on every rank).
  double all_reduce_sum(double value) const;
  // Element-wise sums of `values` over all ranks, on the host: one collective for several
  // decisions, whose values may still be on the device (one host wait for all of them).
  std::vector<double> all_reduce_sum(const at::Tensor& values) const;
  // Element-wise sums of `values` (float64) over all ranks, left on this rank's device: on a GPU
  // the host does not wait for them.
  at::Tensor all_reduce_sum_on_device(const at::Tensor& values) const;
  // True on every rank when it is true on any rank: decisions one rank takes alone (a clock ran
  // out) become everyone's.
  bool any(bool value) const { return all_reduce_sum(value ? 1.0 : 0.0) > 0; }
  // `text` as rank `root` has it, on every rank.
  std::string broadcast(const std::string& text, int64_t root = 0) const;
  // Rank `root`'s values of `tensor` written into every rank's `tensor` (of the same shape and
  // dtype, on this world's device).
  void broadcast_into(const at::Tensor& tensor, int64_t root = 0) const;
  // Rank `from`'s `tensor` on rank 0, as a host tensor of its own (whatever shape and dtype it
  // has); undefined on every other rank. Only ranks 0 and `from` take part, each returning once
  // its side is done: how results (weights, predictions) gather where they are saved or printed.
  at::Tensor gather_to_zero(const at::Tensor& tensor, int64_t from) const;

  // Records this rank's failure in the store so the other ranks can report the first error rather
  // than the "connection closed" they see when this process exits. Never throws.
  void publish_error(const std::string& message) const;
  // The first error another rank published, or "" when none did (or the store is gone).
  std::string published_error() const;
  // Throws std::runtime_error for `error`, met while this rank was doing `what` ("send to") with
  // rank `peer` of this world (-1: all of them): "rank 0 could not send to rank 1: ...", then the
  // first published error, or that the rank may have exited.
  [[noreturn]] void fail(const std::string& what, const std::exception& error,
                         int64_t peer = -1) const;

 private:
  int64_t rank_ = 0;
  int64_t size_ = 1;
  int64_t local_rank_ = 0;
  std::vector<int64_t> ranks_;  // global ranks of a group; empty for the whole run
  std::string main_address_;
  c10::Device device_{c10::DeviceType::CPU};
  std::string name_;           // "" for the whole run, "/pipeline0" for a group
  mutable int64_t twins_ = 0;  // names twin groups uniquely and alike on every rank
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::shared_ptr<const detail::WorldConnection> connection_;  // null: a single process

  // Waits until every rank has joined the store; past the timeout, throws naming the ranks that
  // did not.
  void wait_for_every_rank(const ClusterEnvironment& env) const;
  // A process group of its own for this (sub)world, under its name in the run's store.
  void connect_group();
};

}  // namespace pipetrain
