// chunked_cross_entropy against torch::nn::functional::cross_entropy: the loss and the gradient
// with respect to the logits, over several blocks of rows, with ignored rows, a scaled backward and
// [B, T, C] shapes. fp32: relative 1e-5 (absolute 1e-7 for gradients); bf16 logits: against the
// unfused path on the same bf16 logits upcast to fp32 (as autocast runs it), the loss to fp32
// rounding and the gradient to one bf16 rounding (relative 2^-7). The in-place form against the
// out-of-place one: equal to the bit.
#include "pipetrain/cross_entropy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "pipetrain/pipetrain.h"
#include "support/devices.h"
#include "support/multiprocess.h"

namespace pipetrain::cross_entropy_test {
namespace {

namespace F = torch::nn::functional;

struct Result {
  at::Tensor loss, grad;
};

// loss x 3 backpropagated, so that the backward's scaling is checked too.
template <typename LossFn>
Result run(const at::Tensor& logits, LossFn&& loss_fn) {
  auto input = logits.detach().clone().requires_grad_();
  auto loss = loss_fn(input);
  (loss * 3).backward();
  return {loss.detach(), input.grad()};
}

at::Tensor make_target(int64_t rows, int64_t classes, bool with_ignored) {
  auto target = torch::randint(classes, {rows}, torch::kLong);
  if (with_ignored) target.index_put_({torch::arange(0, rows, 5)}, -100);
  return target;
}

// bf16 logits, `rows` x `classes` drawn N(0, 9) after manual_seed(seed), every fifth row's target
// ignored where `with_ignored`.
struct Bf16Case {
  uint64_t seed;
  int64_t rows, classes;
  bool with_ignored;
  std::optional<int64_t> ignore_index;
  int64_t block_rows;
  double loss_tolerance;
};

// chunked_cross_entropy of case `c`'s logits on `device` against the unfused path on them upcast to
// fp32 (as autocast runs it): the loss to a relative `loss_tolerance`, the gradient, bf16, within
// one bf16 rounding of the fp32 path's (relative 2^-7).
void expect_bf16_within_one_rounding_of_fp32_path(torch::Device device, const Bf16Case& c) {
  SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.classes) + " logits");
  torch::manual_seed(c.seed);
  const auto logits = (torch::randn({c.rows, c.classes}) * 3).to(device, torch::kBFloat16);
  const auto target = make_target(c.rows, c.classes, c.with_ignored).to(device);
  const auto expected = run(
      logits, [&](const at::Tensor& x) { return F::cross_entropy(x.to(torch::kFloat), target); });
  const auto actual = run(logits, [&](const at::Tensor& x) {
    return chunked_cross_entropy(x, target, c.ignore_index, c.block_rows);
  });
  EXPECT_TRUE(torch::allclose(actual.loss, expected.loss, c.loss_tolerance, 0));
  EXPECT_EQ(actual.grad.scalar_type(), torch::kBFloat16);
  const auto error = (actual.grad.to(torch::kFloat) - expected.grad).abs();
  EXPECT_TRUE(error.le(expected.grad.abs() * (1.0 / 128) + 1e-9).all().item<bool>())
      << "largest error " << error.max().item<double>();
}

TEST(ChunkedCrossEntropy, EqualsCrossEntropyOverSeveralBlocksWithIgnoredRows) {
  torch::manual_seed(0);
  const auto logits = torch::randn({37, 11}) * 4;
  for (const bool with_ignored : {false, true}) {
    const auto target = make_target(37, 11, with_ignored);
    const auto expected =
        run(logits, [&](const at::Tensor& x) { return F::cross_entropy(x, target); });
    for (const int64_t block_rows : {0, 1, 8, 37, 100}) {
      const auto actual = run(logits, [&](const at::Tensor& x) {
        return chunked_cross_entropy(x, target, -100, block_rows);
      });
      EXPECT_EQ(actual.loss.scalar_type(), at::kFloat);
      EXPECT_TRUE(torch::allclose(actual.loss, expected.loss, 1e-5, 0))
          << "block_rows " << block_rows << ": " << actual.loss.item<double>() << " vs "
          << expected.loss.item<double>();
      EXPECT_TRUE(torch::allclose(actual.grad, expected.grad, 1e-5, 1e-7))
          << "block_rows " << block_rows << ", ignored rows " << with_ignored << ": off by "
          << (actual.grad - expected.grad).abs().max().item<double>();
    }
  }
}

