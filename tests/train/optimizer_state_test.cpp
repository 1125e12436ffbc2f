// Optimizer state saved by one layout and loaded by another must continue training exactly as if
// nothing had happened: each optimizer trains a few steps, saves by name, and its state is loaded
// into two stage optimizers whose groups hold the parameters in another order; then the original
// and the split copy run the same further steps and must end with the same weights. A copy with
// fresh optimizers runs beside them, to show that the comparison sees lost state.
#include "train/optimizer_state.h"

#include "support/errors.h"
#include "support/multiprocess.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipetrain::optimizer_state_test {
namespace {

using testing::error_of;
using torch::optim::OptimizerParamGroup;

// Two Linear layers: parameters 0.weight, 0.bias, 2.weight, 2.bias.
torch::nn::Sequential make_model(int64_t hidden = 4) {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(3, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, 2));
}

torch::nn::Sequential clone(const torch::nn::Sequential& model) {
  return torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

// A Device, not an optional, so that libtorch 1.x's c10::optional and 2.x's std::optional both
// take it.
torch::nn::Sequential clone(const torch::nn::Sequential& model, torch::Device device) {
  return torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone(device)));
}

NamedParameters named(const torch::nn::Sequential& model) {
  NamedParameters parameters;
  for (const auto& item : model->named_parameters()) {
    parameters.emplace_back(item.key(), item.value());
  }
  return parameters;
}

std::map<std::string, at::Tensor> by_name(const torch::nn::Sequential& model) {
  std::map<std::string, at::Tensor> parameters;
  for (const auto& item : model->named_parameters()) parameters[item.key()] = item.value();
  return parameters;
}

NamedParameters subset(const torch::nn::Sequential& model, const std::vector<std::string>& names) {
  auto all = by_name(model);
  NamedParameters parameters;
  for (const auto& name : names) parameters.emplace_back(name, all.at(name));
  return parameters;
}

// One step on a batch that differs from step to step, so that every step's gradient does.
void train_step(torch::nn::Sequential& model,
                const std::vector<torch::optim::Optimizer*>& optimizers, int64_t step) {
  torch::manual_seed(100 + step);
  const auto device = model->parameters().front().device();
  const auto x = torch::randn({5, 3}).to(device);
  const auto y = torch::randn({5, 2}).to(device);
  model->zero_grad();
  torch::mse_loss(model->forward(x), y).backward();
  for (auto* optimizer : optimizers) optimizer->step();
}

std::string temp_file(const std::string& name) {
  return testing::make_temp_dir("pipetrain_optimizer_state") + "/" + name;
}

std::string save_to_file(const torch::optim::Optimizer& optimizer,
                         const NamedParameters& parameters) {
  torch::serialize::OutputArchive archive;
  save_optimizer_state(optimizer, parameters, archive);
  const auto path = temp_file("optimizer.pt");
  archive.save_to(path);
  return path;
}

double largest_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

template <typename Optimizer, typename Options>
void expect_resumes_under_another_layout(const Options& options) {
  auto model = make_model();
  Optimizer optimizer(model->parameters(), options);
  for (int64_t step = 0; step < 3; ++step) train_step(model, {&optimizer}, step);
  const auto path = save_to_file(optimizer, named(model));

  // Two stages; stage 0 holds its parameters in two groups, bias first.
  auto split = clone(model);
  auto p = by_name(split);
  Optimizer stage0(std::vector<OptimizerParamGroup>{OptimizerParamGroup({p["0.bias"]}),
                                                    OptimizerParamGroup({p["0.weight"]})},
                   options);
  Optimizer stage1(
      std::vector<OptimizerParamGroup>{OptimizerParamGroup({p["2.bias"], p["2.weight"]})}, options);
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  EXPECT_EQ(load_optimizer_state(stage0, subset(split, {"0.bias", "0.weight"}), archive), 2);
  EXPECT_EQ(load_optimizer_state(stage1, subset(split, {"2.weight", "2.bias"}), archive), 2);

  auto control = clone(model);
  Optimizer fresh(control->parameters(), options);

  for (int64_t step = 3; step < 6; ++step) {
    train_step(model, {&optimizer}, step);
    train_step(split, {&stage0, &stage1}, step);
    train_step(control, {&fresh}, step);
  }
  const auto expected = by_name(model);
  const auto resumed = by_name(split);
  const auto restarted = by_name(control);
  bool control_differs = false;
  for (const auto& [name, weight] : expected) {
    EXPECT_TRUE(torch::allclose(resumed.at(name), weight, /*rtol=*/0, /*atol=*/1e-7))
        << name << ": largest difference " << largest_difference(resumed.at(name), weight);
    control_differs |= !torch::allclose(restarted.at(name), weight, 0, 1e-5);
  }
  EXPECT_TRUE(control_differs) << "losing the optimizer state changed nothing: the test is blind";
}

