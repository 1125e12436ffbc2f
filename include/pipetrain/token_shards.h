// Several token files read as one dataset: llm.c's shards (`fineweb_train_000000.bin`,
// `fineweb_train_000001.bin`, ...) or what `pipetrain prepare-data --tokenizer` writes, named by a
// folder or a glob. Each file is a TokenDataset (mapped, checked at open); their windows follow
// one another in the files' order, and no window crosses from one file into the next, as llm.c's
// loader reads them (a file's last few tokens, fewer than a window, are not trained on). One file
// gives the windows of its TokenDataset, index for index, so a DataLoader's order, and a resume's
// position in it, are those of that file read alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/data.h"
#include "pipetrain/token_dataset.h"

namespace pipetrain {

// The token files `source` names, in sorted order (the order of the dataset's windows):
// - a glob pattern (holding *, ? or [): the files it matches;
// - a folder: its files named `*_<split>_*.bin` (llm.c's shards of that split, as prepare-data
//   names them), or where it has none its `<split>.bin` (nanoGPT's layout);
// - anything else: that one file.
// Throws std::invalid_argument naming `source` when a pattern matches nothing or a folder holds
// no such file.
std::vector<std::string> find_token_files(const std::string& source, const std::string& split);

class TokenShards : public Dataset {
 public:
  // Opens every file of `paths` as TokenDataset(path, block_size, vocab_size, dtype), with its
  // checks and errors. Throws std::invalid_argument for no paths, files of different widths
  // (tokens of one vocabulary are written at one width), or files with a loss mask beside them
  // mixed with files without one (naming one of each: their targets would be weighed unlike).
  TokenShards(const std::vector<std::string>& paths, int64_t block_size, int64_t vocab_size,
              std::optional<TokenDtype> dtype = std::nullopt);

  // Windows of all files.
  int64_t size() const override;
  // The windows `indices` (file after file), read as each file's TokenDataset reads them.
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override;

  const std::vector<std::shared_ptr<const TokenDataset>>& files() const { return files_; }
  int64_t num_tokens() const;
  TokenDtype dtype() const { return files_.front()->dtype(); }
  // Whether the files have loss masks (pipetrain/loss_mask.h): targets may be kMaskedTarget.
  bool masked() const { return files_.front()->masked(); }

 private:
  std::vector<std::shared_ptr<const TokenDataset>> files_;
  std::vector<int64_t> first_window_;  // per file, the index of its first window; then size()
};

}  // namespace pipetrain
