// A user's own model trained as a two-stage pipeline. The step code is the same under every
// strategy: no stage checks, and log() just works.
//   ./train_regression [ROOT] [STRATEGY]   # pipetrain starts both ranks itself
//   torchrun --nproc-per-node 2 ./train_regression
// STRATEGY is "pipe" (the default: 2 stages, 4 micro-batches, 1F1B) or "single" (one process),
// which trains to the same losses.
#include <pipetrain/pipetrain.h>
#include <torch/torch.h>

#include <exception>
#include <iostream>
#include <string>

// A block of one's own: its LayerNorm and Linear layers go through pipetrain::residual_layer_norm
// and pipetrain::linear (x beside at::layer_norm(x), and at::linear, which the pipe can fuse and
// speed up), where it would call norm(x) and fc(x).
class ResidualBlockImpl : public torch::nn::Module {
 public:
  explicit ResidualBlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc(register_module("fc", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    // `residual` is x, its gradient added in the LayerNorm's own backward on a GPU.
    const auto normed = pipetrain::residual_layer_norm(x, norm->weight, norm->bias);
    return normed.residual +
           torch::tanh(pipetrain::linear(normed.normalised, fc->weight, fc->bias));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResidualBlock);

class Regression : public pipetrain::Module {
 public:
  Regression()
      : Module(torch::nn::Sequential(torch::nn::Linear(4, 32), torch::nn::Tanh(), ResidualBlock(32),
                                     ResidualBlock(32), torch::nn::Linear(32, 1))) {}

  at::Tensor training_step(const pipetrain::Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }

  pipetrain::OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
  }
};

int run(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : ".";
  const bool pipelined = argc <= 2 || std::string(argv[2]) != "single";
  auto options = pipetrain::TrainerOptions()
                     .max_epochs(5)
                     .log_every_n_steps(10)
                     .callbacks({std::make_shared<pipetrain::ThroughputMonitor>()})
                     .default_root_dir(root);
  if (pipelined) {
    options.strategy("pipe").devices(2).pipe(
        pipetrain::PipeOptions().chunks(4).schedule("1f1b").fuse_gradient_accumulation(true));
  }
  // Runs this program once per stage and returns their status; in the ranks, nothing.
  if (const auto status = pipetrain::launch_ranks(options)) return *status;
  pipetrain::Trainer trainer(options);
  Regression model;  // after the Trainer: it seeded the generator on every rank

  torch::manual_seed(0);
  auto x = torch::randn({512, 4});
  pipetrain::TensorDataset data{x, (x * torch::tensor({1.0, -2.0, 0.5, 3.0})).sum(1, true)};
  trainer.fit(model, pipetrain::DataLoader(data, pipetrain::DataLoaderOptions().batch_size(32)));
  return 0;
}

// pipetrain reports bad options, a missing device or a dead peer as exceptions whose message
// says what to change: print it and exit non-zero (the other ranks are told, and stop).
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "train_regression: " << e.what() << "\n";
    return 1;
  }
}
