// A language model's training data: a file of tokens, memory-mapped (never read whole), cut into
// windows of block_size + 1 tokens that give the inputs and, shifted by one, the targets. Two
// layouts are read, told apart by their first four bytes:
// - nanoGPT's train.bin / val.bin: raw little-endian uint16 tokens;
// - llm.c's shards: a header of 256 int32 (magic 20240520, version 1, token count), then the
//   uint16 tokens.
// Window i starts at token i x block_size, so consecutive windows share one token and every token
// but the first is a target exactly once per epoch; the DataLoader shuffles the windows' order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/data.h"

namespace pipetrain {

enum class TokenFileFormat { kNanoGpt, kLlmc };

class TokenDataset : public Dataset {
 public:
  // Maps `path`. Throws std::invalid_argument naming the file and what is wrong with it: an odd
  // byte count, a header whose magic, version or token count disagrees with the file's size, or
  // fewer than block_size + 1 tokens. Token ids are checked against vocab_size as they are read.
  TokenDataset(const std::string& path, int64_t block_size, int64_t vocab_size);
  ~TokenDataset() override;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  // Windows in the file.
  int64_t size() const override;
  // data [n, block_size] and target [n, block_size], int64. Reads only these windows' bytes (and
  // lets the kernel drop their pages again, so resident memory does not grow with the file).
  // Throws std::invalid_argument naming the file, position and id of a token >= vocab_size.
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t block_size() const { return block_size_; }
  TokenFileFormat format() const { return format_; }

 private:
  std::string path_;
  int64_t block_size_;
  int64_t vocab_size_;
  TokenFileFormat format_ = TokenFileFormat::kNanoGpt;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
};

// Writes `tokens` to `path` in `format`, replacing the file atomically; throws std::runtime_error
// with the path and the system's reason when the write fails.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens,
                      TokenFileFormat format = TokenFileFormat::kNanoGpt);

}  // namespace pipetrain
