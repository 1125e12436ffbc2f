// Gradient-accumulation fusion changes where the adds happen, not what they add up to: a pipe of
// Linear layers trains the same with it as without it (fp32, relative 1e-6, absolute 1e-7), over
// several micro-batches, on one stage and on two, where stages put their weight gradients off:
// under 1F1B every stage but the first until it has sent its input's gradient on, under GPipe
// every stage until its last backward, joining each layer's micro-batches into one GEMM. Linear
// layers inside a block of the user's own fuse through pipetrain::linear, and train the same too.
// Under autocast (bf16-mixed) the fused layers give what autocast's linear gives, within bf16's
// rounding.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>

#include "ops/fused_linear.h"  // internal: the deferral itself is tested here
#include "pipeline/trace.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/linear.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"
#include "support/devices.h"
#include "support/multiprocess.h"
#include "support/reference.h"
#include "util/compat.h"

namespace pipetrain::testing::fused_linear_test {
namespace {

const std::vector<std::string> kSchedules = {"gpipe",           "1f1b", "zbh1", "zbh2",
                                             "interleaved1f1b", "zbv"};
// interleaved1f1b and zbv with 2 stages per rank: 4 stages of the reference model's 7 layers.
int64_t virtual_stages(const std::string& schedule) {
  return schedule == "interleaved1f1b" || schedule == "zbv" ? 2 : 1;
}
const std::vector<std::string> kModes = {"never", "always"};

// A block of the user's own, its Linear layers held inside it (where the pipe cannot swap them):
// they fuse through pipetrain::linear. One of them has no bias. A gated one reads its input
// through two layers at once (pipetrain::linears: up with a bias, gate without), whose input
// gradients the fused backward adds up inside its GEMMs.
class ResidualMlpImpl : public torch::nn::Module {
 public:
  explicit ResidualMlpImpl(int64_t width, bool gated = false)
      : up(register_module("up", torch::nn::Linear(width, 2 * width))),
        down(register_module(
            "down", torch::nn::Linear(torch::nn::LinearOptions(2 * width, width).bias(false)))) {
    if (gated) {
      gate = register_module(
          "gate", torch::nn::Linear(torch::nn::LinearOptions(width, 2 * width).bias(false)));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor hidden;
    if (gate.is_empty()) {
      hidden = torch::tanh(pipetrain::linear(x, up->weight, up->bias));
    } else {
      const auto both = pipetrain::linears(x, {up->weight, gate->weight}, {up->bias, gate->bias});
      hidden = torch::tanh(both[0]) * torch::sigmoid(both[1]);
    }
    return x + pipetrain::linear(hidden, down->weight, down->bias);
  }
  torch::nn::Linear up, down, gate{nullptr};
};
TORCH_MODULE(ResidualMlp);

torch::nn::Sequential make_block_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), ResidualMlp(16),
                               ResidualMlp(16, /*gated=*/true), torch::nn::Linear(16, 3));
}

using ModelFactory = torch::nn::Sequential (*)(uint64_t seed);
torch::nn::Sequential reference_model(uint64_t seed) { return make_reference_model(seed); }

// kSteps of SGD through a Pipe, then one on a batch of 2 rows (fewer than its 3 chunks, as an
// epoch's last batch can be: a shorter schedule); returns the first step's gradients, then the
// final parameters.
std::vector<at::Tensor> train(const std::shared_ptr<World>& world, PipeOptions options,
                              ModelFactory make_model = reference_model) {
  Pipe pipe(make_model(3), options.chunks(3), world);
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(kLearningRate));
  std::vector<at::Tensor> result;
  for (int64_t step = 0; step <= kSteps; ++step) {
    const int64_t rows = step < kSteps ? kBatchSize : 2;
    const auto [all_inputs, all_targets] = reference_batch(step);
    const auto inputs = all_inputs.slice(0, 0, rows);
    const auto targets = all_targets.slice(0, 0, rows);
    optimizer.zero_grad();
    pipe.forward_backward(inputs, rows, [&](const at::Tensor& out, const MicroBatch& mb) {
      return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
    });
    if (step == 0) {
      for (const auto& p : pipe.parameters()) result.push_back(p.grad().clone());
    }
    optimizer.step();
  }
  for (const auto& p : pipe.parameters()) result.push_back(p.detach().clone());
  return result;
}

void expect_same(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-6, 1e-7))
        << (i < expected.size() / 2 ? "gradient " : "parameter ") << i % (expected.size() / 2);
  }
}

