// Packed documents (pipetrain/nn/documents.h, pipetrain/packed_documents.h): rows holding several
// documents, each ended by a separator, through a decoder with document masking give each
// document's logits and gradients exactly as the document run alone through the same decoder
// without it (positions from 0, nothing else to attend to), for Llama and Qwen3 shapes (GQA,
// multi-query, q/k norms) and both attention kernels. Tolerance: 1e-10 in fp64, where only the
// order of sums differs (the masked keys' zero weights, the gradients' sums over documents); on a
// GPU in fp32 (SDPA's memory-efficient kernel with the mask, against flash or its causal kernel
// alone), 1e-4.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "pipetrain/pipetrain.h"
#include "support/small_models.h"

namespace pipetrain::testing::documents_test {
namespace {

// Ints, as the literals of the tensors below.
constexpr int kSeparator = 3;
constexpr int kMasked = static_cast<int>(kMaskedTarget);

nn::DecoderConfig packed(nn::DecoderConfig config) {
  config.document_separator = kSeparator;
  return config;
}

nn::DecoderConfig llama(nn::AttentionKernel kernel) {
  nn::DecoderConfig config =
      tiny_llama3_config(/*vocab_size=*/40, /*n_layer=*/2, /*block_size=*/12);
  config.attention_kernel = kernel;
  return config;
}

nn::DecoderConfig qwen3(nn::AttentionKernel kernel) {
  nn::DecoderConfig config = tiny_qwen3_config(/*vocab_size=*/40, /*n_layer=*/2, /*block_size=*/12);
  config.attention_kernel = kernel;
  return config;
}

// Two rows of 12 tokens: documents of 4, 5 and 3 tokens (the last cut by the row's end), and one
// of 2 then one of 10 (cut). Each document but a cut one ends with the separator.
at::Tensor packed_ids() {
  return torch::tensor({{10, 11, 12, kSeparator, 20, 21, 22, 23, kSeparator, 30, 31, 32},
                        {15, kSeparator, 5, 6, 7, 8, 9, 13, 14, 16, 17, 18}},
                       torch::kInt64);
}

// [row, first token, tokens] of each document of packed_ids().
const std::vector<std::vector<int64_t>> kDocuments = {
    {0, 0, 4}, {0, 4, 5}, {0, 9, 3}, {1, 0, 2}, {1, 2, 10}};

struct Precision {
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kDouble;
  double tolerance = 1e-10;
};

// The same weights in a decoder without document masking.
torch::nn::Sequential alone_copy(const torch::nn::Sequential& packed_model,
                                 const nn::DecoderConfig& config, const Precision& precision) {
  auto alone = nn::decoder(config);
  alone->to(precision.device, precision.dtype);
  torch::NoGradGuard no_grad;
  const auto source = packed_model->named_parameters();
  for (auto& item : alone->named_parameters()) item.value().copy_(source[item.key()]);
  return alone;
}

void expect_packed_equals_alone(const nn::DecoderConfig& config, const Precision& precision = {}) {
  torch::manual_seed(0);
  auto model = nn::decoder(packed(config));
  model->to(precision.device, precision.dtype);
  auto alone = alone_copy(model, config, precision);
  const double tolerance = precision.tolerance;

  const auto ids = packed_ids().to(precision.device);
  // Targets: the next id; one whose input is a separator starts another document (masked).
  auto target = torch::roll(ids, -1, 1);
  target.select(1, 11).fill_(1);
  target = target.masked_fill(ids.eq(kSeparator), kMaskedTarget);
  const auto logits = model->forward(ids);
  const auto loss =
      torch::nn::functional::cross_entropy(logits.reshape({-1, 40}), target.reshape(-1),
                                           torch::nn::functional::CrossEntropyFuncOptions()
                                               .ignore_index(kMaskedTarget)
                                               .reduction(torch::kSum));
  loss.backward();

  double alone_loss = 0;
  for (const auto& document : kDocuments) {
    const auto row = document[0], first = document[1], length = document[2];
    const auto doc_ids = ids.select(0, row).narrow(0, first, length).unsqueeze(0);
    const auto doc_targets = target.select(0, row).narrow(0, first, length).unsqueeze(0);
    const auto doc_logits = alone->forward(doc_ids);
    EXPECT_TRUE(torch::allclose(doc_logits,
                                logits.select(0, row).narrow(0, first, length).unsqueeze(0),
                                tolerance, tolerance))
        << "row " << row << ", document at " << first;
    const auto doc_loss =
        torch::nn::functional::cross_entropy(doc_logits.reshape({-1, 40}), doc_targets.reshape(-1),
                                             torch::nn::functional::CrossEntropyFuncOptions()
                                                 .ignore_index(kMaskedTarget)
                                                 .reduction(torch::kSum));
    doc_loss.backward();  // the gradients of every document add up in `alone`
    alone_loss += doc_loss.item<double>();
  }
  EXPECT_NEAR(loss.item<double>(), alone_loss, tolerance * std::abs(alone_loss));
  const auto alone_parameters = alone->named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::allclose(item.value().grad(), alone_parameters[item.key()].grad(), tolerance,
                                tolerance))
        << item.key();
  }
}

