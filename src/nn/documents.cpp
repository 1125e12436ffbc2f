#include "pipetrain/nn/documents.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace pipetrain::nn {

at::Tensor document_ids(const at::Tensor& ids, int64_t separator) {
  if (ids.dim() != 2) {
    throw std::invalid_argument("document_ids: token ids [B, T], got a " +
                                std::to_string(ids.dim()) + "-D tensor");
  }
  const auto ends = ids.eq(separator).to(torch::kInt64);
  return ends.cumsum(1) - ends;  // separators strictly before each token
}

at::Tensor document_positions(const at::Tensor& documents) {
  const int64_t time = documents.size(1);
  const auto steps =
      torch::arange(time, documents.options().dtype(torch::kInt64)).expand_as(documents);
  // A document's first token: the row's first, or where the index changes.
  auto starts = torch::ones_like(documents, torch::kBool);
  if (time > 1) {
    starts.narrow(1, 1, time - 1)
        .copy_(documents.narrow(1, 1, time - 1).ne(documents.narrow(1, 0, time - 1)));
  }
  // The latest start at or before each token, which the running maximum of the starts' steps is.
  const auto start_steps = std::get<0>(torch::cummax(steps * starts, 1));
  return steps - start_steps;
}

at::Tensor document_attention_mask(const at::Tensor& documents) {
  const int64_t time = documents.size(1);
  const auto steps = torch::arange(time, documents.options().dtype(torch::kInt64));
  const auto causal = steps.unsqueeze(0) <= steps.unsqueeze(1);  // [T, T]: key j <= query i
  const auto same_document = documents.unsqueeze(2).eq(documents.unsqueeze(1));  // [B, T, T]
  return same_document.logical_and(causal).unsqueeze(1);
}

DocumentEmbeddingImpl::DocumentEmbeddingImpl(const EmbeddingOptions& options, int64_t separator_)
    : EmbeddingImpl(options), separator(separator_) {
  if (separator < 0 || separator >= options.vocab_size()) {
    throw std::invalid_argument("DocumentEmbedding: the separator " + std::to_string(separator) +
                                " is not an id of the vocabulary of " +
                                std::to_string(options.vocab_size()));
  }
}

ActivationsInDocuments DocumentEmbeddingImpl::forward(const at::Tensor& ids) {
  return {EmbeddingImpl::forward(ids), document_ids(ids, separator)};
}

ActivationsInDocuments DocumentDecoderBlockImpl::forward(const ActivationsInDocuments& input) {
  const auto& [x, documents] = input;
  return {forward_in_documents(x, documents), documents};
}

at::Tensor DocumentRMSNormImpl::forward(const ActivationsInDocuments& input) {
  return RMSNormImpl::forward(std::get<0>(input));
}

}  // namespace pipetrain::nn