TEST(FusedGradientAccumulation, TrainsLikeSeparateAccumulation) {
  auto world = std::make_shared<World>();
  const auto expected = train(world, PipeOptions().checkpoint("never"));
  const auto actual =
      train(world, PipeOptions().checkpoint("never").fuse_gradient_accumulation(true));
  expect_same(actual, expected);

  Pipe pipe(make_reference_model(3), PipeOptions().fuse_gradient_accumulation(true), world);
  for (const auto& child : pipe.stage_module()->children()) {
    EXPECT_EQ(std::dynamic_pointer_cast<torch::nn::LinearImpl>(child), nullptr)
        << "the fused pipe must not run torch::nn::Linear";
  }
  // Every Linear accumulates inside its GEMM, the first one too, though the data it sees carries
  // no gradient.
  for (const auto& [index, input] : {std::pair<int, at::Tensor>{0, torch::ones({2, 6})},
                                     {2, torch::ones({2, 16}, torch::requires_grad())}}) {
    auto layer = pipe.stage_module()->begin()[index];
    const auto out = layer.forward(input);
    EXPECT_NE(out.grad_fn()->name().find("LinearAccumulatingGrad"), std::string::npos)
        << "layer " << index << ": " << out.grad_fn()->name();
  }
}

// The blocks' Linear layers fuse inside a pipe step that fuses (their weights' gradient hooks do
// not fire, as autograd does not accumulate them), and train as unfused ones do.
TEST(FusedGradientAccumulation, LinearsInsideBlocksFuseThroughPipetrainLinear) {
  auto world = std::make_shared<World>();
  const auto options = PipeOptions().checkpoint("never");
  expect_same(train(world, PipeOptions(options).fuse_gradient_accumulation(true), make_block_model),
              train(world, options, make_block_model));

  for (const bool fused : {false, true}) {
    auto model = make_block_model(3);
    const auto block = model->ptr<ResidualMlpImpl>(1);
    const auto gated = model->ptr<ResidualMlpImpl>(2);
    int hooks_fired = 0;
    block->up->weight.register_hook([&](const at::Tensor&) { ++hooks_fired; });
    gated->gate->weight.register_hook([&](const at::Tensor&) { ++hooks_fired; });
    Pipe pipe(model, PipeOptions(options).chunks(3).fuse_gradient_accumulation(fused), world);
    const auto [inputs, targets] = reference_batch(0);
    pipe.forward_backward(inputs, kBatchSize, [&](const at::Tensor& out, const MicroBatch& mb) {
      return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
    });
    for (const auto& p : {block->up->weight, block->up->bias, block->down->weight,
                          gated->up->weight, gated->up->bias, gated->gate->weight}) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_FALSE(p.grad().is_view()) << "optimizers detach_() gradients in place";
    }
    EXPECT_EQ(hooks_fired, fused ? 0 : 6) << (fused ? "fused" : "plain");
  }
  // Outside a step of a pipe that fuses, pipetrain::linear is at::linear, and so are
  // pipetrain::linears' layers.
  const auto y =
      pipetrain::linear(torch::randn({2, 16}), torch::randn({3, 16}, torch::requires_grad()));
  EXPECT_EQ(y.grad_fn()->name().find("LinearAccumulatingGrad"), std::string::npos);
  const auto ys =
      pipetrain::linears(torch::randn({2, 16}), {torch::randn({3, 16}, torch::requires_grad()),
                                                 torch::randn({4, 16}, torch::requires_grad())});
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_EQ(ys[1].sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(ys[0].grad_fn()->name().find("LinearsAccumulatingGrad"), std::string::npos);
  EXPECT_THROW(pipetrain::linears(torch::randn({2, 16}), {torch::randn({3, 16})}, {{}, {}}),
               std::invalid_argument);
}

