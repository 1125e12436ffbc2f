// Packed documents: rows of a batch that hold several documents one after another, each ended by
// a separator token (the EOS that `pipetrain prepare-data` writes after every document). With
// document masking a decoder keeps them apart, as if each were trained alone: a token attends only
// to the tokens before it in its own document, and its position counts from its document's first
// token. The first layer finds the documents from the token ids; the document index of every token
// then rides along with the activations through every block (a std::tuple across a stage
// boundary, which a pipe sends as one packet) and the final norm drops it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <tuple>

#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/embedding.h>
#include <pipetrain/nn/rms_norm.h>

namespace pipetrain::nn {

// Token ids [B, T] -> the index of each token's document in its row [B, T] (int64, from 0): the
// separators before it in the row. A separator belongs to the document it ends.
at::Tensor document_ids(const at::Tensor& ids, int64_t separator);

// Document indices [B, T] (non-decreasing along each row) -> each token's position in its
// document [B, T]: 0 at the row's first token and wherever the index changes.
at::Tensor document_positions(const at::Tensor& documents);

// Document indices [B, T] -> [B, 1, T, T], true where query i may attend to key j: j <= i and the
// same document (causal and block-diagonal).
at::Tensor document_attention_mask(const at::Tensor& documents);

// The activations [B, T, n_embd] and the document index of each token [B, T].
using ActivationsInDocuments = std::tuple<at::Tensor, at::Tensor>;

// nn::Embedding that also finds the documents of its ids (parameter "weight", as Embedding's).
class DocumentEmbeddingImpl : public EmbeddingImpl {
 public:
  DocumentEmbeddingImpl(const EmbeddingOptions& options, int64_t separator);
  ActivationsInDocuments forward(const at::Tensor& ids);

  int64_t separator;
};
TORCH_MODULE(DocumentEmbedding);

// nn::DecoderBlock over packed documents: its attention masked to each document, its rotary
// positions restarting at each document's first token.
class DocumentDecoderBlockImpl : public DecoderBlockImpl {
 public:
  using DecoderBlockImpl::DecoderBlockImpl;
  ActivationsInDocuments forward(const ActivationsInDocuments& input);
};
TORCH_MODULE(DocumentDecoderBlock);

// nn::RMSNorm of the activations, the documents dropped: the decoder's final norm, after which
// the head sees one tensor.
class DocumentRMSNormImpl : public RMSNormImpl {
 public:
  using RMSNormImpl::RMSNormImpl;
  at::Tensor forward(const ActivationsInDocuments& input);
};
TORCH_MODULE(DocumentRMSNorm);

}  // namespace pipetrain::nn