TEST(ChunkedCrossEntropy, TakesSequencesOfLogitsAsCrossEntropyOverTheirRows) {
  torch::manual_seed(1);
  const auto logits = torch::randn({3, 5, 13});
  const auto target = torch::randint(13, {3, 5}, torch::kLong);
  const auto expected = run(logits, [&](const at::Tensor& x) {
    return F::cross_entropy(x.reshape({-1, 13}), target.reshape({-1}));
  });
  const auto actual =
      run(logits, [&](const at::Tensor& x) { return chunked_cross_entropy(x, target, -100, 4); });
  EXPECT_TRUE(torch::allclose(actual.loss, expected.loss, 1e-5, 0));
  EXPECT_TRUE(torch::allclose(actual.grad, expected.grad, 1e-5, 1e-7));
  EXPECT_EQ(actual.grad.sizes(), logits.sizes());
}

TEST(ChunkedCrossEntropy, KeepsBf16GradientsWithinOneRoundingOfTheFp32Path) {
  expect_bf16_within_one_rounding_of_fp32_path(
      torch::kCPU, {/*seed=*/2, 64, 301, /*with_ignored=*/true, -100, /*block_rows=*/16, 1e-5});
}

// On a GPU (pipetrain's kernel, or ATen's log_softmax in a build without nvcc) the same bounds,
// also over real vocabularies.
TEST(ChunkedCrossEntropy, CudaBf16GradientsWithinOneRoundingOfTheFp32Path) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Bf16Case cases[] = {
      {/*seed=*/4, 300, 1031, /*with_ignored=*/true, -100, /*block_rows=*/64, 1e-5},
      // GPT-2's vocabulary (the kernel's 16-byte path), every row counted.
      {/*seed=*/7, 64, 50304, /*with_ignored=*/false, std::nullopt, /*block_rows=*/0, 2e-5},
      // Llama 3's: rows of 128,256 logits, 2.5 times GPT-2's.
      {/*seed=*/8, 32, 128256, /*with_ignored=*/true, -100, /*block_rows=*/0, 2e-5},
  };
  for (const Bf16Case& c : cases) expect_bf16_within_one_rounding_of_fp32_path(torch::kCUDA, c);
}

// fp32 logits on a GPU, rows of a multiple of 4 classes (16-byte accesses) and of an odd number,
// short and long (40,000 and 70,001: many accesses a thread, in vectors and one by one), with and
// without ignored rows, backpropagated from loss x 3 and from the loss itself (the backward's
// factor of 1, which the kernel skips): relative 2e-5 (the kernel's fast exp is a few fp32
// roundings off), absolute 1e-7 for gradients.
TEST(ChunkedCrossEntropy, CudaFp32EqualsCrossEntropy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(6);
  for (const int64_t classes : {1024, 1031, 7, 40000, 70001}) {
    const auto logits = (torch::randn({257, classes}) * 4).to(torch::kCUDA);
    for (const bool with_ignored : {false, true}) {
      const auto target = make_target(257, classes, with_ignored).to(torch::kCUDA);
      const auto expected =
          run(logits, [&](const at::Tensor& x) { return F::cross_entropy(x, target); });
      const auto actual =
          run(logits, [&](const at::Tensor& x) { return chunked_cross_entropy(x, target); });
      EXPECT_TRUE(torch::allclose(actual.loss, expected.loss, 2e-5, 0))
          << classes << " classes: " << actual.loss.item<double>() << " vs "
          << expected.loss.item<double>();
      EXPECT_TRUE(torch::allclose(actual.grad, expected.grad, 2e-5, 1e-7))
          << classes << " classes, ignored rows " << with_ignored << ": off by "
          << (actual.grad - expected.grad).abs().max().item<double>();
      auto input = logits.clone().requires_grad_();
      chunked_cross_entropy(input, target).backward();
      EXPECT_TRUE(torch::allclose(input.grad() * 3, expected.grad, 2e-5, 1e-7))
          << classes << " classes, backward from the loss itself";
    }
  }
}