// The gradients pipetrain::linear leaves in `weight` and `bias` (and the input's) for one backward
// of a fused layer under autocast to bf16, beside those of autocast's own linear.
void expect_fused_under_autocast_as_autocast(c10::Device device) {
  torch::manual_seed(11);
  const auto options = torch::TensorOptions().device(device);
  const auto x = torch::randn({64, 32}, options.requires_grad(true));
  const auto g = torch::randn({64, 48}, options);
  std::vector<at::Tensor> expected, actual;
  for (const bool fused : {false, true}) {
    torch::manual_seed(12);
    const auto weight = torch::randn({48, 32}, options.requires_grad(true));
    const auto bias = torch::randn({48}, options.requires_grad(true));
    x.mutable_grad() = at::Tensor();
    set_autocast_to_bf16(device.type(), true);
    at::Tensor y;
    {
      std::optional<FusedLinearScope> fusing;
      if (fused) fusing.emplace(nullptr);
      y = pipetrain::linear(x, weight, bias);
    }
    set_autocast_to_bf16(device.type(), false);
    at::autocast::clear_cache();
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_EQ(y.grad_fn()->name().find("LinearAccumulatingGrad") != std::string::npos, fused);
    // Twice: the second backward adds into the gradients the first made.
    y.backward(g.to(at::kBFloat16), /*retain_graph=*/true);
    y.backward(g.to(at::kBFloat16));
    auto& into = fused ? actual : expected;
    into = {weight.grad(), bias.grad(), x.grad()};
  }
  const char* names[] = {"weight", "bias", "input"};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].scalar_type(), expected[i].scalar_type()) << names[i];
    // bf16 keeps 8 bits: a product rounded to it, or not, differs by up to 2^-8 of its size.
    EXPECT_TRUE(torch::allclose(actual[i].cpu().to(at::kFloat), expected[i].cpu().to(at::kFloat),
                                1e-2, 1e-2))
        << names[i] << ": largest difference "
        << (actual[i].to(at::kFloat) - expected[i].to(at::kFloat)).abs().max().item<float>();
  }
}

PIPETRAIN_TEST_ON_CPU_AND_CUDA(FusedGradientAccumulation,
                               UnderAutocastGivesWhatAutocastsLinearGives,
                               expect_fused_under_autocast_as_autocast)

// On a GPU under autocast a fused Linear's weight and bias gradients are the fp32 sums of the bf16
// operands' products, not rounded to bf16 as autocast's own backward rounds them: the first
// backward's written and the second's added, for a whole Linear and for linear_parts' parts (rows
// of the gradients from each part's first feature on). 1e-4 of relative room for the order of
// the sums.
TEST(FusedGradientAccumulation, CudaWeightAndBiasGradientsAreFp32SumsOfBf16Products) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  torch::manual_seed(13);
  const auto options = torch::TensorOptions().device(torch::kCUDA);
  const int64_t rows = 2048, in = 64, out = 96;
  const auto x = torch::randn({rows, in}, options);
  const auto g = torch::randn({rows, out}, options).to(at::kBFloat16);
  const auto x16 = x.to(at::kBFloat16).to(at::kFloat), g16 = g.to(at::kFloat);
  for (const bool parts : {false, true}) {
    SCOPED_TRACE(parts ? "linear_parts" : "linear");
    const auto weight = torch::randn({out, in}, options.requires_grad(true));
    const auto bias = torch::randn({out}, options.requires_grad(true));
    set_autocast_to_bf16(c10::DeviceType::CUDA, true);
    at::Tensor y;
    {
      FusedLinearScope fusing(nullptr);
      y = parts ? torch::cat(linear_parts(x, weight, bias, 3), -1)
                : pipetrain::linear(x, weight, bias);
    }
    set_autocast_to_bf16(c10::DeviceType::CUDA, false);
    at::autocast::clear_cache();
    y.backward(g, /*retain_graph=*/true);
    y.backward(g);
    EXPECT_TRUE(torch::allclose(weight.grad(), 2 * g16.t().mm(x16), 1e-4, 1e-4))
        << "largest difference " << (weight.grad() - 2 * g16.t().mm(x16)).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(bias.grad(), 2 * g16.sum(0), 1e-4, 1e-4))
        << "largest difference " << (bias.grad() - 2 * g16.sum(0)).abs().max().item<float>();
  }
}

// Two Linear(4, 3) layers with the same (seeded) weights: one to fuse, one for reference.
std::pair<torch::nn::Linear, torch::nn::Linear> twin_linears(uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Linear plain(4, 3), reference(4, 3);
  torch::NoGradGuard no_grad;
  reference->weight.copy_(plain->weight);
  reference->bias.copy_(plain->bias);
  return {plain, reference};
}

