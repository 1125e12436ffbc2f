// Connecting the ranks: a store for rendezvous and small messages, a process group for tensors.
#include "world_connection.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/error.h"
#include "process_group.h"
#include "rendezvous_store.h"

namespace pipetrain {
namespace {

constexpr const char* kErrorKey = "pipetrain/first_error";
// The longest one call of the error exchange waits for the store, which answers a call in
// milliseconds: a rank whose peer stopped has already waited out the timeout once, in the
// collective that failed, and must not wait for it again per call before it exits.
constexpr std::chrono::milliseconds kErrorExchangeLimit{5000};

// Runs `call` on `world`'s store as a part of the error exchange: never throws, false when the
// store is missing or failed now or before.
template <typename Call>
bool exchange_errors(const World& world, Call&& call) {
  const detail::WorldConnection* connection = world.connection();
  if (connection == nullptr || !connection->store || *connection->store_failed) return false;
  limit_store_waits(connection->store_port, std::min(world.timeout(), kErrorExchangeLimit));
  try {
    call(*connection->store);
    return true;
  } catch (...) {
    *connection->store_failed = true;
    return false;
  }
}

const ProcessGroupPtr kNoProcessGroup;
const StorePtr kNoStore;

ProcessGroupPtr make_group(const World& world, const StorePtr& store, int64_t rank, int64_t size,
                           const std::string& main_address) {
  if (world.device().is_cuda()) {
    return make_nccl_group(store, rank, size, world.timeout(), world.device().index());
  }
  return make_gloo_group(store, rank, size, world.timeout(), main_address);
}

}  // namespace

const ProcessGroupPtr& process_group(const World& world) {
  return world.connection() ? world.connection()->process_group : kNoProcessGroup;
}

const StorePtr& store(const World& world) {
  return world.connection() ? world.connection()->store : kNoStore;
}

void wait(const World& world, const WorkPtr& work) {
  if (!work) return;  // NCCL's barrier may hand back none
  if (world.device().is_cuda()) {
    // With a timeout, NCCL's wait would block the host until the GPU is done.
    work->wait();
  } else {
    work->wait(world.timeout());
  }
}
std::shared_ptr<World> World::connect(const ClusterEnvironment& env,
                                      std::chrono::milliseconds timeout,
                                      c10::DeviceType device_type) {
  auto world = std::make_shared<World>();
  world->rank_ = env.global_rank();
  world->size_ = env.world_size();
  world->local_rank_ = env.local_rank();
  world->timeout_ = timeout;
  world->main_address_ = env.main_address();
  if (device_type == c10::DeviceType::CUDA) {
    if (!cuda_available()) {
      throw std::runtime_error("rank " + std::to_string(world->rank_) +
                               ": --accelerator cuda, but no GPU is visible (or this libtorch has "
                               "no CUDA): use --accelerator cpu");
    }
    const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
    if (env.local_rank() >= visible) {
      throw std::runtime_error("rank " + std::to_string(world->rank_) + " is process " +
                               std::to_string(env.local_rank()) + " on its node, but only " +
                               std::to_string(visible) +
                               " GPUs are visible: run at most one process per GPU (--devices)");
    }
    world->device_ =
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(env.local_rank()));
  }
  if (world->size_ == 1) return world;

  auto connection = std::make_shared<detail::WorldConnection>();
  connection->store = join_rendezvous(env, world->rank_, timeout);
  if (env.rendezvous_file().empty()) connection->store_port = static_cast<int>(env.main_port());
  world->connection_ = connection;
  world->wait_for_every_rank(env);
  connection->process_group =
      make_group(*world, connection->store, world->rank_, world->size_, world->main_address_);
  return world;
}

