// A decoder of one's own built from pipetrain::nn (small Llama and Qwen3 shapes: GQA, RoPE, tied
// and untied heads, q/k norms), trained by pipetrain::LanguageModel, under `pipe` on 2 and 3
// stages with every schedule and checkpoint mode (and with gradient-accumulation fusion) against
// `single` on the same data and initial weights, and a checkpoint of 3 stages resumed on 2; plus
// the Sequential's layout, presets and errors.
// Tolerance: fp32 on CPU, relative 1e-5 on per-step losses and absolute 1e-5 on the final
// weights, where only the order of sums differs (micro-batches, the tied gradient's two halves);
// 5e-5 on the weights of the resumed run, whose two layouts' roundings add up (measured: 1.6e-5
// at most on an Intel machine, 3.1e-5 on an AMD EPYC one, whose BLAS kernels round otherwise;
// one weight of an MLP).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "pipetrain/pipetrain.h"
#include "support/command.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::decoder_test {
namespace {

namespace fs = std::filesystem;

nn::DecoderConfig small_llama() {
  return tiny_llama3_config(/*vocab_size=*/40, /*n_layer=*/3, /*block_size=*/8);
}

nn::DecoderConfig small_qwen3() {
  return tiny_qwen3_config(/*vocab_size=*/40, /*n_layer=*/3, /*block_size=*/8);
}

// Random token windows, the same on every rank.
TensorDataset token_windows() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(19);
  const auto tokens = torch::randint(0, 40, {32, 9}, generator, torch::kInt64);
  return {tokens.slice(1, 0, 8), tokens.slice(1, 1, 9)};
}

// Its fusion, where a layout fuses: q, k, v and gate, up through linears().
struct DecoderRun : PipeLayoutRun {
  bool qwen3 = false;
  bool per_rank = false;  // nn::decoder_layers, built per rank, rather than nn::decoder

  template <typename Visit>
  void fields(Visit&& visit) {
    PipeLayoutRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, qwen3, per_rank);
  }
};

// Two epochs of 4 batches of 8 windows, shuffled, gradients clipped at 1.
void train(const DecoderRun& run) {
  Trainer trainer(run.trainer_options().max_epochs(2).gradient_clip_val(1.0));
  torch::manual_seed(5);
  const auto config = run.qwen3 ? small_qwen3() : small_llama();
  // LanguageModel's loss is the in-place one (the logits' gradient written over them): here under
  // every schedule and checkpoint mode below.
  const auto options = LanguageModelOptions().lr(3e-3);
  auto model = run.per_rank ? LanguageModel(nn::decoder_layers(config), options)
                            : LanguageModel(nn::decoder(config), options);
  const DataLoader loader(token_windows(), DataLoaderOptions().batch_size(8).shuffle(true).seed(2));
  trainer.fit(model, loader, nullptr, run.resume);
  if (run.per_rank) {
    // Nothing built but what this process runs.
    const auto runs = model.local_layers()->named_parameters();
    for (const auto& item : model.layers()->named_parameters()) {
      if (!runs.contains(item.key())) {
        throw std::logic_error("rank " + std::to_string(worker_rank()) + " built " + item.key() +
                               ", a layer it does not run");
      }
    }
  }
}

PIPETRAIN_WORKER(decoder_worker) { train_from_env(train); }

void train_in_ranks(const DecoderRun& run) { testing::train_in_ranks(run, "decoder_worker"); }

class DecoderPipe : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  std::string dir = make_temp_dir("decoder");
};