// A step that fails half-way leaves no queued weight-gradient work behind: the next step's
// gradients are its own (GPipe with checkpoint never queues every micro-batch's until the end;
// here the second backward fails, after the first has queued its share).
TEST(FusedGradientAccumulation, FailedStepLeavesNoQueuedWork) {
  auto world = std::make_shared<World>();
  const auto options = PipeOptions().chunks(3).checkpoint("never").fuse_gradient_accumulation(true);
  Pipe failing(make_reference_model(3), options, world),
      fresh(make_reference_model(3), options, world);
  const auto [inputs, targets] = reference_batch(0);
  auto loss = [&](const at::Tensor& out, const MicroBatch& mb) {
    return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
  };
  int backwards = 0;
  EXPECT_ANY_THROW(failing.forward_backward(inputs, kBatchSize,
                                            [&](const at::Tensor& out, const MicroBatch& mb) {
                                              out.register_hook([&](const at::Tensor& grad) {
                                                if (++backwards == 2)
                                                  throw std::runtime_error("backward failed");
                                                return grad;
                                              });
                                              return loss(out, mb);
                                            }));
  EXPECT_EQ(backwards, 2);
  for (auto& p : failing.parameters()) p.mutable_grad() = at::Tensor();
  failing.forward_backward(inputs, kBatchSize, loss);
  fresh.forward_backward(inputs, kBatchSize, loss);
  for (size_t i = 0; i < fresh.parameters().size(); ++i) {
    EXPECT_TRUE(torch::allclose(failing.parameters()[i].grad(), fresh.parameters()[i].grad()))
        << "parameter " << i;
  }
}

// A fused Linear fed data (no gradient) gives its weight and bias what torch::nn::Linear gives.
TEST(FusedGradientAccumulation, FirstLinearOnDataAccumulatesLikeLinear) {
  auto [plain, reference] = twin_linears(6);
  const auto x = torch::randn({5, 4});
  const auto g = torch::randn({5, 3});
  reference->forward(x).backward(g);
  auto fused = fuse_gradient_accumulation(torch::nn::AnyModule(plain));
  fused.forward(x).backward(g);
  EXPECT_TRUE(torch::allclose(plain->weight.grad(), reference->weight.grad()));
  EXPECT_TRUE(torch::allclose(plain->bias.grad(), reference->bias.grad()));
}

// Inside a Deferral a fused Linear's backward gives its input's gradient at once and leaves the
// weight's and bias's for run(), which then gives what torch::nn::Linear gives: here for two
// micro-batches, short ones (run() joins their rows into one GEMM) and long ones (one GEMM each,
// adding in place).
TEST(FusedGradientAccumulation, DeferredWeightGradientsWaitForRun) {
  const int64_t long_rows = DeferredWeightGradients::kJoinedRows;
  for (const auto& rows : std::vector<std::vector<int64_t>>{{5, 2}, {long_rows, long_rows + 3}}) {
    SCOPED_TRACE("micro-batches of " + std::to_string(rows[0]) + " and " + std::to_string(rows[1]) +
                 " rows");
    auto [plain, reference] = twin_linears(5);
    std::vector<at::Tensor> xs, gs;
    for (const int64_t n : rows) {
      xs.push_back(torch::randn({n, 4}));
      gs.push_back(torch::randn({n, 3}));
    }
    auto deferred = std::make_shared<DeferredWeightGradients>();
    auto fused = fuse_gradient_accumulation(torch::nn::AnyModule(plain), deferred);
    for (size_t i = 0; i < xs.size(); ++i) {
      const auto x_reference = xs[i].clone().requires_grad_(true);
      reference->forward(x_reference).backward(gs[i]);
      const auto x_fused = xs[i].clone().requires_grad_(true);
      {
        DeferredWeightGradients::Deferral deferral(deferred.get());
        fused.forward(x_fused).backward(gs[i]);
      }
      EXPECT_TRUE(torch::allclose(x_fused.grad(), x_reference.grad())) << "micro-batch " << i;
    }
    EXPECT_FALSE(plain->weight.grad().defined()) << "the weight gradient must wait for run()";
    EXPECT_FALSE(plain->bias.grad().defined());
    deferred->run();
    EXPECT_TRUE(torch::allclose(plain->weight.grad(), reference->weight.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(plain->bias.grad(), reference->bias.grad(), 1e-5, 1e-5));
    deferred->run();  // nothing left: run() does each piece of work once
    EXPECT_TRUE(torch::allclose(plain->weight.grad(), reference->weight.grad(), 1e-5, 1e-5));
  }
}

// linear_after_elementwise (SwiGLU's down projection on a GPU) gives autograd's gradients of
// linear(silu(a) * b), plain, fused and deferred, twice over (the second adds into the first's),
// its backward making the product again rather than keeping it.
TEST(FusedGradientAccumulation, LinearAfterElementwiseGivesAutogradsGradients) {
  int recomputed = 0;
  RecomputedElementwise swiglu;
  swiglu.forward = [](const at::Tensor& a, const at::Tensor& b) { return torch::silu(a) * b; };
  swiglu.backward = [&](const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b,
                        bool a_needs, bool b_needs) {
    ++recomputed;
    const auto sigmoid = torch::sigmoid(a);
    return std::array<at::Tensor, 3>{
        a_needs ? grad * b * sigmoid * (1 + a * (1 - sigmoid)) : at::Tensor(),
        b_needs ? grad * torch::silu(a) : at::Tensor(), torch::silu(a) * b};
  };
  torch::manual_seed(3);
  const auto a0 = torch::randn({2, 5, 8}), b0 = torch::randn({2, 5, 8});
  const auto g = torch::randn({2, 5, 3});
  const auto gradients = [&](const std::string& mode, bool with_bias) {
    torch::manual_seed(4);
    torch::nn::Linear down(torch::nn::LinearOptions(8, 3).bias(with_bias));
    const auto a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    auto deferred = std::make_shared<DeferredWeightGradients>();
    for (int pass = 0; pass < 2; ++pass) {
      at::Tensor y;
      if (mode == "autograd") {
        y = torch::nn::functional::linear(torch::silu(a) * b, down->weight, down->bias);
      } else {
        std::optional<FusedLinearScope> fusing;
        if (mode != "plain") fusing.emplace(mode == "deferred" ? deferred : nullptr);
        y = linear_after_elementwise(swiglu, a, b, down->weight, down->bias);
      }
      DeferredWeightGradients::Deferral deferral(mode == "deferred" ? deferred.get() : nullptr);
      y.backward(g);
    }
    if (mode == "deferred") {
      EXPECT_FALSE(down->weight.grad().defined()) << "the weight gradient must wait for run()";
      deferred->run();
    }
    std::vector<at::Tensor> grads{a.grad(), b.grad(), down->weight.grad()};
    if (with_bias) grads.push_back(down->bias.grad());
    return grads;
  };
  const char* names[] = {"a", "b", "weight", "bias"};
  for (const bool with_bias : {true, false}) {  // a projection without bias, as Llama's
    const auto expected = gradients("autograd", with_bias);
    for (const std::string mode : {"plain", "fused", "deferred"}) {
      recomputed = 0;
      const auto actual = gradients(mode, with_bias);
      const std::string where = mode + (with_bias ? "" : ", no bias");
      EXPECT_EQ(recomputed, 2) << where << ": the backward makes the product again";
      ASSERT_EQ(actual.size(), expected.size()) << where;
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_TRUE(actual[i].defined()) << where << ", " << names[i];
        EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-6, 1e-7))
            << where << ", " << names[i];
      }
    }
  }
  // Without gradients it is the plain expression.
  torch::NoGradGuard no_grad;
  torch::nn::Linear down(8, 3);
  EXPECT_TRUE(torch::allclose(linear_after_elementwise(swiglu, a0, b0, down->weight),
                              torch::nn::functional::linear(torch::silu(a0) * b0, down->weight)));
}

