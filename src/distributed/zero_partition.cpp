#include "distributed/zero_partition.h"

#include <torch/optim/optimizer.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

#include "pipetrain/world.h"

namespace pipetrain {

ZeroPartition::ZeroPartition(std::vector<at::Tensor> parameters, std::shared_ptr<World> replicas)
    : parameters_(std::move(parameters)),
      replicas_(std::move(replicas)),
      owners_(parameters_.size(), -1) {
  for (const auto& p : parameters_) bytes_.push_back(static_cast<int64_t>(p.nbytes()));
  // Largest first, each to the replica owning the fewest bytes so far (the lowest on a tie): the
  // same answer on every replica, within the largest tensor of even.
  std::vector<size_t> order(parameters_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes_[a] > bytes_[b]; });
  std::vector<int64_t> load(static_cast<size_t>(replicas_->size()), 0);
  for (const size_t i : order) {
    if (!parameters_[i].requires_grad()) continue;
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    owners_[i] = lightest;
    load[static_cast<size_t>(lightest)] += bytes_[i];
  }
}

void ZeroPartition::shard(torch::optim::Optimizer& optimizer) const {
  if (!optimizer.state().empty()) {
    throw std::logic_error(
        "ZeRO partitions an optimizer before its first step; this one already holds state");
  }
  std::set<const c10::TensorImpl*> elsewhere;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (owners_[i] >= 0 && owners_[i] != replicas_->rank()) {
      elsewhere.insert(parameters_[i].unsafeGetTensorImpl());
    }
  }
  for (auto& group : optimizer.param_groups()) {
    auto& params = group.params();
    params.erase(std::remove_if(params.begin(), params.end(),
                                [&](const at::Tensor& p) {
                                  return elsewhere.count(p.unsafeGetTensorImpl()) > 0;
                                }),
                 params.end());
  }
}

void ZeroPartition::drop_others_gradients() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (owners_[i] >= 0 && owners_[i] != replicas_->rank()) {
      parameters_[i].mutable_grad() = at::Tensor();
    }
  }
}

void ZeroPartition::broadcast_parameters() {
  if (replicas_->size() == 1) return;
  torch::NoGradGuard no_grad;
  // Each owner's parameters of one dtype travel side by side in buckets of about
  // kBroadcastBucketBytes: a few collectives instead of one per tensor.
  for (int64_t owner = 0; owner < replicas_->size(); ++owner) {
    std::vector<size_t> owned;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] == owner) owned.push_back(i);
    }
    std::stable_sort(owned.begin(), owned.end(), [&](size_t a, size_t b) {
      return parameters_[a].scalar_type() < parameters_[b].scalar_type();
    });
    size_t first = 0;
    while (first < owned.size()) {
      const at::Tensor& head = parameters_[owned[first]];
      size_t end = first;
      int64_t bytes = 0;
      while (end < owned.size() && parameters_[owned[end]].scalar_type() == head.scalar_type() &&
             (end == first || bytes + bytes_[owned[end]] <= kBroadcastBucketBytes)) {
        bytes += bytes_[owned[end]];
        ++end;
      }
      std::vector<at::Tensor> pieces;
      for (size_t k = first; k < end; ++k) pieces.push_back(parameters_[owned[k]].reshape(-1));
      const at::Tensor flat = replicas_->rank() == owner
                                  ? torch::cat(pieces)
                                  : torch::empty({bytes / head.element_size()}, head.options());
      replicas_->broadcast_into(flat, owner);
      if (replicas_->rank() != owner) {
        int64_t offset = 0;
        for (size_t k = first; k < end; ++k) {
          at::Tensor& p = parameters_[owned[k]];
          p.copy_(flat.slice(0, offset, offset + p.numel()).view_as(p));
          offset += p.numel();
        }
      }
      first = end;
    }
  }
}

int64_t ZeroPartition::owned_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (owners_[i] == replicas_->rank()) bytes += bytes_[i];
  }
  return bytes;
}

int64_t ZeroPartition::total_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (owners_[i] >= 0) bytes += bytes_[i];
  }
  return bytes;
}

}  // namespace pipetrain