void World::wait_for_every_rank(const ClusterEnvironment& env) const {
  const StorePtr& store = pipetrain::store(*this);
  const auto key = [](int64_t rank) { return "pipetrain/arrived/" + std::to_string(rank); };
  const std::string seconds =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout_).count()) +
      " s (--timeout)";
  // A store that accepts and then never answers (another program on MASTER_PORT, a stopped
  // rank 0) fails its calls after the timeout (rendezvous_store.cpp); say what that means.
  const auto checked = [&](const std::vector<std::string>& keys) {
    try {
      return store->check(keys);
    } catch (const std::exception& e) {
      throw std::runtime_error(
          "rank " + std::to_string(rank_) + ": the rendezvous at " + describe_rendezvous(env) +
          " did not answer within " + seconds + " (" + error_message(e) +
          "): whatever listens there is not a c10d store that works. Check that MASTER_ADDR and "
          "MASTER_PORT name rank 0's store (not another program's port) and that rank 0 runs");
    }
  };
  store->set(key(rank_), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int64_t r = 0; r < size_; ++r) keys.push_back(key(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!checked(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string arrived, missing;
      for (int64_t r = 0; r < size_; ++r) {
        std::string& list = checked({key(r)}) ? arrived : missing;
        list += (list.empty() ? "" : ", ") + std::to_string(r);
      }
      throw std::runtime_error(
          "rank " + std::to_string(rank_) + ": only ranks " + arrived + " of " +
          std::to_string(size_) + " reached the rendezvous at " + describe_rendezvous(env) +
          " within " + seconds + "; ranks " + missing +
          " did not. Check that they were started, with the same MASTER_ADDR, MASTER_PORT and "
          "WORLD_SIZE and a RANK of their own, and that this address is reachable from them");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::shared_ptr<World> World::twin() const {
  auto twin = std::make_shared<World>(*this);
  twin->twins_ = 0;
  if (size_ > 1) {
    twin->name_ = name_ + "/twin" + std::to_string(twins_++);
    twin->connect_group();
  }
  return twin;
}

std::shared_ptr<World> World::group(const std::vector<int64_t>& ranks,
                                    const std::string& name) const {
  const int64_t me = global_rank(rank_);
  const auto position = std::find(ranks.begin(), ranks.end(), me);
  if (position == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end())) {
    throw std::logic_error("World::group(" + name + "): rank " + std::to_string(me) +
                           " is not among the group's ascending ranks");
  }
  auto group = std::make_shared<World>(*this);  // same device, timeout and (run-wide) store
  group->rank_ = position - ranks.begin();
  group->size_ = static_cast<int64_t>(ranks.size());
  group->ranks_ = ranks;
  group->name_ = name_ + "/" + name;
  group->twins_ = 0;
  group->connect_group();
  return group;
}

void World::connect_group() {
  // The run's store stays; the process group is this World's own (none for a group of one).
  auto connection = std::make_shared<detail::WorldConnection>(
      connection_ ? *connection_ : detail::WorldConnection());
  connection->process_group = ProcessGroupPtr();
  if (size_ >= 2) {
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>("pipetrain/group" + name_, connection->store);
    connection->process_group = make_group(*this, prefixed, rank_, size_, main_address_);
  }
  connection_ = connection;
}

void World::barrier() const {
  if (!process_group(*this)) return;
  if (device_.is_cuda()) {
    all_reduce_sum(0);  // the host waits for its result; NCCL's barrier would not block it
    return;
  }
  try {
    wait(*this, process_group(*this)->barrier());
  } catch (const std::exception& e) {
    fail("wait at a barrier with", e);
  }
}

double World::all_reduce_sum(double value) const {
  if (!process_group(*this)) return value;
  return all_reduce_sum(at::full({1}, value, at::TensorOptions(at::kDouble).device(device_)))[0];
}

std::vector<double> World::all_reduce_sum(const at::Tensor& values) const {
  const auto host = all_reduce_sum_on_device(values).cpu();
  return {host.data_ptr<double>(), host.data_ptr<double>() + host.numel()};
}

at::Tensor World::all_reduce_sum_on_device(const at::Tensor& values) const {
  std::vector<at::Tensor> tensors{values.to(device_, at::kDouble).contiguous().clone()};
  try {
    if (process_group(*this)) wait(*this, process_group(*this)->allreduce(tensors));
    return tensors[0];
  } catch (const std::exception& e) {
    fail("sum values with", e);
  }
}

void World::fail(const std::string& what, const std::exception& error, int64_t peer) const {
  // In a world of two, "the others" is one known rank.
  if (peer < 0 && size_ == 2) peer = 1 - rank_;
  const std::string others =
      peer < 0 ? "the other ranks" : "rank " + std::to_string(global_rank(peer));
  std::ostringstream message;
  message << "rank " << global_rank(rank_) << " could not " << what << " " << others << ": "
          << error_message(error);
  const auto first = published_error();
  if (!first.empty()) {
    message << "\nfirst error: " << first;
  } else {
    message << "\n"
            << (peer < 0 ? "a rank" : others) << " may have exited: see its error, if any, above.";
  }
  throw std::runtime_error(message.str());
}

std::string World::broadcast(const std::string& text, int64_t root) const {
  if (!process_group(*this)) return text;
  // Its length first, so every rank can make room for the bytes.
  const at::Tensor size = at::full({1}, static_cast<int64_t>(text.size()),
                                   at::TensorOptions(at::kLong).device(device_));
  broadcast_into(size, root);
  at::Tensor bytes = at::empty({size.item<int64_t>()}, at::kByte);
  if (rank_ == root) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  bytes = bytes.to(device_);
  broadcast_into(bytes, root);
  bytes = bytes.cpu();
  return std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
}

at::Tensor on_wire(const at::Tensor& tensor) {
  return tensor.is_cpu() && tensor.scalar_type() == at::kBFloat16 ? tensor.to(at::kFloat) : tensor;
}

void back_from_wire(const at::Tensor& tensor, const at::Tensor& wire) {
  if (!wire.is_same(tensor)) tensor.copy_(wire);
}

void World::broadcast_into(const at::Tensor& tensor, int64_t root) const {
  if (!process_group(*this)) return;
  c10d::BroadcastOptions options;
  options.rootRank = static_cast<int>(root);
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  try {
    wait(*this, process_group(*this)->broadcast(tensors, options));
  } catch (const std::exception& e) {
    fail("share a tensor with", e, rank_ == root ? -1 : root);
  }
  back_from_wire(tensor, tensors[0]);
}

at::Tensor World::gather_to_zero(const at::Tensor& tensor, int64_t from) const {
  if (rank_ != 0 && rank_ != from) return {};
  if (from == 0) return tensor.detach().cpu().clone();
  // Tags of their own (Gloo matches on them): a header of dtype, dims and sizes, then the data.
  constexpr int kHeaderTag = 1000, kDataTag = 1001;
  constexpr int64_t kMaxDims = 16;
  const auto longs = at::TensorOptions(at::kLong).device(device_);
  try {
    if (rank_ == from) {
      const at::Tensor data = tensor.detach().contiguous().to(device_);
      if (data.dim() > kMaxDims) {
        throw std::invalid_argument("gather_to_zero sends tensors of at most " +
                                    std::to_string(kMaxDims) + " dimensions, not " +
                                    std::to_string(data.dim()));
      }
      at::Tensor header = at::zeros({2 + kMaxDims}, at::kLong);
      header[0] = static_cast<int64_t>(data.scalar_type());
      header[1] = data.dim();
      for (int64_t d = 0; d < data.dim(); ++d) header[2 + d] = data.size(d);
      std::vector<at::Tensor> head{header.to(longs)}, body{data};
      wait(*this, process_group(*this)->send(head, 0, kHeaderTag));
      wait(*this, process_group(*this)->send(body, 0, kDataTag));
      if (device_.is_cuda()) torch::cuda::synchronize();  // the buffers stay alive until sent
      return {};
    }
    std::vector<at::Tensor> head{at::empty({2 + kMaxDims}, longs)};
    wait(*this, process_group(*this)->recv(head, static_cast<int>(from), kHeaderTag));
    const at::Tensor h = head[0].cpu();
    const auto dtype = static_cast<c10::ScalarType>(h[0].item<int64_t>());
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < h[1].item<int64_t>(); ++d) sizes.push_back(h[2 + d].item<int64_t>());
    std::vector<at::Tensor> body{at::empty(sizes, at::TensorOptions(dtype).device(device_))};
    wait(*this, process_group(*this)->recv(body, static_cast<int>(from), kDataTag));
    return body[0].cpu();
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    fail(rank_ == 0 ? "receive a result from" : "send a result to", e, rank_ == 0 ? from : 0);
  }
}

void World::publish_error(const std::string& message) const {
  // compareSet with an empty expected value keeps the first error only.
  const std::string text = "rank " + std::to_string(global_rank(rank_)) + ": " + message;
  exchange_errors(*this, [&](c10d::Store& store) {
    store.compareSet(kErrorKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
  });
}

std::string World::published_error() const {
  std::string first;
  exchange_errors(*this, [&](c10d::Store& store) {
    if (!store.check({kErrorKey})) return;
    const auto bytes = store.get(kErrorKey);
    first.assign(bytes.begin(), bytes.end());
  });
  return first;
}

}  // namespace pipetrain