// linear_activation_linear (GPT-2's MLP on a GPU, the GELU inside its GEMMs) gives autograd's
// gradients of linear(gelu(linear(x))), plain, fused and deferred, twice over (the second adds
// into the first's), for each of the two biases present or absent, and with x as data that needs
// no gradient. Here the "GEMMs" are ATen's, through the activation's two hooks.
TEST(FusedGradientAccumulation, LinearActivationLinearGivesAutogradsGradients) {
  int forwards = 0, backwards = 0;
  ActivationInGemms gelu;
  gelu.forward = [&](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    ++forwards;
    EXPECT_EQ(x.dim(), 2) << "the hooks see rows";
    const auto pre = torch::nn::functional::linear(x, weight, bias);
    return std::array<at::Tensor, 2>{torch::gelu(pre, "tanh"), pre};
  };
  gelu.backward = [&](const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& pre) {
    ++backwards;
    return torch::gelu_backward(grad.mm(weight), pre, "tanh");
  };
  torch::manual_seed(5);
  const auto x0 = torch::randn({2, 5, 4});
  const auto g = torch::randn({2, 5, 3});
  const auto gradients = [&](const std::string& mode, bool first_bias, bool second_bias,
                             bool x_is_data) {
    torch::manual_seed(6);
    torch::nn::Linear fc(torch::nn::LinearOptions(4, 8).bias(first_bias));
    torch::nn::Linear proj(torch::nn::LinearOptions(8, 3).bias(second_bias));
    const auto x = x_is_data ? x0.clone() : x0.clone().requires_grad_(true);
    auto deferred = std::make_shared<DeferredWeightGradients>();
    at::Tensor y;
    for (int pass = 0; pass < 2; ++pass) {
      if (mode == "autograd") {
        namespace F = torch::nn::functional;
        y = F::linear(torch::gelu(F::linear(x, fc->weight, fc->bias), "tanh"), proj->weight,
                      proj->bias);
      } else {
        std::optional<FusedLinearScope> fusing;
        if (mode != "plain") fusing.emplace(mode == "deferred" ? deferred : nullptr);
        y = linear_activation_linear(gelu, x, fc->weight, fc->bias, proj->weight, proj->bias);
      }
      DeferredWeightGradients::Deferral deferral(mode == "deferred" ? deferred.get() : nullptr);
      y.backward(g);
    }
    if (mode == "deferred") {
      EXPECT_FALSE(fc->weight.grad().defined()) << "the weight gradients must wait for run()";
      EXPECT_FALSE(proj->weight.grad().defined()) << "the weight gradients must wait for run()";
      deferred->run();
    }
    std::vector<at::Tensor> grads{y.detach(), x.grad(), fc->weight.grad(), proj->weight.grad()};
    if (first_bias) grads.push_back(fc->bias.grad());
    if (second_bias) grads.push_back(proj->bias.grad());
    return grads;
  };
  for (const auto& [first_bias, second_bias] : std::vector<std::pair<bool, bool>>{
           {true, true}, {false, false}, {false, true}, {true, false}}) {
    for (const bool x_is_data : {false, true}) {
      const auto expected = gradients("autograd", first_bias, second_bias, x_is_data);
      for (const std::string mode : {"plain", "fused", "deferred"}) {
        forwards = backwards = 0;
        const auto actual = gradients(mode, first_bias, second_bias, x_is_data);
        SCOPED_TRACE(mode + ", biases " + std::to_string(first_bias) + std::to_string(second_bias) +
                     (x_is_data ? ", x is data" : ""));
        EXPECT_EQ(forwards, 2);
        EXPECT_EQ(backwards, 2) << "the activation's gradient comes from the second GEMM's hook";
        ASSERT_EQ(actual.size(), expected.size());
        EXPECT_TRUE(torch::allclose(actual[0], expected[0], 1e-6, 1e-7)) << "output";
        EXPECT_EQ(actual[1].defined(), !x_is_data) << "x's gradient";
        if (!x_is_data) EXPECT_TRUE(torch::allclose(actual[1], expected[1], 1e-6, 1e-7)) << "x";
        for (size_t i = 2; i < expected.size(); ++i) {
          ASSERT_TRUE(actual[i].defined()) << "parameter " << i - 2;
          EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-5, 1e-6)) << "parameter " << i - 2;
        }
      }
    }
  }
  // Without gradients: the forward hook alone, and the plain expression's value.
  torch::NoGradGuard no_grad;
  torch::nn::Linear fc(4, 8), proj(8, 3);
  forwards = 0;
  namespace F = torch::nn::functional;
  EXPECT_TRUE(torch::allclose(
      linear_activation_linear(gelu, x0, fc->weight, fc->bias, proj->weight, proj->bias),
      F::linear(torch::gelu(F::linear(x0, fc->weight, fc->bias), "tanh"), proj->weight,
                proj->bias)));
  EXPECT_EQ(forwards, 1);
}

