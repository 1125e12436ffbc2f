#include "models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <stdexcept>

namespace pipetrain::cli {
namespace {

// Data comes from its own generator so it never depends on --seed or on what ran before.
at::Generator data_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// Lightning's BoringModel: a linear layer regressed towards ones on random inputs (with one hidden
// layer here, so that it has something to split into two stages).
class BoringModel : public Module {
 public:
  explicit BoringModel(double lr)
      : Module(torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 2))),
        lr_(lr) {}

  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }

  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr_));
  }

 private:
  double lr_;
};

constexpr int64_t kMlpFeatures = 32;
constexpr int64_t kMlpHidden = 128;
constexpr int64_t kMlpClasses = 10;
constexpr int64_t kMlpLinears = 8;

// Eight Linear layers with ReLU (and optional dropout) between them, classifying points labelled
// by a fixed random linear teacher.
class MlpModel : public Module {
 public:
  MlpModel(double lr, double dropout) : Module(build(dropout)), lr_(lr) {}

  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }

  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override {
    return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr_));
  }

 private:
  static torch::nn::Sequential build(double dropout) {
    torch::nn::Sequential seq;
    for (int64_t i = 0; i < kMlpLinears; ++i) {
      const int64_t in = i == 0 ? kMlpFeatures : kMlpHidden;
      const int64_t out = i == kMlpLinears - 1 ? kMlpClasses : kMlpHidden;
      seq->push_back(torch::nn::Linear(in, out));
      if (i == kMlpLinears - 1) break;
      seq->push_back(torch::nn::ReLU());
      if (dropout > 0) seq->push_back(torch::nn::Dropout(dropout));
    }
    return seq;
  }

  double lr_;
};

}  // namespace

std::vector<std::string> model_names() { return {"boring", "mlp"}; }

std::unique_ptr<Module> make_model(const ModelOptions& options) {
  if (options.name == "boring") return std::make_unique<BoringModel>(options.lr);
  if (options.name == "mlp") return std::make_unique<MlpModel>(options.lr, options.dropout);
  throw std::invalid_argument("unknown model '" + options.name + "': use boring or mlp");
}

TensorDataset make_train_data(const std::string& model) {
  torch::NoGradGuard no_grad;
  if (model == "boring") {
    auto inputs = torch::randn({64, 32}, data_generator(42));
    return {inputs, torch::ones({64, 2})};
  }
  if (model == "mlp") {
    auto gen = data_generator(1234);
    auto inputs = torch::randn({4096, kMlpFeatures}, gen);
    auto teacher = torch::randn({kMlpFeatures, kMlpClasses}, gen);
    auto labels = inputs.matmul(teacher).argmax(1);
    return {inputs, labels};
  }
  throw std::invalid_argument("unknown model '" + model + "': use boring or mlp");
}

}  // namespace pipetrain::cli
