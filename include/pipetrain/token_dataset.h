// A language model's training data: a file of tokens, memory-mapped (never read whole), cut into
// windows of block_size + 1 tokens that give the inputs and, shifted by one, the targets. The
// layouts nanoGPT and llm.c write are read, told apart by their first four bytes:
// - nanoGPT's train.bin / val.bin: raw little-endian uint16 tokens (uint32 ones when the reader is
//   told so: a raw file cannot say its width);
// - llm.c's shards: a header of 256 int32 (magic, version, token count), then the tokens, whose
//   width the header gives as llm.c's dev/data/data_common.py writes it: magic 20240520 and
//   version 1 for GPT-2's uint16 tokens, magic 20240801 and version 7 for Llama 3's uint32 ones
//   (vocabularies above 65536 ids need those).
// Window i starts at token i x block_size, so consecutive windows share one token and every token
// but the first is a target exactly once per epoch; the DataLoader shuffles the windows' order.
// A loss mask beside the file (pipetrain/loss_mask.h: `train.bin` -> `train.mask`), where there is
// one, says which tokens carry loss: a target whose mask is 0 is kMaskedTarget (-100), the ignore
// index of the losses.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/data.h"

namespace pipetrain {

class LossMask;

// kNanoGpt: raw tokens, no header; kLlmc: llm.c's 1024-byte header first.
enum class TokenFileFormat { kNanoGpt, kLlmc };
// The width of a file's token ids.
enum class TokenDtype { kUint16, kUint32 };

class TokenDataset : public Dataset {
 public:
  // Maps `path`. `dtype` is the width of a raw file's tokens (unset: uint16, nanoGPT's); an llm.c
  // shard's header gives its own, which a set `dtype` must match. Throws std::invalid_argument
  // naming the file and what is wrong with it: a byte count that is not a whole number of tokens,
  // a header whose magic, version or token count disagrees with the file's size (also llm.c's
  // header under another magic, which read as raw tokens would train on its bytes), a header's
  // width other than `dtype`, fewer than block_size + 1 tokens, or a token id of vocab_size or
  // more (the first one's position named). Every id is read for that once, here, in slices
  // whose pages are dropped again (0.2 s a GiB from the page cache, 16M tokens resident at most;
  // where not cached, the disk's read speed); a vocabulary above the width's largest id skips it.
  // Also refused: a loss mask given as the token file, and a loss mask beside it that LossMask
  // refuses or whose token count is not the file's.
  TokenDataset(const std::string& path, int64_t block_size, int64_t vocab_size,
               std::optional<TokenDtype> dtype = std::nullopt);
  ~TokenDataset() override;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  // Windows in the file.
  int64_t size() const override;
  // data [n, block_size] and target [n, block_size], int64 (a target the loss mask masks is
  // kMaskedTarget). Reads only these windows' bytes (and
  // lets the kernel drop their pages again, so resident memory does not grow with the file).
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t block_size() const { return block_size_; }
  TokenFileFormat format() const { return format_; }
  TokenDtype dtype() const { return dtype_; }
  // Whether a loss mask lies beside the file (its targets may be kMaskedTarget).
  bool masked() const { return mask_ != nullptr; }

 private:
  std::string path_;
  int64_t block_size_;
  TokenFileFormat format_ = TokenFileFormat::kNanoGpt;
  TokenDtype dtype_ = TokenDtype::kUint16;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // the first token's byte
  int64_t num_tokens_ = 0;
  std::unique_ptr<const LossMask> mask_;  // null: every target carries loss
};

// Writes `tokens` to `path` in `format`, replacing the file atomically, at the tokens' width:
// uint16 (an llm.c shard of GPT-2's header) or uint32 (raw, or llm.c's Llama 3 header). Throws
// std::invalid_argument for more tokens than an llm.c header can count (2^31 - 1), and
// std::runtime_error with the path and the system's reason when the write fails.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens,
                      TokenFileFormat format = TokenFileFormat::kNanoGpt);
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      TokenFileFormat format = TokenFileFormat::kNanoGpt);

}  // namespace pipetrain