// linear_parts (GPT-2's c_attn) gives autograd's gradients of linear(x).chunk(3), plain, fused and
// deferred, twice over (the second adds into the first's), with and without a bias, with x as
// data that needs no gradient, and with a part the loss does not read (its rows' gradients zero).
TEST(FusedGradientAccumulation, LinearPartsGivesAutogradsGradients) {
  torch::manual_seed(8);
  const auto x0 = torch::randn({2, 5, 4});
  const std::vector<at::Tensor> g{torch::randn({2, 5, 3}), torch::randn({2, 5, 3}),
                                  torch::randn({2, 5, 3})};
  const auto gradients = [&](const std::string& mode, bool with_bias, bool x_is_data,
                             bool all_parts) {
    torch::manual_seed(9);
    torch::nn::Linear c_attn(torch::nn::LinearOptions(4, 9).bias(with_bias));
    const auto x = x_is_data ? x0.clone() : x0.clone().requires_grad_(true);
    auto deferred = std::make_shared<DeferredWeightGradients>();
    std::vector<at::Tensor> parts;
    for (int pass = 0; pass < 2; ++pass) {
      if (mode == "autograd") {
        parts = torch::nn::functional::linear(x, c_attn->weight, c_attn->bias).chunk(3, -1);
      } else {
        std::optional<FusedLinearScope> fusing;
        if (mode != "plain") fusing.emplace(mode == "deferred" ? deferred : nullptr);
        parts = linear_parts(x, c_attn->weight, c_attn->bias, 3);
      }
      DeferredWeightGradients::Deferral deferral(mode == "deferred" ? deferred.get() : nullptr);
      std::vector<at::Tensor> outputs{parts[0], parts[2]}, grads{g[0], g[2]};
      if (all_parts) {
        outputs.push_back(parts[1]);
        grads.push_back(g[1]);
      }
      torch::autograd::backward(outputs, grads);
    }
    if (mode == "deferred") {
      EXPECT_FALSE(c_attn->weight.grad().defined()) << "the weight gradient must wait for run()";
      deferred->run();
    }
    std::vector<at::Tensor> results{parts[0].detach(), parts[1].detach(), parts[2].detach(),
                                    x.grad(), c_attn->weight.grad()};
    if (with_bias) results.push_back(c_attn->bias.grad());
    return results;
  };
  for (const bool with_bias : {true, false}) {
    for (const bool x_is_data : {false, true}) {
      for (const bool all_parts : {true, false}) {
        const auto expected = gradients("autograd", with_bias, x_is_data, all_parts);
        for (const std::string mode : {"plain", "fused", "deferred"}) {
          SCOPED_TRACE(mode + (with_bias ? "" : ", no bias") + (x_is_data ? ", x is data" : "") +
                       (all_parts ? "" : ", k unread"));
          const auto actual = gradients(mode, with_bias, x_is_data, all_parts);
          ASSERT_EQ(actual.size(), expected.size());
          for (size_t i = 0; i < expected.size(); ++i) {
            ASSERT_EQ(actual[i].defined(), expected[i].defined()) << "result " << i;
            if (!expected[i].defined()) continue;
            EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-6, 1e-6)) << "result " << i;
          }
        }
      }
    }
  }
  EXPECT_THROW(linear_parts(x0, torch::randn({8, 4}), at::Tensor(), 3), std::invalid_argument);
}

