#include "models/shard_writer.h"

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <utility>

#include <pipetrain/loss_mask.h>
#include <pipetrain/token_dataset.h>

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;

template <typename Token>
void append_as(std::vector<Token>& buffer, const int64_t* ids, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id > static_cast<int64_t>(std::numeric_limits<Token>::max())) {
      throw std::invalid_argument("token id " + std::to_string(id) + " does not fit a " +
                                  std::to_string(8 * sizeof(Token)) + "-bit shard");
    }
    buffer.push_back(static_cast<Token>(id));
  }
}

}  // namespace

ShardWriter::ShardWriter(std::string folder, std::string name, std::string split,
                         int64_t shard_size, bool wide, bool masked)
    : folder_(std::move(folder)),
      name_(std::move(name)),
      split_(std::move(split)),
      shard_size_(shard_size),
      wide_(wide),
      masked_(masked) {
  if (shard_size < 1 || shard_size > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("--shard-size " + std::to_string(shard_size) +
                                ": give 1 to 2147483647 tokens (what an llm.c header counts)");
  }
}

std::string ShardWriter::shard_name(size_t number) const {
  char digits[16];
  std::snprintf(digits, sizeof(digits), "%06zu", number);
  return name_ + "_" + split_ + "_" + digits + ".bin";
}

void ShardWriter::append(const std::vector<int64_t>& ids, const std::vector<uint8_t>& mask) {
  if (mask.size() != (masked_ ? ids.size() : 0)) {
    throw std::invalid_argument("a loss mask of " + std::to_string(mask.size()) + " values for " +
                                std::to_string(ids.size()) + " tokens" +
                                (masked_ ? "" : " of shards without masks"));
  }
  // A shard at a time: the ids that fill the one being filled, then the rest.
  size_t from = 0;
  while (from < ids.size()) {
    const size_t held = wide_ ? wide_tokens_.size() : narrow_.size();
    const size_t take = std::min(ids.size() - from, static_cast<size_t>(shard_size_) - held);
    if (wide_) {
      append_as(wide_tokens_, ids.data() + from, take);
    } else {
      append_as(narrow_, ids.data() + from, take);
    }
    if (masked_) {
      const auto first = mask.begin() + static_cast<std::ptrdiff_t>(from);
      mask_.insert(mask_.end(), first, first + static_cast<std::ptrdiff_t>(take));
    }
    from += take;
    tokens_ += static_cast<int64_t>(take);
    if (held + take == static_cast<size_t>(shard_size_)) write_shard();
  }
}

void ShardWriter::write_shard() {
  const std::string path = (fs::path(folder_) / shard_name(shards_.size())).string();
  if (wide_) {
    write_token_file(path, wide_tokens_, TokenFileFormat::kLlmc);
    wide_tokens_.clear();
  } else {
    write_token_file(path, narrow_, TokenFileFormat::kLlmc);
    narrow_.clear();
  }
  if (masked_) {
    write_loss_mask(loss_mask_path(path), mask_);
    mask_.clear();
  } else {
    // A mask an earlier run left beside this name would be read as this shard's.
    std::error_code error;
    fs::remove(loss_mask_path(path), error);
  }
  shards_.push_back(fs::path(path).filename().string());
}

void ShardWriter::finish() {
  if (!wide_tokens_.empty() || !narrow_.empty()) write_shard();
  // An earlier run's shards past this run's last would read as part of this data.
  for (size_t number = shards_.size();; ++number) {
    std::error_code error;
    const fs::path shard = fs::path(folder_) / shard_name(number);
    fs::remove(loss_mask_path(shard.string()), error);
    if (!fs::remove(shard, error)) break;
  }
}

}  // namespace pipetrain::cli