// A NaN logit, or a target out of range (which a kernel cannot throw for), gives a NaN loss that
// the Trainer's non-finite check stops on, never a finite wrong one.
TEST(ChunkedCrossEntropy, CudaNaNLogitsAndTargetsOutOfRangeGiveANaNLoss) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto logits = torch::randn({8, 1024}).to(torch::kCUDA);
  auto target = torch::randint(1024, {8}, torch::kLong).to(torch::kCUDA);
  auto with_nan = logits.clone();
  with_nan.index_put_({3, 17}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(chunked_cross_entropy(with_nan, target).item<double>()));
  auto out_of_range = target.clone();
  out_of_range.index_put_({5}, 1024);
  EXPECT_TRUE(std::isnan(chunked_cross_entropy(logits, out_of_range, std::nullopt).item<double>()));
  // With gradients the kernel takes another path (the row held in shared memory): the same NaN, in
  // the loss and in the gradient of the row concerned.
  for (const auto& [input, target_used, row] :
       {std::tuple{with_nan, target, 3}, std::tuple{logits, out_of_range, 5}}) {
    auto trainable = input.clone().requires_grad_();
    const auto loss = chunked_cross_entropy(trainable, target_used, std::nullopt);
    EXPECT_TRUE(std::isnan(loss.item<double>()));
    loss.backward();
    EXPECT_TRUE(trainable.grad()[row].isnan().all().item<bool>()) << "row " << row;
  }
}

TEST(ChunkedCrossEntropy, ComputesTheLossAloneWithoutGradients) {
  torch::manual_seed(3);
  const auto logits = torch::randn({9, 7});
  const auto target = torch::randint(7, {9}, torch::kLong);
  const auto expected = F::cross_entropy(logits, target);
  EXPECT_TRUE(torch::allclose(chunked_cross_entropy(logits, target), expected, 1e-5, 0));
  auto trainable = logits.clone().requires_grad_();
  torch::NoGradGuard no_grad;
  const auto loss = chunked_cross_entropy(trainable, target, -100, 2);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_TRUE(torch::allclose(loss, expected, 1e-5, 0));
}

TEST(ChunkedCrossEntropy, WithoutAnIgnoreIndexCountsEveryRow) {
  torch::manual_seed(5);
  const auto logits = torch::randn({21, 9});
  const auto target = torch::randint(9, {21}, torch::kLong);
  const auto expected =
      run(logits, [&](const at::Tensor& x) { return F::cross_entropy(x, target); });
  const auto actual = run(logits, [&](const at::Tensor& x) {
    return chunked_cross_entropy(x, target, std::nullopt, 4);
  });
  EXPECT_TRUE(torch::allclose(actual.loss, expected.loss, 1e-5, 0));
  EXPECT_TRUE(torch::allclose(actual.grad, expected.grad, 1e-5, 1e-7));
}

// Every row ignored: the mean is NaN, as torch's, and the gradient zeros, as torch's (it was NaN
// on the CPU, 0 x the count's inverse, infinite: one micro-batch of padding poisoned every weight).
TEST(ChunkedCrossEntropy, EveryRowIgnoredGivesZeroGradientsAsTorch) {
  torch::manual_seed(8);
  const auto logits = torch::randn({6, 5});
  const auto target = torch::full({6}, -100, torch::kLong);
  const auto expected =
      run(logits, [&](const at::Tensor& x) { return F::cross_entropy(x, target); });
  for (const int64_t block_rows : {0, 4}) {
    const auto actual = run(logits, [&](const at::Tensor& x) {
      return chunked_cross_entropy(x, target, -100, block_rows);
    });
    EXPECT_TRUE(std::isnan(actual.loss.item<double>()));
    EXPECT_TRUE(torch::equal(actual.grad, expected.grad)) << actual.grad;
  }
}