TEST(OptimizerState, SgdWithMomentumResumesUnderAnotherLayout) {
  expect_resumes_under_another_layout<torch::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
}

TEST(OptimizerState, AdamResumesUnderAnotherLayout) {
  expect_resumes_under_another_layout<torch::optim::Adam>(
      torch::optim::AdamOptions(0.01).amsgrad(true));
}

TEST(OptimizerState, AdamWResumesUnderAnotherLayout) {
  expect_resumes_under_another_layout<torch::optim::AdamW>(
      torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

TEST(OptimizerState, RmspropResumesUnderAnotherLayout) {
  expect_resumes_under_another_layout<torch::optim::RMSprop>(
      torch::optim::RMSpropOptions(0.01).momentum(0.9).centered(true));
}

TEST(OptimizerState, AdagradResumesUnderAnotherLayout) {
  expect_resumes_under_another_layout<torch::optim::Adagrad>(
      torch::optim::AdagradOptions(0.1).lr_decay(0.01));
}

TEST(OptimizerState, StateOfAnotherOptimizerKindIsRefused) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters());
  train_step(model, {&adam}, 0);
  const auto path = save_to_file(adam, named(model));

  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  const auto message =
      error_of<std::runtime_error>([&] { load_optimizer_state(sgd, named(model), archive); });
  EXPECT_NE(message.find("written by Adam"), std::string::npos) << message;
  EXPECT_NE(message.find("into SGD"), std::string::npos) << message;
  EXPECT_TRUE(sgd.state().empty());
}

TEST(OptimizerState, UnsupportedOptimizersAreNamed) {
  auto model = make_model();
  torch::optim::LBFGS lbfgs(model->parameters(), torch::optim::LBFGSOptions(1));
  torch::serialize::OutputArchive out;
  auto message =
      error_of<std::runtime_error>([&] { save_optimizer_state(lbfgs, named(model), out); });
  EXPECT_NE(message.find("LBFGS"), std::string::npos) << message;
  torch::serialize::InputArchive in;
  message = error_of<std::runtime_error>([&] { load_optimizer_state(lbfgs, named(model), in); });
  EXPECT_NE(message.find("LBFGS"), std::string::npos) << message;

  // A subclass may keep other state: refused by name, not treated as its base.
  struct MySGD : torch::optim::SGD {
    using torch::optim::SGD::SGD;
  };
  MySGD mine(model->parameters(), torch::optim::SGDOptions(0.1));
  message = error_of<std::runtime_error>([&] { save_optimizer_state(mine, named(model), out); });
  EXPECT_NE(message.find("MySGD"), std::string::npos) << message;
}

TEST(OptimizerState, ParameterMissingFromTheArchiveKeepsNoState) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters());
  for (int64_t step = 0; step < 2; ++step) train_step(model, {&adam}, step);
  const auto path = save_to_file(adam, named(model));

  // A resumed model with one more parameter, which the checkpoint knows nothing of.
  auto resumed = clone(model);
  auto extra = torch::ones({3}, torch::requires_grad());
  auto extra_alone = extra.detach().clone().requires_grad_();
  auto parameters = resumed->parameters();
  parameters.push_back(extra);
  torch::optim::Adam optimizer(parameters);
  auto named_parameters = named(resumed);
  named_parameters.emplace_back("4.weight", extra);
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  EXPECT_EQ(load_optimizer_state(optimizer, named_parameters, archive), 4);
  EXPECT_EQ(optimizer.state().size(), 4u);

  // It steps as it would in a fresh optimizer.
  torch::optim::Adam fresh(std::vector<at::Tensor>{extra_alone});
  const auto gradient = torch::tensor({0.5, -1.0, 2.0});
  extra.mutable_grad() = gradient.clone();
  extra_alone.mutable_grad() = gradient.clone();
  optimizer.step();
  fresh.step();
  EXPECT_TRUE(torch::equal(extra, extra_alone));
}