TEST(PackedDocuments, FoundFromTheSeparators) {
  const auto ids = torch::tensor({{1, 3, 2, 3, 3, 5}}, torch::kInt64);
  const auto documents = nn::document_ids(ids, 3);
  EXPECT_TRUE(torch::equal(documents, torch::tensor({{0, 0, 1, 1, 2, 3}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(nn::document_positions(documents),
                           torch::tensor({{0, 1, 0, 1, 0, 0}}, torch::kInt64)));
  const auto allowed = nn::document_attention_mask(documents).squeeze();
  // Query 3 (the second document's separator) sees keys 2 and 3 alone.
  EXPECT_TRUE(
      torch::equal(allowed.select(0, 3), torch::tensor({false, false, true, true, false, false})));
}

TEST(PackedDocuments, LlamaEqualsEachDocumentAlone) {
  expect_packed_equals_alone(llama(nn::AttentionKernel::kSdpa));
  expect_packed_equals_alone(llama(nn::AttentionKernel::kExplicit));
}

TEST(PackedDocuments, Qwen3EqualsEachDocumentAlone) {
  expect_packed_equals_alone(qwen3(nn::AttentionKernel::kSdpa));
  expect_packed_equals_alone(qwen3(nn::AttentionKernel::kExplicit));
}

TEST(PackedDocuments, OnAGpuEqualsEachDocumentAlone) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const Precision fp32{torch::Device(torch::kCUDA, 0), torch::kFloat, 1e-4};
  expect_packed_equals_alone(llama(nn::AttentionKernel::kSdpa), fp32);
  expect_packed_equals_alone(qwen3(nn::AttentionKernel::kSdpa), fp32);
}

TEST(PackedDocuments, PerRankLayersKeepTheDocumentsAndTheTie) {
  const auto specs = nn::decoder_layers(packed(llama(nn::AttentionKernel::kSdpa)));
  auto built = build_layers(specs, std::vector<bool>(specs.size(), true), /*seed=*/1);
  const auto logits = built->forward(packed_ids());
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 12, 40}));
  // The head built on the same process shares the embedding's tensor.
  EXPECT_TRUE(built->ptr(4)->named_parameters()["weight"].is_same(
      built->ptr(0)->named_parameters()["weight"]));
}

TEST(PackedDocuments, TargetsStartingADocumentAreMasked) {
  const auto ids = torch::tensor({1, 2, kSeparator, 4, 5, kSeparator, 6, 7, 8}, torch::kInt64);
  auto dataset =
      std::make_shared<TensorDataset>(torch::stack({ids.narrow(0, 0, 4), ids.narrow(0, 4, 4)}),
                                      torch::stack({ids.narrow(0, 1, 4), ids.narrow(0, 5, 4)}));
  const auto masked = mask_document_starts(dataset, kSeparator);
  const auto both = masked->get_batch({0, 1}, FieldsWanted{});
  EXPECT_TRUE(torch::equal(both.data, dataset->inputs));
  EXPECT_TRUE(torch::equal(
      both.target,
      torch::tensor({{2, kSeparator, kMasked, 5}, {kSeparator, kMasked, 7, 8}}, torch::kInt64)));
  // A last stage asks for targets alone: the same targets, no data.
  const auto targets = masked->get_batch({1, 0}, FieldsWanted{/*data=*/false, /*target=*/true});
  EXPECT_FALSE(targets.data.defined());
  EXPECT_TRUE(torch::equal(targets.target, both.target.flip(0)));
}

}  // namespace
}  // namespace pipetrain::testing::documents_test