// The sum over the rows that count, as F::cross_entropy's reduction "sum", with its gradient; 0
// (and zero gradients) where every row is ignored, where the mean is NaN. On the CPU, and on a GPU
// (pipetrain's kernel) where there is one.
void expect_sum_is_torchs(torch::Device device) {
  torch::manual_seed(6);
  const auto logits = torch::randn({13, 8}).to(device);
  auto target = torch::randint(8, {13}, torch::kLong);
  target.index_put_({torch::tensor({1, 4, 5})}, -100);
  target = target.to(device);
  const auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
  const auto expected =
      run(logits, [&](const at::Tensor& x) { return F::cross_entropy(x, target, sum); });
  const auto actual = run(
      logits, [&](const at::Tensor& x) { return chunked_cross_entropy_sum(x, target, -100, 4); });
  EXPECT_TRUE(torch::allclose(actual.loss, expected.loss, 1e-5, 0));
  EXPECT_TRUE(torch::allclose(actual.grad, expected.grad, 1e-5, 1e-7));

  const auto every_row = target.clamp_min(0);
  EXPECT_TRUE(torch::allclose(chunked_cross_entropy_sum(logits, every_row, std::nullopt),
                              F::cross_entropy(logits, every_row, sum), 1e-5, 0));

  const auto ignored = run(logits, [&](const at::Tensor& x) {
    return chunked_cross_entropy_sum(x, torch::full({13}, -100, target.options()));
  });
  EXPECT_EQ(ignored.loss.item<double>(), 0.0);
  EXPECT_EQ(ignored.grad.abs().max().item<double>(), 0.0);
}

PIPETRAIN_TEST_ON_CPU_AND_CUDA(ChunkedCrossEntropy, SumIsTorchsSumOverTheRowsNotIgnored,
                               expect_sum_is_torchs)

TEST(ChunkedCrossEntropy, ASecondBackwardThroughARetainedGraphFails) {
  const auto logits = torch::randn({4, 5}).requires_grad_();
  const auto loss = chunked_cross_entropy(logits, torch::zeros({4}, torch::kLong));
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_THROW(loss.backward(), c10::Error);
}

// chunked_cross_entropy_ (in place) against chunked_cross_entropy on the same logits: the same
// loss and gradient to the bit (the same arithmetic, written elsewhere), and the logits' memory
// holding that gradient afterwards. The logits are `x * 1`, not a leaf, as a head's output is,
// and then `x` itself, a leaf, as a pipe's last stage hands its output to the loss.
void expect_in_place_is_out_of_place(torch::Device device, torch::Dtype dtype, int64_t rows,
                                     int64_t classes, bool sum) {
  torch::manual_seed(7);
  const auto logits = (torch::randn({rows, classes}) * 4).to(device, dtype);
  const auto target = make_target(rows, classes, /*with_ignored=*/true).to(device);
  const auto out_of_place = run(logits, [&](const at::Tensor& x) {
    return sum ? chunked_cross_entropy_sum(x, target, -100, 8)
               : chunked_cross_entropy(x, target, -100, 8);
  });
  for (const bool leaf : {false, true}) {
    SCOPED_TRACE(leaf ? "a leaf" : "not a leaf");
    at::Tensor overwritten;
    const auto in_place = run(logits, [&](const at::Tensor& x) {
      overwritten = leaf ? x : x * 1;
      return sum ? chunked_cross_entropy_sum_(overwritten, target, -100, 8)
                 : chunked_cross_entropy_(overwritten, target, -100, 8);
    });
    EXPECT_TRUE(torch::equal(in_place.loss, out_of_place.loss));
    EXPECT_TRUE(torch::equal(in_place.grad, out_of_place.grad));
    EXPECT_TRUE(torch::equal(overwritten.detach(), in_place.grad));
  }
}

