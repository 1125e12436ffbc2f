// Cross-entropy for large vocabularies (a language model's head): the mean over rows of
// -log softmax(logits)[target], as torch::nn::functional::cross_entropy with its defaults
// (ignore_index -100, mean over the rows not ignored), computed in fp32. Unlike the unfused path
// under bf16-mixed, it never holds fp32 logits, log-probabilities or gradients for the whole batch
// (for GPT-2 at B=16, T=1024 each is 3.3 GB): the gradient with respect to the logits is computed
// in the forward and kept in the logits' own dtype; the backward only scales it. On a GPU of a
// build with nvcc (fp32, bf16 or fp16 logits) one kernel reads each row once for its loss and its
// gradient where the row fits in shared memory (bf16 rows up to about 57,000 classes on an H100:
// 1.1 ms for GPT-2's [16384, 50304], where log_softmax, exp and their fp32 copies took 7.7), and
// twice for longer rows; elsewhere ATen computes it a block of rows at a time.
//
// Differences from the unfused path, within bf16 rounding: the kept gradient softmax - onehot
// is rounded to the logits' dtype before the backward scales it (the unfused path rounds once,
// after scaling; the kernel divides by the row count first, so only a backward's factor other
// than 1 rounds twice). With fp32 logits both agree to fp32 rounding (the kernel's exponential
// is a few roundings off). One backward per forward: the backward scales the kept gradient in
// place, so a second one through a retained graph fails autograd's version check instead of
// computing with it (and there is no double backward). On the GPU kernel a target out of range
// gives a NaN loss (a kernel cannot throw), which the Trainer's non-finite check stops on.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace pipetrain {

// logits [N, C] or [..., C] (any floating dtype), target [N] or [...] (int64 class indices in
// [0, C), or ignore_index). std::nullopt for ignore_index: every row counts (no masking pass;
// a target out of range is then an indexing error). Returns an fp32 scalar; NaN when every row is
// ignored (as torch). `block_rows`: rows per block; 0 takes as many as make 2^25 fp32 elements (128
// MB). Throws std::invalid_argument naming the shapes or dtypes that do not fit.
at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                 std::optional<int64_t> ignore_index = -100,
                                 int64_t block_rows = 0);

// The sum over the rows not ignored instead of their mean (0 when every row is ignored), for a
// loss weighted by tokens: a step's sum divided by the tokens of its whole batch, as a pipe's
// micro-batches or a gradient-accumulation window need, where a mean per micro-batch would weigh
// each micro-batch alike. The same kernels, the kept gradient not divided by the rows' count.
at::Tensor chunked_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& target,
                                     std::optional<int64_t> ignore_index = -100,
                                     int64_t block_rows = 0);

// In place, as Torch's trailing underscore says: where the logits need a gradient, it is
// written over them (a [N, C] contiguous tensor's memory; a copy of other layouts), so the loss
// never holds a second [N, C] tensor beside them: 1 GB less at the peak for Llama 150M's
// [16384, 32000] bf16 logits, 4 GB for Llama 3.2 1B's vocabulary. For logits nothing reads again
// (a loss of `forward(batch.data)`): afterwards they hold the gradient, not the logits (a leaf's
// too, as a pipe's last stage hands its output to the loss: its .grad is then that memory). A
// backward that saved them (they went into another differentiable op) fails autograd's version
// check instead of computing with the gradient; under `pipe`, a second forward() in the same step
// throws. Without gradients (validation, no_grad) the logits are left as they are.
at::Tensor chunked_cross_entropy_(const at::Tensor& logits, const at::Tensor& target,
                                  std::optional<int64_t> ignore_index = -100,
                                  int64_t block_rows = 0);
at::Tensor chunked_cross_entropy_sum_(const at::Tensor& logits, const at::Tensor& target,
                                      std::optional<int64_t> ignore_index = -100,
                                      int64_t block_rows = 0);

}  // namespace pipetrain
