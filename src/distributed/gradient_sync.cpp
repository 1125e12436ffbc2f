#include "distributed/gradient_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "distributed/world_connection.h"
#include "pipetrain/world.h"
#include "util/compat.h"

namespace pipetrain {

struct GradientSync::Bucket {
  std::vector<int64_t> parameters;
  int64_t bytes = 0;
  int64_t pending = 0;  // gradients still to arrive this step
  at::Tensor flat;      // the gradients side by side (then views of it), then their average,
                        // then a flag per parameter: whether this replica had its gradient
  int64_t numel = 0;    // of the gradients in `flat`, the flags after them
  at::Tensor wire;      // what the all-reduce sums: `flat`, or its float32 copy (on_wire)
  WorkPtr work;
};

namespace {

// Runs `callback` after a leaf's gradient has been accumulated into .grad.
class AfterAccumulation : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulation(std::function<void()> callback) : callback_(std::move(callback)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    callback_();
    return outputs;
  }

 private:
  std::function<void()> callback_;
};

// Removes the hook when the sync goes, and keeps the accumulator alive until then: a leaf holds
// its accumulator weakly, and a new one would not have the hook.
class HookHandle {
 public:
  HookHandle(std::shared_ptr<torch::autograd::Node> accumulator, std::function<void()> callback)
      : accumulator_(std::move(accumulator)),
        key_(
            accumulator_->add_post_hook(std::make_unique<AfterAccumulation>(std::move(callback)))) {
  }
  ~HookHandle() { accumulator_->del_post_hook(key_); }
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;

 private:
  std::shared_ptr<torch::autograd::Node> accumulator_;
  uintptr_t key_;
};

}  // namespace

GradientSync::GradientSync(std::vector<at::Tensor> parameters, std::shared_ptr<World> replicas,
                           std::vector<int64_t> groups, int64_t bucket_bytes)
    : parameters_(std::move(parameters)),
      replicas_(std::move(replicas)),
      bucket_of_(parameters_.size(), -1),
      ready_(parameters_.size(), false) {
  if (!groups.empty() && groups.size() != parameters_.size()) {
    throw std::invalid_argument("GradientSync: " + std::to_string(groups.size()) + " groups for " +
                                std::to_string(parameters_.size()) + " parameters");
  }
  // Reverse order, one dtype and one group per bucket.
  std::map<int64_t, int64_t> open;  // group -> its bucket still taking parameters
  for (int64_t i = static_cast<int64_t>(parameters_.size()) - 1; i >= 0; --i) {
    const at::Tensor& p = parameters_[i];
    if (!p.requires_grad()) continue;
    const int64_t group = groups.empty() ? 0 : groups[i];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const auto current = open.find(group);
    bool fits = current != open.end();
    if (fits) {
      const Bucket& bucket = buckets_[current->second];
      const at::Tensor& first = parameters_[bucket.parameters.front()];
      fits = first.scalar_type() == p.scalar_type() && first.device() == p.device() &&
             bucket.bytes + bytes <= bucket_bytes;
    }
    if (!fits) {
      open[group] = static_cast<int64_t>(buckets_.size());
      buckets_.emplace_back();
    }
    Bucket& bucket = buckets_[open[group]];
    bucket.parameters.push_back(i);
    bucket.bytes += bytes;
  }
  // Buckets start in the order backward completes them: by the earliest-registered parameter each
  // holds, the last to get its gradient.
  std::stable_sort(buckets_.begin(), buckets_.end(), [](const Bucket& a, const Bucket& b) {
    return a.parameters.back() > b.parameters.back();
  });
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (const int64_t i : buckets_[b].parameters) {
      bucket_of_[i] = static_cast<int64_t>(b);
      hooks_.push_back(
          std::make_shared<HookHandle>(torch::autograd::impl::grad_accumulator(parameters_[i]),
                                       [this, i] { on_gradient_ready(i); }));
    }
  }
}

GradientSync::~GradientSync() = default;

int64_t GradientSync::num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

std::vector<std::vector<int64_t>> GradientSync::buckets() const {
  std::vector<std::vector<int64_t>> parameters;
  for (const Bucket& bucket : buckets_) parameters.push_back(bucket.parameters);
  return parameters;
}

void GradientSync::arm() {
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.parameters.size());
    bucket.work.reset();
    bucket.flat = at::Tensor();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_bucket_ = 0;
  armed_ = true;
}

