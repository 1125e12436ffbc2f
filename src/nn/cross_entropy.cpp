#include "pipetrain/cross_entropy.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include "cross_entropy_kernels.h"
#include "util/kernel_call.h"
#endif

namespace pipetrain {
namespace {

// fp32 elements per block of log-probabilities by default: 128 MB, far below the whole batch's
// and large enough that each kernel still fills the GPU.
constexpr int64_t kBlockElements = int64_t{1} << 25;

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  // logits [N, C], target [N]. Saves the gradient of the loss when `keep_grad`, written over
  // the logits when `in_place`; rows of `ignore_index` (when `ignore`) get none. The rows' sum
  // when `sum`, else their mean.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, int64_t ignore_index, bool ignore,
                            int64_t block, bool keep_grad, bool in_place, bool sum) {
    // Autocast would copy each block to fp32 before log_softmax, as log_softmax's dtype argument
    // does anyway for bf16 (Torch 2.11's CUDA kernel converts in one pass for fp16 alone).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
    if (const auto dtype = kernels::kernel_dtype(logits)) {
      return on_device(ctx, *dtype, logits.contiguous(), target.contiguous(), ignore_index, ignore,
                       keep_grad, in_place, sum);
    }
#endif
    const int64_t rows = logits.size(0);
    const auto ignored = ignore ? target.eq(ignore_index) : at::Tensor();
    const auto safe_target = (ignore ? target.masked_fill(ignored, 0) : target).unsqueeze(1);
    auto row_loss = at::empty({rows}, logits.options().dtype(at::kFloat));
    // Each block's log-probabilities are a copy, so its gradient may go over its logits.
    at::Tensor grad = gradient_buffer(logits, keep_grad, in_place);
    for (int64_t begin = 0; begin < rows; begin += block) {
      const int64_t size = std::min(block, rows - begin);
      const auto log_probs = at::log_softmax(logits.narrow(0, begin, size), 1, at::kFloat);
      const auto index = safe_target.narrow(0, begin, size);
      const auto target_log_prob = log_probs.gather(1, index);
      row_loss.narrow(0, begin, size).copy_(target_log_prob.squeeze(1).neg());
      if (keep_grad) {
        // d(-log p_t)/d logits = softmax - onehot(t): p everywhere, p_t - 1 at the target (in
        // fp32, so that a p_t near 1 keeps its difference).
        auto block_grad = grad.narrow(0, begin, size);
        at::exp_out(block_grad, log_probs);
        block_grad.scatter_(1, index, target_log_prob.exp().sub_(1).to(grad.scalar_type()));
        if (ignore) block_grad.masked_fill_(ignored.narrow(0, begin, size).unsqueeze(1), 0);
      }
    }
    if (ignore) row_loss.masked_fill_(ignored, 0);
    // What the sum is divided by: 1 for a sum (also where every row is ignored: 0, not 0 / 0).
    const auto count = sum      ? at::ones({}, row_loss.options())
                       : ignore ? ignored.logical_not().sum().to(at::kFloat)
                                : at::full({}, static_cast<double>(rows), row_loss.options());
    if (keep_grad) keep(ctx, logits, in_place, {grad, count});
    ctx->saved_data["on_device"] = false;
    return row_loss.sum() / count;
  }

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  // One kernel over every row: no blocks, no fp32 copies. The kept gradient is already divided
  // by the count, so the backward only multiplies by its incoming gradient, on the device.
  static at::Tensor on_device(torch::autograd::AutogradContext* ctx, kernels::Dtype dtype,
                              const at::Tensor& logits, const at::Tensor& target,
                              int64_t ignore_index, bool ignore, bool keep_grad, bool in_place,
                              bool sum) {
    const int64_t rows = logits.size(0);
    const auto float_options = logits.options().dtype(at::kFloat);
    const at::Tensor inv_count = sum ? at::ones({}, float_options)
                                 : ignore
                                     ? target.ne(ignore_index).sum().to(at::kFloat).reciprocal()
                                     : at::full({}, 1.0 / static_cast<double>(rows), float_options);
    const at::Tensor row_loss = at::empty({rows}, float_options);
    const at::Tensor grad = gradient_buffer(logits, keep_grad, in_place);
    kernels::cross_entropy_rows(dtype, logits.data_ptr(), rows, logits.size(1),
                                target.data_ptr<int64_t>(), ignore_index, ignore,
                                inv_count.data_ptr<float>(), row_loss.data_ptr<float>(),
                                keep_grad ? grad.data_ptr() : nullptr, kernels::current_stream());
    if (keep_grad) keep(ctx, logits, in_place, {grad});
    ctx->saved_data["on_device"] = true;
    return row_loss.sum() * inv_count;
  }
#endif

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    // A second backward through the same graph (retain_graph) finds the gradient scaled in place
    // below and fails autograd's version check: differentiable once, as the header says.
    auto saved = ctx->get_saved_variables();
    auto grad = saved[0];
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
    if (ctx->saved_data["on_device"].toBool()) {
      const at::Tensor factor = grad_output[0].to(at::kFloat).contiguous();
      kernels::scale_by(*kernels::kernel_dtype(grad), grad.data_ptr(), grad.numel(),
                        factor.data_ptr<float>(), kernels::current_stream());
      torch::autograd::impl::bump_version(grad);  // as an in-place op: a second backward fails
      return {grad, {}, {}, {}, {}, {}, {}, {}};
    }
#endif
    // Scaled in place, in fp32, and rounded once to the logits' dtype: by a number on the host,
    // which a multiply takes as a scalar (a device scalar of another dtype would send it down
    // TensorIterator's slow broadcasting path, 3.4 ms for GPT-2's [16384, 50304] on an H200).
    // Reading it waits for the forward just queued, so the device idles only while the next
    // kernel is launched.
    // Where every row is ignored the count is 0 and the kept gradient all zeros: zeros, as
    // torch's, not 0 x infinity.
    const at::Tensor count = saved[1].to(at::kDouble);
    const at::Tensor factor = grad_output[0].to(at::kDouble) / count;
    grad.mul_(at::where(count.eq(0), at::zeros_like(factor), factor).item<double>());
    return {grad, {}, {}, {}, {}, {}, {}, {}};
  }

 private:
  // Where the kept gradient goes: over the logits when in place, else a tensor of its own.
  static at::Tensor gradient_buffer(const at::Tensor& logits, bool keep_grad, bool in_place) {
    if (!keep_grad) return {};
    return in_place ? logits : at::empty_like(logits);
  }

  // Saves what the backward reads. Logits overwritten in place count as modified, as an in-place
  // op's output does (before saving, so the saved gradient's version is the current one): a
  // backward that saved the logits then fails autograd's version check instead of reading the
  // gradient as logits.
  static void keep(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, bool in_place,
                   torch::autograd::variable_list saved) {
    if (in_place) torch::autograd::impl::bump_version(logits);
    ctx->save_for_backward(std::move(saved));
  }
};

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                         std::optional<int64_t> ignore_index, int64_t block_rows, bool sum,
                         bool in_place) {
  const auto refuse = [&](const std::string& what) {
    std::ostringstream message;
    message << (sum ? "chunked_cross_entropy_sum" : "chunked_cross_entropy")
            << (in_place ? "_: " : ": ") << what << " (logits " << logits.scalar_type() << " "
            << logits.sizes() << ", target " << target.scalar_type() << " " << target.sizes()
            << ")";
    throw std::invalid_argument(message.str());
  };
  if (!logits.defined() || !target.defined()) refuse("logits and target must be tensors");
  if (!at::isFloatingType(logits.scalar_type())) refuse("logits must be floating point");
  if (target.scalar_type() != at::kLong) refuse("target must hold int64 class indices");
  if (logits.dim() < 2 || target.dim() != logits.dim() - 1 ||
      target.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    refuse("logits must be [..., classes] and target the same [...] without the classes");
  }
  if (block_rows < 0) refuse("block_rows must be positive, or 0 for the default");
  const int64_t classes = std::max<int64_t>(logits.size(-1), 1);
  const int64_t block =
      block_rows > 0 ? block_rows : std::max<int64_t>(1, kBlockElements / classes);
  const auto flat_logits = logits.reshape({-1, logits.size(-1)});
  const auto flat_target = target.reshape({-1});
  const bool keep_grad = at::GradMode::is_enabled() && logits.requires_grad();
  return ChunkedCrossEntropy::apply(flat_logits, flat_target, ignore_index.value_or(0),
                                    ignore_index.has_value(), block, keep_grad, in_place, sum);
}

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                 std::optional<int64_t> ignore_index, int64_t block_rows) {
  return cross_entropy(logits, target, ignore_index, block_rows, /*sum=*/false,
                       /*in_place=*/false);
}

at::Tensor chunked_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& target,
                                     std::optional<int64_t> ignore_index, int64_t block_rows) {
  return cross_entropy(logits, target, ignore_index, block_rows, /*sum=*/true,
                       /*in_place=*/false);
}

at::Tensor chunked_cross_entropy_(const at::Tensor& logits, const at::Tensor& target,
                                  std::optional<int64_t> ignore_index, int64_t block_rows) {
  return cross_entropy(logits, target, ignore_index, block_rows, /*sum=*/false,
                       /*in_place=*/true);
}

at::Tensor chunked_cross_entropy_sum_(const at::Tensor& logits, const at::Tensor& target,
                                      std::optional<int64_t> ignore_index, int64_t block_rows) {
  return cross_entropy(logits, target, ignore_index, block_rows, /*sum=*/true,
                       /*in_place=*/true);
}

}  // namespace pipetrain
