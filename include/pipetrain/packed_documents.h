// The data side of packed documents (pipetrain/nn/documents.h): with document masking a row holds
// several documents, each ended by a separator token, and trains as if each were alone. Alone, a
// document's first token is never a target (nothing before it in its document predicts it), so
// the target whose input is a separator, the next document's first token, carries no loss here
// either (Megatron's --eod-mask-loss): the sum of the row's losses is then the sum of its
// documents' own.
#pragma once

#include <cstdint>
#include <memory>

#include "pipetrain/data.h"

namespace pipetrain {

// `tokens` (token windows: data [n, T] ids, target [n, T] the next ids) with every target whose
// input is `separator` made kMaskedTarget (pipetrain/loss_mask.h), so a loss must leave
// kMaskedTarget out (ignore_index -100) and count the targets left: a mean over a micro-batch's
// rows would weigh its documents unlike. A stage asked for targets alone reads the inputs too, to
// find the separators.
std::shared_ptr<const Dataset> mask_document_starts(std::shared_ptr<const Dataset> tokens,
                                                    int64_t separator);

}  // namespace pipetrain
