// A loss mask: which tokens of a token file are targets that carry loss, for fine-tuning where
// only some tokens are learnt (an assistant's turns of a conversation, a prompt's completion).
// It lies beside its token file, named as it with `.mask` for `.bin`
// (`chat_train_000000.bin` -> `chat_train_000000.mask`; `train.bin` -> `train.mask`), and holds:
// - a header of 256 int32, as llm.c's shards have: magic 20261207, version 1, the token count;
// - then one uint8 per token of the token file: 1 where the token is a target with loss, 0 where
//   it is context alone.
// Its own magic keeps it from being read as tokens (TokenDataset refuses it), and its count ties
// it to its token file. A TokenDataset reads the mask beside its file where there is one: a
// window's target whose mask is 0 becomes kMaskedTarget.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

// A masked target: -100, the ignore_index of torch's cross_entropy and of
// chunked_cross_entropy, so the loss leaves it out.
inline constexpr int64_t kMaskedTarget = -100;

// The magic of a loss mask's header (its first int32).
inline constexpr int32_t kLossMaskMagic = 20261207;

// Where the loss mask of token file `token_path` lies: `.bin` replaced by `.mask`, or `.mask`
// added to a name without `.bin`.
std::string loss_mask_path(const std::string& token_path);

// Writes `mask` (one 0 or 1 per token) to `path`, replacing the file atomically. Throws
// std::invalid_argument for a value other than 0 or 1 or more tokens than the header counts
// (2^31 - 1), std::runtime_error with the system's reason when the write fails.
void write_loss_mask(const std::string& path, const std::vector<uint8_t>& mask);

// A loss mask file, memory-mapped (never read whole).
class LossMask {
 public:
  // Maps `path` and checks it: its header (magic, version, a count equal to the bytes that follow)
  // and every value 0 or 1. Throws std::invalid_argument naming the file and what is wrong.
  explicit LossMask(const std::string& path);
  ~LossMask();
  LossMask(const LossMask&) = delete;
  LossMask& operator=(const LossMask&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  // Whether token `index` carries loss; index in [0, num_tokens()).
  bool carries_loss(int64_t index) const { return values_[index] != 0; }
  const uint8_t* values() const { return values_; }

 private:
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  const uint8_t* values_ = nullptr;
  int64_t num_tokens_ = 0;
};

}  // namespace pipetrain
