// A small language model of one's own composed from pipetrain::nn's blocks (the ones Llama 3 and
// Qwen3 are made of), trained by pipetrain::LanguageModel as a two-stage pipeline on a task it can
// learn in a minute on a CPU: continue a sequence whose every token is the one two places before
// it, plus one. Trained in one process, it then continues a sequence by that rule (nn::generate).
//   ./train_decoder [ROOT] [STRATEGY]   # STRATEGY "pipe" (the default) or "single"
#include <pipetrain/pipetrain.h>
#include <torch/torch.h>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

namespace nn = pipetrain::nn;

constexpr int64_t kVocabulary = 32, kWidth = 64, kLength = 16;

// Embedding, four pre-norm blocks of grouped-query attention (4 query heads over 2 key/value
// heads, rotary positions, Qwen3's q/k norms) and SwiGLU, the final RMSNorm, and a head tied to
// the embedding. Described layer by layer (pipetrain::layer), so that each process builds only
// the layers of its own stages, each from the run's seed and its index: the same weights under
// any number of stages. The pipe may put the two ends on different stages and keeps them equal;
// where one process holds both, the head is built around the embedding's own tensor.
std::vector<pipetrain::LayerSpec> my_decoder() {
  const auto attention =
      nn::CausalSelfAttentionOptions(kWidth, 4).n_kv_head(2).qk_norm(true).rotary(
          nn::RotaryEmbeddingOptions().theta(10000));
  std::vector<pipetrain::LayerSpec> layers;
  layers.push_back(pipetrain::layer([] {
    nn::Embedding embedding(nn::EmbeddingOptions(kVocabulary, kWidth));
    torch::NoGradGuard no_grad;
    embedding->weight.normal_(0, 0.02);  // small, as the head is tied to it: modest first logits
    return embedding;
  }));
  for (int i = 0; i < 4; ++i) {
    layers.push_back(pipetrain::layer([attention] {
      return nn::DecoderBlock(nn::DecoderBlockOptions(attention, nn::SwiGLUOptions(kWidth, 128)));
    }));
  }
  layers.push_back(pipetrain::layer([] { return nn::RMSNorm(kWidth); }));
  layers.push_back(pipetrain::layer([] {
                     return nn::LMHead(kWidth, kVocabulary);
                   }).tie("weight", "0.weight", [](const torch::nn::Sequential& built) {
    return nn::LMHead(nn::Embedding(built->ptr<nn::EmbeddingImpl>(0)));
  }));
  return layers;
}

int run(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : ".";
  const bool pipelined = argc <= 2 || std::string(argv[2]) != "single";
  auto options =
      pipetrain::TrainerOptions().max_epochs(6).log_every_n_steps(8).default_root_dir(root);
  if (pipelined) {
    options.strategy("pipe").devices(2).pipe(pipetrain::PipeOptions().chunks(4).schedule("1f1b"));
  }
  if (const auto status = pipetrain::launch_ranks(options)) return *status;
  pipetrain::Trainer trainer(options);
  // Next-token cross-entropy, AdamW with decay on the matrices: the library's language model. Its
  // layers are built by the Trainer, on the processes that hold them. At 5e-3 it learns the rule in
  // 6 epochs (at 3e-3 its continuation went astray at the fifth token).
  pipetrain::LanguageModel model(my_decoder(), pipetrain::LanguageModelOptions().lr(5e-3));

  // Sequences t[i] = t[i - 2] + 1 (mod the vocabulary) from two random first tokens.
  torch::manual_seed(0);
  auto tokens = torch::empty({256, kLength + 1}, torch::kInt64);
  tokens.slice(1, 0, 2).random_(0, kVocabulary);
  for (int64_t i = 2; i <= kLength; ++i) {
    tokens.select(1, i).copy_((tokens.select(1, i - 2) + 1) % kVocabulary);
  }
  pipetrain::TensorDataset data{tokens.slice(1, 0, kLength), tokens.slice(1, 1, kLength + 1)};
  trainer.fit(model, pipetrain::DataLoader(data, pipetrain::DataLoaderOptions().batch_size(16)));
  if (!pipelined) {
    // Text out: the trained model, whole in this process, continues a sequence greedily with a
    // key/value cache, by the rule it has learnt.
    const auto made =
        nn::generate(model.layers(), {{5, 9, 6, 10}}, nn::GenerationOptions().max_new_tokens(8))
            .front();
    std::cout << "train_decoder: 5 9 6 10 continues as";
    for (const int64_t token : made) std::cout << " " << token;
    std::cout << " (the rule's: 7 11 8 12 9 13 10 14)" << std::endl;
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "train_decoder: " << e.what() << "\n";
    return 1;
  }
}
