#include "deferred_batch_norm.h"

#include <torch/torch.h>

namespace pipetrain {

DeferredBatchNormImpl::DeferredBatchNormImpl(std::shared_ptr<torch::nn::Module> original,
                                             at::Tensor weight, at::Tensor bias,
                                             at::Tensor running_mean, at::Tensor running_var,
                                             at::Tensor num_batches_tracked,
                                             c10::optional<double> momentum, double eps)
    : original_(std::move(original)), momentum_(momentum), eps_(eps) {
  // The same names as BatchNorm's, so checkpoints and optimizers see the same tensors.
  if (weight.defined()) weight_ = register_parameter("weight", weight);
  if (bias.defined()) bias_ = register_parameter("bias", bias);
  running_mean_ = register_buffer("running_mean", running_mean);
  running_var_ = register_buffer("running_var", running_var);
  num_batches_tracked_ = register_buffer("num_batches_tracked", num_batches_tracked);
}

at::Tensor DeferredBatchNormImpl::forward(const at::Tensor& input) {
  if (!original_->is_training()) {
    return torch::batch_norm(input, weight_, bias_, running_mean_, running_var_, false, 0.0, eps_,
                             at::globalContext().userEnabledCuDNN());
  }
  auto output = torch::batch_norm(input, weight_, bias_, {}, {}, true, 0.0, eps_,
                                  at::globalContext().userEnabledCuDNN());
  if (!recomputing_) {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
    // Summed in float64 without a float64 copy of the input.
    const auto x = input.detach();
    const auto sum = x.sum(dims, false, torch::kFloat64);
    const auto sum_of_squares = (x * x).sum(dims, false, torch::kFloat64);
    sum_ = sum_.defined() ? sum_ + sum : sum;
    sum_of_squares_ = sum_of_squares_.defined() ? sum_of_squares_ + sum_of_squares : sum_of_squares;
    count_ += input.numel() / input.size(1);
  }
  return output;
}

void DeferredBatchNormImpl::commit() {
  if (count_ == 0) return;
  torch::NoGradGuard no_grad;
  const double n = static_cast<double>(count_);
  const auto mean = sum_ / n;
  // Unbiased, as BatchNorm keeps it.
  const auto var = (sum_of_squares_ / n - mean.pow(2)) * (n / std::max(n - 1, 1.0));
  num_batches_tracked_.add_(1);
  const double factor =
      momentum_ ? *momentum_ : 1.0 / static_cast<double>(num_batches_tracked_.item<int64_t>());
  running_mean_.mul_(1 - factor).add_(mean.to(running_mean_.scalar_type()) * factor);
  running_var_.mul_(1 - factor).add_(var.to(running_var_.scalar_type()) * factor);
  discard();
}

void DeferredBatchNormImpl::discard() {
  sum_ = at::Tensor();
  sum_of_squares_ = at::Tensor();
  count_ = 0;
}

namespace {

template <typename Norm>
bool swap_norm(const std::shared_ptr<torch::nn::Module>& module, torch::nn::AnyModule& swapped,
               std::vector<DeferredBatchNorm>& all) {
  const auto norm = std::dynamic_pointer_cast<Norm>(module);
  if (!norm || !norm->options.track_running_stats()) return false;
  DeferredBatchNorm deferred(module, norm->weight, norm->bias, norm->running_mean,
                             norm->running_var, norm->num_batches_tracked, norm->options.momentum(),
                             norm->options.eps());
  all.push_back(deferred);
  swapped = torch::nn::AnyModule(deferred);
  return true;
}

}  // namespace

torch::nn::AnyModule defer_batch_norm(const torch::nn::AnyModule& layer,
                                      std::vector<DeferredBatchNorm>& swapped) {
  torch::nn::AnyModule result = layer;
  const auto module = layer.ptr();
  swap_norm<torch::nn::BatchNorm1dImpl>(module, result, swapped) ||
      swap_norm<torch::nn::BatchNorm2dImpl>(module, result, swapped) ||
      swap_norm<torch::nn::BatchNorm3dImpl>(module, result, swapped);
  return result;
}

}  // namespace pipetrain
