// The built-in character-level GPT: its vocabulary and windows, the shapes and causality of the
// Sequential, that it learns, that sampling is reproducible, and above all that training it as a
// 2-stage pipeline (cut between transformer blocks) equals training it in one process.
#include "models/gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"
#include "support/multiprocess.h"

namespace pipetrain::cli::gpt_test {
namespace {

const std::string kText =
    "the quick brown fox jumps over the lazy dog. a pipeline cuts a model into stages, "
    "and each stage runs on its own process. the fox is quick and the dog is lazy. ";

GptConfig tiny_config(int64_t vocab_size) {
  GptConfig config;
  config.vocab_size = vocab_size;
  config.block_size = 8;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 16;
  return config;
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

TEST(CharVocabulary, RoundTripsItsTextWithSortedIds) {
  CharVocabulary vocab("hello, world");
  EXPECT_EQ(vocab.chars(), " ,dehlorw");
  EXPECT_EQ(vocab.size(), 9);
  const auto ids = vocab.encode("hello, world");
  EXPECT_EQ(ids.scalar_type(), torch::kInt64);
  EXPECT_EQ(ids.size(0), 12);
  EXPECT_EQ(ids[0].item<int64_t>(), 4);  // 'h' after ' ', ',', 'd' and 'e'
  EXPECT_EQ(vocab.decode(ids), "hello, world");
  EXPECT_EQ(vocab.decode(ids.view({3, 4})), "hello, world");
}

TEST(CharVocabulary, NamesACharacterItDoesNotKnow) {
  CharVocabulary vocab("abc");
  try {
    vocab.encode("abZ");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'Z'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vocab.encode("a\n"), std::invalid_argument);
}

TEST(LoadCorpus, ReadsTheDebianLicensesByDefault) {
  if (!std::filesystem::exists("/usr/share/common-licenses/GPL-3")) {
    GTEST_SKIP() << "no /usr/share/common-licenses here";
  }
  const auto corpus = load_corpus();
  EXPECT_GT(corpus.vocab.size(), 50);
  const int64_t total = corpus.train_tokens.size(0) + corpus.val_tokens.size(0);
  EXPECT_GT(total, 100000);
  EXPECT_EQ(corpus.train_tokens.size(0), total * 9 / 10);
  EXPECT_NE(corpus.vocab.decode(corpus.train_tokens).find("GNU GENERAL PUBLIC LICENSE"),
            std::string::npos);
}

TEST(LoadCorpus, ReadsTheUsersFileAndNamesAMissingOne) {
  const auto path = std::filesystem::temp_directory_path() / "pipetrain_gpt_corpus_test.txt";
  std::ofstream(path) << "abcdefghij0123456789";
  const auto corpus = load_corpus(path.string());
  EXPECT_EQ(corpus.vocab.size(), 20);
  EXPECT_EQ(corpus.vocab.decode(corpus.train_tokens), "abcdefghij01234567");  // 90%
  EXPECT_EQ(corpus.vocab.decode(corpus.val_tokens), "89");
  std::filesystem::remove(path);
  try {
    load_corpus("/nonexistent/corpus.txt");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.txt"), std::string::npos);
  }
}

TEST(MakeCharWindows, TargetsAreInputsShiftedByOne) {
  const auto data = make_char_windows(torch::arange(10, torch::kInt64), 4, 2);
  // Windows start at 0, 2, 4 (the one at 6 would need token 10).
  ASSERT_EQ(data.size(), 3);
  EXPECT_EQ(data.inputs.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(torch::equal(data.inputs[1], torch::tensor({2, 3, 4, 5}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(data.targets[1], torch::tensor({3, 4, 5, 6}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(data.targets.slice(1, 0, 3), data.inputs.slice(1, 1)));
  EXPECT_THROW(make_char_windows(torch::arange(4, torch::kInt64), 4, 1), std::invalid_argument);
}

TEST(MakeGpt, IsASequentialOfEmbeddingBlocksNormAndHead) {
  torch::manual_seed(0);
  const auto config = tiny_config(11);
  auto gpt = make_gpt(config);
  EXPECT_EQ(static_cast<int64_t>(gpt->size()), config.n_layer + 3);
  const auto out = gpt->forward(torch::randint(11, {3, 8}, torch::kInt64));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 8, 11}));
  // Shorter sequences work; longer than block_size is an error that says so.
  EXPECT_EQ(gpt->forward(torch::zeros({2, 5}, torch::kInt64)).sizes(),
            (std::vector<int64_t>{2, 5, 11}));
  EXPECT_THROW(gpt->forward(torch::zeros({1, 9}, torch::kInt64)), std::invalid_argument);
  // Untrained, it predicts nothing yet: the loss is near ln(vocab_size).
  const auto targets = torch::randint(11, {3, 8}, torch::kInt64);
  const double loss = cross_entropy(out, targets).item<double>();
  EXPECT_NEAR(loss, std::log(11.0), 0.5);
}

TEST(MakeGpt, IsCausal) {
  torch::manual_seed(1);
  auto gpt = make_gpt(tiny_config(11));
  auto tokens = torch::randint(11, {2, 8}, torch::kInt64);
  const auto before = gpt->forward(tokens);
  const int64_t t = 5;
  auto changed = tokens.clone();
  changed.select(1, t).add_(1).remainder_(11);
  const auto after = gpt->forward(changed);
  EXPECT_TRUE(torch::allclose(before.slice(1, 0, t), after.slice(1, 0, t), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(before.slice(1, t), after.slice(1, t), 0, 1e-6));
}

TEST(GptModel, ShortTrainingLowersTheLoss) {
  torch::manual_seed(2);
  CharVocabulary vocab(kText);
  const auto data = make_char_windows(vocab.encode(kText), 8, 4);
  GptModel model(tiny_config(vocab.size()), 1e-2);
  auto optimizer = model.configure_optimizers().optimizer;
  // Matrices decay, biases and LayerNorm parameters do not.
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  const Batch batch(data.inputs, data.targets);
  std::vector<double> losses;
  for (int step = 0; step < 60; ++step) {
    optimizer->zero_grad();
    auto loss = model.training_step(batch, step);
    loss.backward();
    optimizer->step();
    losses.push_back(loss.item<double>());
  }
  EXPECT_NEAR(losses.front(), std::log(static_cast<double>(vocab.size())), 0.5);
  EXPECT_LT(losses.back(), 0.6 * losses.front()) << "first " << losses.front();
}

TEST(GptModel, LogsTrainAndValidationLoss) {
  torch::manual_seed(3);
  CharVocabulary vocab(kText);
  const auto data = make_char_windows(vocab.encode(kText), 8, 8);
  GptModel model(tiny_config(vocab.size()));
  const Batch batch(data.inputs, data.targets);
  LoggedMetrics metrics;
  model.set_log_target(&metrics, data.size());
  const double train_loss = model.training_step(batch, 0).item<double>();
  model.validation_step(batch, 0);
  const auto means = metrics.means();
  EXPECT_NEAR(means.at("train_loss"), train_loss, 1e-6);
  EXPECT_NEAR(means.at("val_loss"), train_loss, 1e-6);
  EXPECT_TRUE(metrics.options().at("val_loss").prog_bar());
}

TEST(Generate, ContinuesThePromptReproduciblyFromTheVocabulary) {
  torch::manual_seed(4);
  CharVocabulary vocab(kText);
  auto gpt = make_gpt(tiny_config(vocab.size()));
  const auto text = generate(gpt, vocab, "the ", 30, 1.0, 7);
  ASSERT_EQ(text.size(), 34u);
  EXPECT_EQ(text.substr(0, 4), "the ");
  for (char c : text) EXPECT_NE(vocab.chars().find(c), std::string::npos) << c;
  EXPECT_EQ(generate(gpt, vocab, "the ", 30, 1.0, 7), text);
  EXPECT_NE(generate(gpt, vocab, "the ", 30, 1.0, 8), text);
  // top_k 1 is greedy whatever the seed; temperature 0 too.
  const auto greedy = generate(gpt, vocab, "the ", 12, 0.0, 1);
  EXPECT_EQ(generate(gpt, vocab, "the ", 12, 1.0, 2, /*top_k=*/1), greedy);
  // Sampling leaves the model in the mode it found it in.
  EXPECT_TRUE(gpt->is_training());
  EXPECT_THROW(generate(gpt, vocab, "the Fox", 5, 1.0, 0), std::invalid_argument);
}

// --- pipelined equals single process ------------------------------------------------------------

constexpr uint64_t kSeed = 11;
constexpr int64_t kSteps = 3;
constexpr int64_t kBatchSize = 5;  // odd: chunks 2 gives micro-batches of 3 and 2 rows
// SGD, not the model's AdamW: Adam's first step is about lr * sign(gradient), which would turn
// float rounding in a near-zero gradient into a full-size difference in a parameter.
constexpr double kLearningRate = 0.5;
// Embedding and block 0 | block 1, final LayerNorm and head: the cut is between the blocks.
const std::vector<int64_t> kBalance = {2, 3};
const std::vector<std::string> kModes = {"always", "except_last", "never"};
const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "zbh1"};

struct GptData {
  CharVocabulary vocab{kText};
  TensorDataset windows = make_char_windows(vocab.encode(kText), 8, 3);

  std::pair<at::Tensor, at::Tensor> batch(int64_t step) const {
    const int64_t begin = step * kBatchSize;
    return {windows.inputs.slice(0, begin, begin + kBatchSize),
            windows.targets.slice(0, begin, begin + kBatchSize)};
  }
};

torch::nn::Sequential make_test_gpt(const GptData& data) {
  torch::manual_seed(kSeed);
  return make_gpt(tiny_config(data.vocab.size()));
}

std::string result_path(const std::string& dir, const std::string& mode,
                        const std::string& schedule, int64_t rank) {
  return dir + "/" + mode + "_" + schedule + "_rank" + std::to_string(rank) + ".pt";
}

// Trains kSteps through a 2-stage Pipe and saves [losses (last stage), this stage's parameters].
PIPETRAIN_WORKER(gpt_pipe_worker) {
  auto world = World::connect(*select_cluster_environment());
  const std::string dir = testing::env_or("RESULT_DIR", ".");
  const GptData data;
  for (const auto& mode : kModes) {
    for (const auto& schedule : kSchedules) {
      Pipe pipe(make_test_gpt(data),
                PipeOptions().balance(kBalance).chunks(2).checkpoint(mode).schedule(schedule),
                world);
      torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(kLearningRate));
      std::vector<at::Tensor> saved{torch::zeros({kSteps}, torch::kFloat64)};
      for (int64_t step = 0; step < kSteps; ++step) {
        const auto [inputs, targets] = data.batch(step);
        optimizer.zero_grad();
        auto loss = pipe.forward_backward(
            inputs, kBatchSize,
            [&, &targets = targets](const at::Tensor& out, const MicroBatch& mb) {
              return cross_entropy(out, targets.slice(0, mb.begin, mb.end));
            });
        optimizer.step();
        if (loss.defined()) saved[0][step] = loss.item<double>();
      }
      for (const auto& p : pipe.parameters()) saved.push_back(p.detach());
      torch::save(saved, result_path(dir, mode, schedule, world->rank()));
    }
  }
}

TEST(GptPipe, TwoStagesEqualOneProcess) {
  const auto dir = testing::make_temp_dir("gpt-pipe");
  ASSERT_EQ(testing::run_ranks(2, "gpt_pipe_worker", {{"RESULT_DIR", dir}}), 0);

  const GptData data;
  auto gpt = make_test_gpt(data);
  torch::optim::SGD optimizer(gpt->parameters(), torch::optim::SGDOptions(kLearningRate));
  std::vector<double> expected_losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [inputs, targets] = data.batch(step);
    optimizer.zero_grad();
    auto loss = cross_entropy(gpt->forward(inputs), targets);
    loss.backward();
    optimizer.step();
    expected_losses.push_back(loss.item<double>());
  }
  const auto expected_parameters = gpt->parameters();
  // Training moved the weights, so equal parameters below mean equal gradients.
  EXPECT_LT(expected_losses.back(), expected_losses.front());

  // fp32 throughout: relative 1e-5 and absolute 1e-6 on every loss and parameter element. The
  // only difference allowed is the order in which the two micro-batches' gradients are summed.
  for (const auto& mode : kModes) {
    for (const auto& schedule : kSchedules) {
      SCOPED_TRACE(mode + " " + schedule);
      std::vector<at::Tensor> parameters;
      std::vector<at::Tensor> last;
      for (int64_t rank = 0; rank < 2; ++rank) {
        std::vector<at::Tensor> saved;
        torch::load(saved, result_path(dir, mode, schedule, rank));
        parameters.insert(parameters.end(), saved.begin() + 1, saved.end());
        if (rank == 1) last = saved;
      }
      for (int64_t step = 0; step < kSteps; ++step) {
        EXPECT_NEAR(last[0][step].item<double>(), expected_losses[step],
                    1e-5 * std::abs(expected_losses[step]))
            << "step " << step;
      }
      ASSERT_EQ(parameters.size(), expected_parameters.size());
      for (size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(torch::allclose(parameters[i], expected_parameters[i], 1e-5, 1e-6))
            << "parameter " << i << " differs by "
            << (parameters[i] - expected_parameters[i]).abs().max().item<double>();
      }
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::cli::gpt_test