TEST(OptimizerState, MismatchedShapesAndOptionsAreRefusedWithTheParameterName) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters());
  train_step(model, {&adam}, 0);
  const auto path = save_to_file(adam, named(model));
  torch::serialize::InputArchive archive;
  archive.load_from(path);

  auto wider = make_model(/*hidden=*/5);
  torch::optim::Adam wider_adam(wider->parameters());
  auto message = error_of<std::runtime_error>(
      [&] { load_optimizer_state(wider_adam, named(wider), archive); });
  EXPECT_NE(message.find("'0.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("shape"), std::string::npos) << message;
  EXPECT_TRUE(wider_adam.state().empty());

  auto same = clone(model);
  torch::optim::Adam amsgrad(same->parameters(), torch::optim::AdamOptions().amsgrad(true));
  message =
      error_of<std::runtime_error>([&] { load_optimizer_state(amsgrad, named(same), archive); });
  EXPECT_NE(message.find("max_exp_avg_sq"), std::string::npos) << message;
}

// Saved on a GPU, the state is written from the CPU, so that any machine can read it, and loads
// onto the device of the parameter it belongs to.
TEST(OptimizerState, StateFollowsTheParameterDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  auto model = make_model();
  model->to(torch::kCUDA);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  for (int64_t step = 0; step < 3; ++step) train_step(model, {&optimizer}, step);
  const auto path = save_to_file(optimizer, named(model));

  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::serialize::InputArchive states, entry;
  archive.read("state", states);
  states.read("0", entry);
  c10::IValue exp_avg;
  entry.read("exp_avg", exp_avg);
  EXPECT_TRUE(exp_avg.toTensor().device().is_cpu());

  // Not clone(model, kCUDA): torch's clone compares the parameter's cuda:0 with "cuda", moves it
  // "there", gets the same tensor back, and the clone shares the original's storage.
  auto on_gpu = clone(model);
  auto on_cpu = clone(model, torch::Device(torch::kCPU));
  torch::optim::Adam gpu_optimizer(on_gpu->parameters(), torch::optim::AdamOptions(0.01));
  torch::optim::Adam cpu_optimizer(on_cpu->parameters(), torch::optim::AdamOptions(0.01));
  EXPECT_EQ(load_optimizer_state(gpu_optimizer, named(on_gpu), archive), 4);
  EXPECT_EQ(load_optimizer_state(cpu_optimizer, named(on_cpu), archive), 4);
  for (int64_t step = 3; step < 6; ++step) {
    train_step(model, {&optimizer}, step);
    train_step(on_gpu, {&gpu_optimizer}, step);
    train_step(on_cpu, {&cpu_optimizer}, step);
  }
  const auto expected = by_name(model);
  const auto gpu = by_name(on_gpu);
  const auto cpu = by_name(on_cpu);
  for (const auto& [name, weight] : expected) {
    EXPECT_TRUE(torch::allclose(gpu.at(name), weight, 0, 1e-7)) << name;
    EXPECT_TRUE(torch::allclose(cpu.at(name), weight.cpu(), 0, 1e-6))
        << name << ": largest difference " << largest_difference(cpu.at(name), weight.cpu());
  }
}

TEST(OptimizerState, ArchiveWithoutOptimizerStateIsRefused) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters());
  train_step(model, {&adam}, 0);
  // torch's own positional format, which this one replaces.
  torch::serialize::OutputArchive out;
  adam.save(out);
  const auto path = temp_file("torch.pt");
  out.save_to(path);
  torch::serialize::InputArchive in;
  in.load_from(path);
  const auto message =
      error_of<std::runtime_error>([&] { load_optimizer_state(adam, named(model), in); });
  EXPECT_NE(message.find("save_optimizer_state"), std::string::npos) << message;
}

}  // namespace
}  // namespace pipetrain::optimizer_state_test
