#include "pipetrain/packed_documents.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "pipetrain/loss_mask.h"

namespace pipetrain {
namespace {

class DocumentStartsMasked : public Dataset {
 public:
  DocumentStartsMasked(std::shared_ptr<const Dataset> tokens, int64_t separator)
      : tokens_(std::move(tokens)), separator_(separator) {}

  int64_t size() const override { return tokens_->size(); }

  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override {
    if (!wanted.target) return tokens_->get_batch(indices, wanted);
    Batch batch = tokens_->get_batch(indices, FieldsWanted{/*data=*/true, /*target=*/true});
    if (batch.data.sizes() != batch.target.sizes()) {
      throw std::invalid_argument(
          "mask_document_starts: token windows have data and target of one shape [n, T], got " +
          std::to_string(batch.data.dim()) + "-D data and " + std::to_string(batch.target.dim()) +
          "-D target of other sizes");
    }
    batch.target = batch.target.masked_fill(batch.data.eq(separator_), kMaskedTarget);
    if (!wanted.data) batch.data = at::Tensor();
    return batch;
  }

 private:
  std::shared_ptr<const Dataset> tokens_;
  int64_t separator_;
};

}  // namespace

std::shared_ptr<const Dataset> mask_document_starts(std::shared_ptr<const Dataset> tokens,
                                                    int64_t separator) {
  if (!tokens) throw std::invalid_argument("mask_document_starts: no dataset");
  return std::make_shared<DocumentStartsMasked>(std::move(tokens), separator);
}

}  // namespace pipetrain