void expect_layouts_train_as_one_process(const std::string& dir, bool qwen3,
                                         const std::vector<PipeLayout>& layouts,
                                         bool per_rank = false, double weight_tolerance = 1e-5) {
  DecoderRun single;
  single.root = dir + "/single";
  single.qwen3 = qwen3;
  single.per_rank = per_rank;
  train(single);
  const auto expected = read_csv_column(metrics_csv(single.root), "train_loss");
  ASSERT_EQ(expected.size(), 8u);
  for (const auto& layout : layouts) {
    DecoderRun pipe;
    pipe.set_layout(layout, dir, /*chunks=*/4);
    SCOPED_TRACE(pipe.root);
    pipe.qwen3 = qwen3;
    pipe.per_rank = per_rank;
    train_in_ranks(pipe);
    expect_same_losses(expected, read_csv_column(metrics_csv(pipe.root), "train_loss"), 1e-5);
    expect_same_weights(single.final_weights(), pipe.final_weights(), weight_tolerance);
  }
}

// Llama: GQA, llama3 RoPE scaling, the tied embedding on the first stage and the head on the last.
// Weights within 3e-5, as for the per-rank layouts below: four micro-batches' sums against one
// batch's, through AdamW, round differently on different CPUs (measured on an AVX-512 Xeon: 1.25e-5
// and 1.01e-5 at most with fused accumulation, one weight of an MLP; within 1e-5 elsewhere).
TEST_F(DecoderPipe, TiedLlamaTrainsAsOneProcessInEveryScheduleAndCheckpointMode) {
  expect_layouts_train_as_one_process(dir, false,
                                      {{2, "gpipe", "always"},
                                       {2, "1f1b", "except_last"},
                                       {2, "zbh1", "never"},
                                       {3, "1f1b", "never"},
                                       {3, "zbh2", "always"},
                                       {2, "interleaved1f1b", "except_last", 2},
                                       {2, "zbv", "always", 2},
                                       {2, "zbh1", "never", 1, true},
                                       {3, "gpipe", "always", 1, true}},
                                      /*per_rank=*/false, /*weight_tolerance=*/3e-5);
}

// Qwen3: multi-query, q/k norms, head_dim apart from n_embd / n_head, an untied head.
TEST_F(DecoderPipe, UntiedQwen3TrainsAsOneProcess) {
  expect_layouts_train_as_one_process(dir, true,
                                      {{2, "1f1b", "always"},
                                       {3, "gpipe", "except_last"},
                                       {3, "zbh1", "never"},
                                       {2, "zbh2", "never", 1, true}});
}

// Built per rank (nn::decoder_layers): each process builds its own layers, each from its own seed,
// the tied head a matrix of its own that starts from the embedding's values; training equals
// `single` built the same way, interleaved stages and every checkpoint mode too. Weights within
// 3e-5 (these initial weights: 1.25e-5 at most, one MLP weight, the same in every layout: four
// micro-batches' sums against one batch's, through AdamW).
TEST_F(DecoderPipe, BuiltPerRankTrainsAsOneProcess) {
  expect_layouts_train_as_one_process(
      dir, false,
      {{2, "1f1b", "except_last"}, {3, "zbh1", "never"}, {2, "interleaved1f1b", "always", 2}},
      /*per_rank=*/true, /*weight_tolerance=*/3e-5);
}

// Three stages stop mid-epoch (built per rank or whole, `per_rank`); two stages resume from their
// checkpoint, built each way of `resumed`, and with the three train as one uninterrupted `single`
// run built as the three were. Weights within 5e-5: the two layouts' roundings add up (measured:
// 1.6e-5 and, on an AMD EPYC machine, 3.1e-5 at most, one weight of an MLP).
void expect_three_stages_resume_on_two(const std::string& dir, bool per_rank,
                                       const std::vector<bool>& resumed) {
  DecoderRun single;
  single.root = dir + "/single";
  single.per_rank = per_rank;
  train(single);
  DecoderRun three;
  three.root = dir + "/three";
  three.strategy = "pipe";
  three.devices = 3;
  three.chunks = 2;
  three.max_steps = 3;  // mid-epoch 0
  three.per_rank = per_rank;
  train_in_ranks(three);
  // Each rank's layers in a file of its own: the first holds the embedding, not the final norm.
  const auto first =
      read_safetensors_header(three.last_checkpoint() + "/model-00001-of-00003.safetensors");
  EXPECT_TRUE(first.count("0.weight"));
  EXPECT_FALSE(first.count("4.weight"));
  for (const bool resumed_per_rank : resumed) {
    DecoderRun two;
    two.root = dir + "/two-" + std::to_string(resumed_per_rank);
    SCOPED_TRACE(two.root);
    two.strategy = "pipe";
    two.devices = 2;
    two.chunks = 4;
    two.schedule = "1f1b";
    two.resume = three.last_checkpoint();
    two.per_rank = resumed_per_rank;
    train_in_ranks(two);
    expect_same_losses(read_csv_column(metrics_csv(single.root), "train_loss"),
                       train_losses_in({metrics_csv(three.root), metrics_csv(two.root)}), 1e-5);
    expect_same_weights(single.final_weights(), two.final_weights(), 5e-5);
  }
}