TEST(ChunkedCrossEntropy, InPlaceWritesTheSameGradientOverTheLogits) {
  for (const bool sum : {false, true}) {
    expect_in_place_is_out_of_place(torch::kCPU, torch::kFloat, 37, 11, sum);
    expect_in_place_is_out_of_place(torch::kCPU, torch::kBFloat16, 37, 11, sum);
  }
}

TEST(ChunkedCrossEntropy, CudaInPlaceWritesTheSameGradientOverTheLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const bool sum : {false, true}) {
    expect_in_place_is_out_of_place(torch::kCUDA, torch::kFloat, 37, 11, sum);
    // Rows of GPT-2's vocabulary: many threads a row, the target's logit among what they write.
    expect_in_place_is_out_of_place(torch::kCUDA, torch::kBFloat16, 64, 50304, sum);
    // Llama 3's: each row read twice (the normaliser, then the gradient) before it is written over.
    expect_in_place_is_out_of_place(torch::kCUDA, torch::kBFloat16, 8, 128256, sum);
  }
}

TEST(ChunkedCrossEntropy, InPlaceLeavesTheLogitsAloneWithoutGradients) {
  torch::manual_seed(8);
  const auto target = torch::randint(7, {9}, torch::kLong);
  const auto logits = torch::randn({9, 7});
  const auto expected = chunked_cross_entropy(logits, target);
  auto untouched = logits.clone();
  EXPECT_TRUE(torch::equal(chunked_cross_entropy_(untouched, target), expected));
  EXPECT_TRUE(torch::equal(untouched, logits));
  auto head_output = logits.clone().requires_grad_() * 1;
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(chunked_cross_entropy_(head_output, target), expected));
  EXPECT_TRUE(torch::equal(head_output, logits));
}

TEST(ChunkedCrossEntropy, InPlaceFailsABackwardThatSavedTheLogits) {
  const auto x = torch::randn({4, 5}).requires_grad_();
  const auto logits = x * 1;
  const auto squares = (logits * logits).sum();  // saves the logits it multiplies
  const auto loss = chunked_cross_entropy_(logits, torch::zeros({4}, torch::kLong)) + squares;
  EXPECT_THROW(loss.backward(), c10::Error);
}

// Under `pipe`, forward() hands back the tensor the pipeline computed: once the in-place loss
// has written over it, a second forward() in the step would give the gradient as logits.
class ForwardsTwice : public Module {
 public:
  ForwardsTwice() : Module(torch::nn::Sequential(torch::nn::Linear(4, 6))) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = chunked_cross_entropy_(forward(batch.data), batch.target);
    [[maybe_unused]] const auto predicted = forward(batch.data).argmax(1);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};

TEST(ChunkedCrossEntropy, InPlaceThenASecondForwardUnderPipeThrows) {
  const auto root = testing::make_temp_dir("in_place_loss");
  Trainer trainer(TrainerOptions()
                      .strategy("pipe")
                      .pipe(PipeOptions().chunks(2))
                      .max_steps(1)
                      .loggers({})
                      .default_root_dir(root)
                      .enable_progress_bar(false));
  ForwardsTwice model;
  DataLoader loader(TensorDataset(torch::randn({8, 4}), torch::randint(6, {8}, torch::kLong)),
                    DataLoaderOptions().batch_size(8));
  try {
    trainer.fit(model, loader);
    ADD_FAILURE() << "the second forward() gave the overwritten logits";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("forward() was called again"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(root);
}

TEST(ChunkedCrossEntropy, RefusesTargetsThatDoNotFitTheLogits) {
  const auto logits = torch::randn({4, 6});
  const auto message = [&](const at::Tensor& l, const at::Tensor& t) {
    try {
      chunked_cross_entropy(l, t);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(logits, torch::zeros({4})).find("int64"), std::string::npos);
  EXPECT_NE(message(logits, torch::zeros({5}, torch::kLong)).find("[5]"), std::string::npos);
  EXPECT_NE(
      message(torch::zeros({4, 6}, torch::kLong), torch::zeros({4}, torch::kLong)).find("floating"),
      std::string::npos);
}

}  // namespace
}  // namespace pipetrain::cross_entropy_test
