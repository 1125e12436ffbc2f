// Tokens of one split written as llm.c writes them (its dev/data/fineweb.py): shards of a fixed
// number of tokens, the last one shorter, each an llm.c token file (a 1024-byte header, then
// uint16 tokens, or uint32 ones where the vocabulary has more than 65536 ids), named
// `<name>_<split>_<number>.bin` with a six-digit number counting from 000000 in each split
// (`tinystories_train_000000.bin`, `tinystories_val_000000.bin`). A document may run on from
// one shard into the next, as in llm.c's. With loss masks, each shard has its mask beside it
// (`<name>_<split>_<number>.mask`, pipetrain/loss_mask.h), cut where the shard is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::cli {

class ShardWriter {
 public:
  // Shards of `shard_size` tokens (1 to 2^31 - 1, what an llm.c header counts) in `folder`, of
  // uint32 tokens if `wide` else uint16; with a loss mask each if `masked`.
  ShardWriter(std::string folder, std::string name, std::string split, int64_t shard_size,
              bool wide, bool masked = false);

  // Appends `ids` (and, masked, `mask`: 1 for each id that carries loss, 0 for the others),
  // writing every shard they fill. Throws std::invalid_argument for an id that does not fit the
  // width or a mask of another length than `ids`, std::runtime_error when a shard cannot be
  // written.
  void append(const std::vector<int64_t>& ids, const std::vector<uint8_t>& mask = {});
  // Writes the tokens left (a shorter last shard), then removes this name and split's shards (and
  // masks) of higher numbers an earlier run left in the folder, and, unmasked, masks an earlier
  // run left beside this run's shards: the folder then holds this run's alone.
  void finish();

  const std::vector<std::string>& shards() const { return shards_; }
  int64_t tokens() const { return tokens_; }

 private:
  void write_shard();  // the buffer's tokens, as the next shard
  std::string shard_name(size_t number) const;

  std::string folder_, name_, split_;
  int64_t shard_size_;
  bool wide_;
  bool masked_;
  // The tokens of the shard being filled, at the shard's width (a default shard of 100M tokens
  // holds 200 MB of uint16 ids).
  std::vector<uint16_t> narrow_;
  std::vector<uint32_t> wide_tokens_;
  std::vector<uint8_t> mask_;        // masked: the shard's mask
  std::vector<std::string> shards_;  // written, file names
  int64_t tokens_ = 0;
};

}  // namespace pipetrain::cli