TEST_F(DecoderPipe, ACheckpointOfThreeStagesResumesOnTwo) {
  expect_three_stages_resume_on_two(dir, /*per_rank=*/false, {false, true});
}

// The tied head's copy goes by the embedding's name in the checkpoint's weights and optimizer
// state, so a model built per rank resumes as one built whole does, and the other way round.
TEST_F(DecoderPipe, BuiltPerRankResumesUnderAnotherLayout) {
  expect_three_stages_resume_on_two(dir, /*per_rank=*/true, {true, false});
}

TEST(Decoder, LayersAreEmbeddingBlocksNormAndHeadWithHuggingFaceNames) {
  torch::manual_seed(1);
  const auto config = small_qwen3();
  auto layers = nn::decoder(config);
  ASSERT_EQ(layers->size(), 6u);  // embedding, 3 blocks, norm, head
  const auto parameters = layers->named_parameters();
  EXPECT_EQ(parameters["0.weight"].sizes(), (std::vector<int64_t>{40, 32}));
  EXPECT_EQ(parameters["1.self_attn.q_proj.weight"].sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(parameters["1.self_attn.k_proj.weight"].sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(parameters["2.self_attn.k_norm.weight"].sizes(), (std::vector<int64_t>{16}));
  EXPECT_EQ(parameters["3.mlp.gate_proj.weight"].sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(parameters["3.post_attention_layernorm.weight"].sizes(), (std::vector<int64_t>{32}));
  EXPECT_EQ(parameters["4.weight"].sizes(), (std::vector<int64_t>{32}));
  EXPECT_EQ(parameters["5.weight"].sizes(), (std::vector<int64_t>{40, 32}));
  // Depth initialisation: block l's residual projections drawn at 0.02 / sqrt(2 (l + 1)).
  EXPECT_NEAR(parameters["1.mlp.gate_proj.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(parameters["3.mlp.down_proj.weight"].std().item<double>(), 0.02 / std::sqrt(6.0),
              0.002);
  EXPECT_EQ(layers->forward(torch::zeros({2, 8}, torch::kInt64)).sizes(),
            (std::vector<int64_t>{2, 8, 40}));

  auto tied = nn::decoder(small_llama())->named_parameters();
  EXPECT_TRUE(tied["0.weight"].is_same(tied["5.weight"]));
}

TEST(Decoder, SdpaAndExplicitAttentionGiveTheSameLogits) {
  for (auto config : {small_llama(), small_qwen3()}) {
    torch::manual_seed(2);
    auto fused = nn::decoder(config);
    config.attention_kernel = nn::AttentionKernel::kExplicit;
    torch::manual_seed(2);
    auto written_out = nn::decoder(config);
    const auto ids = torch::randint(0, 40, {2, 8});
    EXPECT_TRUE(torch::allclose(fused->forward(ids), written_out->forward(ids), 1e-5, 1e-5));
  }
}

// A checkpoint of an untied decoder (embedding and head two tensors) loaded into a tied one (one
// tensor under both names) is refused: loaded name by name, the embedding silently took the head's
// values. A tied model's own weights, which hold the tensor under both names, still load.
TEST(Decoder, AnUntiedCheckpointIsRefusedByATiedDecoder) {
  auto config = small_llama();
  config.tie_word_embeddings = false;
  torch::manual_seed(3);
  std::map<std::string, at::Tensor> untied;
  for (const auto& item : nn::decoder(config)->named_parameters()) {
    untied[item.key()] = item.value().detach().clone();
  }
  const std::string dir = make_temp_dir("untied-checkpoint");
  save_safetensors(dir + "/model.safetensors", untied);
  config.tie_word_embeddings = true;
  auto tied = nn::decoder(config);
  const auto before = tied->named_parameters()["0.weight"].detach().clone();
  EXPECT_THROW(load_weights(tied, untied, "untied"), std::runtime_error);
  EXPECT_THROW(load_weights(tied, StoredWeights(dir)), std::runtime_error);
  EXPECT_TRUE(torch::equal(tied->named_parameters()["0.weight"], before));
  fs::remove_all(dir);

  std::map<std::string, at::Tensor> own;
  for (const auto& item : nn::decoder(config)->named_parameters()) {
    own[item.key()] = item.value().detach().clone();
  }
  load_weights(tied, own, "tied");
  EXPECT_TRUE(torch::equal(tied->named_parameters()["5.weight"], own.at("0.weight")));
}

// A head tied to an embedding the user froze once registered the shared tensor as trainable,
// unfreezing the embedding too: it keeps the tensor's own flag, either way.
TEST(Decoder, AHeadTiedToAFrozenEmbeddingKeepsItFrozen) {
  for (const bool frozen : {true, false}) {
    nn::Embedding embedding(nn::EmbeddingOptions(40, 8));
    embedding->weight.set_requires_grad(!frozen);
    nn::LMHead head(embedding);
    EXPECT_TRUE(head->weight.is_same(embedding->weight));
    EXPECT_EQ(embedding->weight.requires_grad(), !frozen);
  }
}

TEST(Decoder, PresetsHaveThePublishedShapes) {
  const auto llama = nn::decoder_preset("llama3.2-1b");
  EXPECT_EQ(llama.n_layer, 16);
  EXPECT_EQ(llama.n_embd, 2048);
  EXPECT_EQ(llama.kv_heads(), 8);
  EXPECT_EQ(llama.head_size(), 64);
  EXPECT_EQ(llama.vocab_size, 128256);
  EXPECT_TRUE(llama.tie_word_embeddings);
  EXPECT_EQ(llama.rope.factor(), 32);
  const auto qwen = nn::decoder_preset("qwen3-0.6b");
  EXPECT_EQ(qwen.head_size(), 128);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_EQ(qwen.rms_norm_eps, 1e-6);
  EXPECT_FALSE(nn::decoder_preset("qwen3-8b").tie_word_embeddings);
  // 1.24 B parameters (a tied head counted once), as published.
  const double matmul =
      nn::decoder_flops_per_token(llama) - 12.0 * 16 * 2048 * static_cast<double>(llama.block_size);
  EXPECT_NEAR(matmul / 6, 1.2358e9, 0.001e9);
  EXPECT_THROW(nn::decoder_preset("llama4"), std::invalid_argument);
}

TEST(Decoder, RefusesAShapeThatDoesNotFit) {
  auto config = small_llama();
  config.n_kv_head = 3;
  try {
    nn::decoder(config);
    FAIL() << "4 heads over 3 key/value heads were accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("--n-kv-head 3"), std::string::npos) << error.what();
  }
  config = small_llama();
  config.rope.rope_type("yarn");
  EXPECT_THROW(nn::decoder(config), std::invalid_argument);
  config = small_llama();
  config.document_separator = 40;  // packed documents' separator, outside a vocabulary of 40
  EXPECT_THROW(nn::decoder(config), std::invalid_argument);
}

}  // namespace
}  // namespace pipetrain::testing::decoder_test