void GradientSync::on_gradient_ready(int64_t parameter) {
  if (!armed_ || ready_[parameter]) return;
  ready_[parameter] = true;
  --buckets_[bucket_of_[parameter]].pending;
  launch_ready_buckets();
}

void GradientSync::launch_ready_buckets() {
  while (next_bucket_ < num_buckets() && buckets_[next_bucket_].pending == 0) {
    launch(buckets_[next_bucket_++]);
  }
}

void GradientSync::launch(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> pieces;
  std::vector<int64_t> unused;  // positions in the bucket of parameters without a gradient here
  bucket.numel = 0;
  for (size_t k = 0; k < bucket.parameters.size(); ++k) {
    const at::Tensor& p = parameters_[bucket.parameters[k]];
    if (!p.grad().defined()) unused.push_back(static_cast<int64_t>(k));
    pieces.push_back(p.grad().defined() ? p.grad().reshape(-1)
                                        : torch::zeros({p.numel()}, p.options()));
    bucket.numel += p.numel();
  }
  // Whether each parameter had a gradient here: one that some replica used and another did not
  // gets the average on every replica, as in one process (never: the others keeping none, and
  // stepping it differently or not at all).
  at::Tensor used = torch::ones({static_cast<int64_t>(bucket.parameters.size())},
                                parameters_[bucket.parameters.front()].options());
  for (const int64_t k : unused) used.narrow(0, k, 1).zero_();
  pieces.push_back(used);
  // Dividing first keeps the sum in range for low-precision gradients, as DDP does.
  bucket.flat = torch::cat(pieces).div_(static_cast<double>(replicas_->size()));
  pieces.clear();
  // The gradients move into the bucket's memory (DDP's gradient_as_bucket_view), so that they are
  // not held twice while the reduction runs: it writes the averages into them in place. Tensors
  // of their own on that memory rather than views of the bucket, so that an optimizer's
  // zero_grad() may detach them in place.
  int64_t offset = 0;
  for (int64_t i : bucket.parameters) {
    at::Tensor& p = parameters_[i];
    if (p.grad().defined()) {
      p.mutable_grad() =
          at::empty({0}, bucket.flat.options())
              .set_(bucket.flat.storage(), bucket.flat.storage_offset() + offset, p.sizes());
    }
    offset += p.numel();
  }
  bucket.wire = on_wire(bucket.flat);
  std::vector<at::Tensor> tensors{bucket.wire};
  bucket.work = process_group(*replicas_)->allreduce(tensors);
}

void GradientSync::finish() {
  if (!armed_) throw std::logic_error("GradientSync::finish() without arm()");
  armed_ = false;
  while (next_bucket_ < num_buckets()) launch(buckets_[next_bucket_++]);
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    wait(*replicas_, bucket.work);
    back_from_wire(bucket.flat, bucket.wire);
    // Which of the parameters without a gradient here another replica used: read only where this
    // replica left one unused (a host wait), never in a step that used every parameter.
    std::vector<bool> used_elsewhere(bucket.parameters.size(), false);
    std::vector<int64_t> unused;
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      if (!parameters_[bucket.parameters[k]].grad().defined()) {
        unused.push_back(static_cast<int64_t>(k));
      }
    }
    if (!unused.empty()) {
      const auto flags = bucket.flat.slice(0, bucket.numel).to(at::kCPU, at::kFloat);
      for (const int64_t k : unused) used_elsewhere[k] = flags[k].item<float>() > 0;
    }
    int64_t offset = 0;
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      at::Tensor& p = parameters_[bucket.parameters[k]];
      const int64_t n = p.numel();
      // A parameter no replica used keeps no gradient, as in one process; one that another
      // replica used gets the average; one whose gradient was replaced since its bucket started
      // (CUDA graphs adopt gradients into buffers of their own) gets the average copied in.
      if (!p.grad().defined()) {
        if (used_elsewhere[k]) {
          p.mutable_grad() =
              at::empty({0}, bucket.flat.options())
                  .set_(bucket.flat.storage(), bucket.flat.storage_offset() + offset, p.sizes());
        }
      } else if (!p.grad().is_alias_of(bucket.flat)) {
        p.grad().copy_(bucket.flat.slice(0, offset, offset + n).view_as(p));
      }
      offset += n;
    }
    bucket.flat = at::Tensor();
    bucket.wire = at::Tensor();
    bucket.work.reset();
  }
}

}  // namespace pipetrain