// Two layers sharing a weight (tied, as embeddings and output heads are) but not a bias: the
// weight gets both layers' gradients, each bias its own.
TEST(FusedGradientAccumulation, LayersSharingAWeightKeepTheirOwnBiases) {
  torch::manual_seed(7);
  torch::nn::Linear first(4, 4), second(4, 4);
  second->weight = first->weight;  // what its forward (and the fused layer) uses
  const auto x = torch::randn({5, 4});
  const auto g = torch::randn({5, 4});
  auto reference = [&] { return second->forward(first->forward(x)); };
  reference().backward(g);
  std::vector<at::Tensor> expected;
  for (const auto& p : {first->weight, first->bias, second->bias}) {
    expected.push_back(p.grad().clone());
    p.mutable_grad() = at::Tensor();
  }
  auto deferred = std::make_shared<DeferredWeightGradients>();
  auto fused_first = fuse_gradient_accumulation(torch::nn::AnyModule(first), deferred);
  auto fused_second = fuse_gradient_accumulation(torch::nn::AnyModule(second), deferred);
  {
    DeferredWeightGradients::Deferral deferral(deferred.get());
    fused_second.forward(fused_first.forward(x)).backward(g);
  }
  deferred->run();
  EXPECT_TRUE(torch::allclose(first->weight.grad(), expected[0]));
  EXPECT_TRUE(torch::allclose(first->bias.grad(), expected[1]));
  EXPECT_TRUE(torch::allclose(second->bias.grad(), expected[2]));
}

std::string result_path(const std::string& dir, const std::string& run, int64_t rank) {
  return dir + "/" + run + "_rank" + std::to_string(rank) + ".pt";
}

PIPETRAIN_WORKER(fused_pipe_worker) {
  auto world = World::connect(*select_cluster_environment());
  const std::string dir = env_or("RESULT_DIR", ".");
  for (const auto& schedule : kSchedules) {
    for (const auto& mode : kModes) {
      for (const bool blocks : {false, true}) {
        for (const bool fused : {false, true}) {
          auto result = train(world,
                              PipeOptions()
                                  .schedule(schedule)
                                  .virtual_stages(virtual_stages(schedule))
                                  .checkpoint(mode)
                                  .fuse_gradient_accumulation(fused),
                              blocks ? make_block_model : reference_model);
          const std::string run = schedule + mode + (blocks ? "_blocks" : "");
          torch::save(result, result_path(dir, run + (fused ? "_fused" : ""), world->rank()));
        }
      }
    }
  }
  // One traced step per schedule: where each stage ran its weight gradients.
  for (const auto& schedule : kSchedules) {
    auto trace = std::make_shared<Trace>();
    Pipe pipe(make_reference_model(3),
              PipeOptions()
                  .chunks(3)
                  .schedule(schedule)
                  .virtual_stages(virtual_stages(schedule))
                  .checkpoint("never")
                  .fuse_gradient_accumulation(true)
                  .trace(trace),
              world);
    trace->start(*world);
    const auto [inputs, targets] = reference_batch(0);
    pipe.forward_backward(inputs, kBatchSize, [&](const at::Tensor& out, const MicroBatch& mb) {
      return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
    });
    trace->write(*world, dir + "/trace_" + schedule + ".json");
  }
}

