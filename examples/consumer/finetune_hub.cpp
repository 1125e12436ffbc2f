// Fine-tunes a Hugging Face Hub model (a folder of config.json and safetensors: GPT-2, Llama 3,
// Qwen3) on a token file, as a two-stage pipeline: each process reads its own layers' tensors.
//   ./finetune_hub ROOT STRATEGY HUB_DIR TOKENS   # STRATEGY "pipe" or "single"; TOKENS uint16
#include <pipetrain/pipetrain.h>

#include <exception>
#include <iostream>
#include <memory>
#include <string>

int main(int argc, char** argv) try {
  if (argc != 5) throw std::invalid_argument("usage: finetune_hub ROOT STRATEGY HUB_DIR TOKENS");
  const std::string root = argv[1], strategy = argv[2], hub_dir = argv[3], tokens = argv[4];
  auto options =
      pipetrain::TrainerOptions().max_epochs(3).log_every_n_steps(4).default_root_dir(root);
  if (strategy == "pipe") {
    options.strategy("pipe").devices(2).pipe(pipetrain::PipeOptions().chunks(2));
  }
  if (const auto status = pipetrain::launch_ranks(options)) return *status;
  // config.json names the family and shape; the weights are read as each rank builds its layers.
  const auto hub = pipetrain::HubModel::open(hub_dir);
  pipetrain::Trainer trainer(options);
  pipetrain::LanguageModel model(hub.layers(), pipetrain::LanguageModelOptions().lr(1e-2));
  // Windows of 16 tokens of the file (and the next token of each as its target).
  auto data = std::make_shared<pipetrain::TokenDataset>(tokens, 16, hub.vocab_size());
  trainer.fit(model, pipetrain::DataLoader(data, pipetrain::DataLoaderOptions().batch_size(8)));
  if (trainer.is_global_zero()) {
    std::cout << "finetune_hub: a " << hub.model_type() << " of " << hub.flops_per_token()
              << " FLOPs a token, fine-tuned from " << hub_dir << std::endl;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "finetune_hub: " << e.what() << "\n";
  return 1;
}
