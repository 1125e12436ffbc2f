#include "step_weight_casts.h"

#include <torch/torch.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "util/compat.h"

namespace pipetrain {
namespace {

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// A weight the previous step asked for: remembered, not kept alive, for this step.
struct AskedWeight {
  WeakTensor weight;
  at::ScalarType dtype;
};

// A copy made in this step, with the weight it copies: held so that no other tensor can take the
// weight's address, which names it here, before the step ends.
struct StepCopy {
  at::Tensor weight, copy;
  bool asked = false;  // by step_weight_cast: only those are copied ahead in the next step
};

struct StepCasts {
  int depth = 0;  // nested scopes; the outermost is the step
  std::unordered_map<c10::TensorImpl*, StepCopy> copies;
  std::vector<AskedWeight> previous_step;
};
thread_local StepCasts casts;

// Weights whose copies are made here: autocast's own rule for its cache (fp32 leaves that take
// a gradient), contiguous (one buffer holds the copies), inside a step, with autocast's cache on.
bool cast_here(const at::Tensor& weight, at::ScalarType dtype) {
  return casts.depth > 0 && at::autocast::is_autocast_cache_enabled() &&
         weight.scalar_type() == at::kFloat && dtype != at::kFloat && weight.is_leaf() &&
         weight.requires_grad() && weight.is_contiguous();
}

// Copies `weight`, and every weight the previous step asked for in `dtype` on its device that this
// step has not copied, into one new buffer, in one multi-tensor copy.
void cast_with_the_previous_steps(const at::Tensor& weight, at::ScalarType dtype) {
  std::vector<at::Tensor> weights{weight};
  for (const auto& asked : casts.previous_step) {
    auto alive = asked.weight.lock();
    if (!alive || asked.dtype != dtype) continue;
    at::Tensor other(std::move(alive));
    if (other.device() == weight.device() && !casts.copies.count(other.unsafeGetTensorImpl()) &&
        !other.is_same(weight) && cast_here(other, dtype)) {
      weights.push_back(std::move(other));
    }
  }
  // Each copy starts on a 64-byte boundary, where vectorised copies want it.
  constexpr int64_t kAlignment = 32;  // bf16 elements
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& w : weights) {
    offsets.push_back(total);
    total += (w.numel() + kAlignment - 1) / kAlignment * kAlignment;
  }
  const at::Tensor buffer = at::empty({total}, weight.options().dtype(dtype));
  std::vector<at::Tensor> copies;
  for (size_t i = 0; i < weights.size(); ++i) {
    copies.push_back(buffer.as_strided(weights[i].sizes(), weights[i].strides(), offsets[i]));
  }
  {
    at::NoGradGuard no_grad;
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
#if PIPETRAIN_HAS_FOREACH_COPY
    at::_foreach_copy_(copies, weights);
#else
    for (size_t i = 0; i < weights.size(); ++i) copies[i].copy_(weights[i]);
#endif
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    c10::TensorImpl* key = weights[i].unsafeGetTensorImpl();
    casts.copies.insert_or_assign(key, StepCopy{std::move(weights[i]), std::move(copies[i])});
  }
}

}  // namespace

at::Tensor step_weight_cast(const at::Tensor& weight, at::ScalarType dtype) {
  if (!cast_here(weight, dtype)) {
    return at::autocast::cached_cast(dtype, weight, weight.device().type());
  }
  auto found = casts.copies.find(weight.unsafeGetTensorImpl());
  if (found == casts.copies.end()) {
    cast_with_the_previous_steps(weight, dtype);
    found = casts.copies.find(weight.unsafeGetTensorImpl());
  }
  StepCopy& made = found->second;
  // One dtype per step is what autocast gives; another (autocast switched mid-step) is its cast.
  if (made.copy.scalar_type() != dtype) {
    return at::autocast::cached_cast(dtype, weight, weight.device().type());
  }
  made.asked = true;
  return made.copy;
}

StepWeightCastScope::StepWeightCastScope() { ++casts.depth; }

StepWeightCastScope::~StepWeightCastScope() {
  if (--casts.depth > 0) return;
  // What the next step copies ahead: the weights this one asked for (a weight no longer used
  // drops out after one step).
  casts.previous_step.clear();
  for (const auto& [key, made] : casts.copies) {
    if (made.asked) {
      casts.previous_step.push_back(
          {WeakTensor(made.weight.getIntrusivePtr()), made.copy.scalar_type()});
    }
  }
  casts.copies.clear();
}

}  // namespace pipetrain