TEST(FusedGradientAccumulation, TwoStagesSendInputGradientsBeforeWeightGradients) {
#ifndef PIPETRAIN_HAS_GLOO
  GTEST_SKIP() << "CPU ranks need Gloo, which this libtorch lacks";
#endif
  const auto dir = make_temp_dir("fused-pipe");
  ASSERT_EQ(run_ranks(2, "fused_pipe_worker", {{"RESULT_DIR", dir}}), 0);
  for (const auto& schedule : kSchedules) {
    for (const auto& mode : kModes) {
      for (const std::string model : {"", "_blocks"}) {
        for (int64_t rank = 0; rank < 2; ++rank) {
          SCOPED_TRACE(schedule + " " + mode + model + " rank " + std::to_string(rank));
          std::vector<at::Tensor> plain, fused;
          torch::load(plain, result_path(dir, schedule + mode + model, rank));
          torch::load(fused, result_path(dir, schedule + mode + model + "_fused", rank));
          expect_same(fused, plain);
        }
      }
    }
  }
  // rank -> span names as they ran
  auto span_order = [&](const std::string& schedule) {
    std::ifstream in(dir + "/trace_" + schedule + ".json");
    const auto trace = nlohmann::json::parse(in);
    std::map<int, std::vector<std::string>> order;
    for (const auto& event : trace.at("traceEvents")) {
      if (event.at("ph") == "X") order[event.at("pid").get<int>()].push_back(event.at("name"));
    }
    return order;
  };
  auto order = span_order("1f1b");
  auto position = [&](int rank, const std::string& name) {
    const auto& names = order[rank];
    return std::find(names.begin(), names.end(), name) - names.begin();
  };
  for (int mb = 0; mb < 3; ++mb) {
    const auto m = std::to_string(mb);
    EXPECT_EQ(position(0, "weight gradients " + m), static_cast<std::ptrdiff_t>(order[0].size()))
        << "1F1B: the first stage sends no gradient, so it has no reason to defer";
    EXPECT_EQ(position(0, "weight gradients"), static_cast<std::ptrdiff_t>(order[0].size()))
        << "1F1B interleaves stage 0's forwards and backwards: nothing to join";
    EXPECT_LT(position(1, "backward " + m), position(1, "weight gradients " + m));
    EXPECT_LT(position(1, "send gradient " + m), position(1, "weight gradients " + m))
        << "1F1B: stage 1 must send micro-batch " << m << "'s gradient before its weight gradients";
  }
  // ZB-H1 splits each backward: stage 1 sends a micro-batch's input gradient from its I, and the
  // weight gradients of the fused Linear layers and the rest wait for its W.
  order = span_order("zbh1");
  for (int mb = 0; mb < 3; ++mb) {
    const auto m = std::to_string(mb);
    EXPECT_LT(position(1, "input backward " + m), position(1, "send gradient " + m));
    EXPECT_LT(position(1, "send gradient " + m), position(1, "weight backward " + m));
    EXPECT_LT(position(1, "weight backward " + m), static_cast<std::ptrdiff_t>(order[1].size()));
    EXPECT_EQ(position(1, "backward " + m), static_cast<std::ptrdiff_t>(order[1].size()));
    EXPECT_LT(position(0, "input backward " + m), static_cast<std::ptrdiff_t>(order[0].size()))
        << "the first stage runs its whole backward at I, under I's name";
  }
  // GPipe keeps every micro-batch's activations until its backward anyway: each stage computes
  // all its weight gradients once, after its last backward.
  order = span_order("gpipe");
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("GPipe, rank " + std::to_string(rank));
    EXPECT_EQ(std::count(order[rank].begin(), order[rank].end(), "weight gradients"), 1);
    for (int mb = 0; mb < 3; ++mb) {
      const auto m = std::to_string(mb);
      EXPECT_LT(position(rank, "backward " + m), position(rank, "weight gradients"));
      EXPECT_EQ(position(rank, "weight gradients " + m),
                static_cast<std::ptrdiff_t>(order[rank].size()));
    }
  }
}

}  // namespace
}  // namespace pipetrain::testing::fused_linear_test
