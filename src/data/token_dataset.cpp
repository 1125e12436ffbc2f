#include "pipetrain/token_dataset.h"

#include <sys/mman.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "data/map_file.h"
#include "io/file_writer.h"
#include "pipetrain/loss_mask.h"

namespace pipetrain {
namespace {

// llm.c's shard header: 256 int32, of which the first three are used (magic, version, token
// count). The magic and version say the tokens' width (llm.c's dev/data/data_common.py).
constexpr int32_t kLlmcGpt2Magic = 20240520;  // version 1: uint16 tokens
constexpr int32_t kLlmcGpt2Version = 1;
constexpr int32_t kLlmcLlama3Magic = 20240801;  // version 7: uint32 tokens
constexpr int32_t kLlmcLlama3Version = 7;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// How many of a raw file's first tokens the uint32 check reads.
constexpr int64_t kTokensLookedAt = 4096;

// Whether 16-bit tokens are more likely 32-bit ones read in halves: at least 64 of them, not all
// zero, and every second one 0 (the high halves of little-endian ids below 65536). Real 16-bit
// token data is never like that.
bool looks_like_uint32(const unsigned char* bytes, int64_t count) {
  const int64_t looked_at = std::min(count, kTokensLookedAt) & ~int64_t{1};
  if (looked_at < 64) return false;
  const auto* tokens = reinterpret_cast<const uint16_t*>(bytes);
  bool any_low = false;
  for (int64_t i = 0; i < looked_at; i += 2) {
    if (tokens[i + 1] != 0) return false;
    any_low |= tokens[i] != 0;
  }
  return any_low;
}

// Whether a file that does not start with llm.c's magic has llm.c's header all the same, under
// another magic: a token count in the third int32 that is what follows the 1024 bytes at 2 or 4
// bytes a token, and the 253 int32 after it zero, as llm.c leaves them. Raw tokens are never like
// that (hundreds of id-0 tokens in a row, after one or two spelling the file's length); read as
// raw, the header would train as tokens.
bool looks_like_llmc_header(const unsigned char* bytes, size_t size) {
  if (size < kLlmcHeaderBytes) return false;
  int32_t header[256];
  std::memcpy(header, bytes, sizeof(header));
  for (size_t i = 3; i < 256; ++i) {
    if (header[i] != 0) return false;
  }
  const auto count = static_cast<size_t>(header[2]);
  const size_t payload = size - kLlmcHeaderBytes;
  return header[2] > 0 && (payload == count * 2 || payload == count * 4);
}

// How many tokens the vocabulary check reads at a time: after each slice its pages are dropped
// from the process, so resident memory stays at one slice (32 or 64 MiB) whatever the file.
constexpr int64_t kTokensPerSlice = int64_t{1} << 24;

// The position of the first of `count` tokens whose id is `vocab_size` or more, or -1. The
// reduction to a slice's largest id is a loop the compiler vectorizes; the position is looked for
// only in a slice holding one.
template <typename Token>
int64_t first_token_outside(const unsigned char* first, int64_t count, int64_t vocab_size) {
  if (vocab_size > static_cast<int64_t>(std::numeric_limits<Token>::max())) return -1;
  const auto* tokens = reinterpret_cast<const Token*>(first);
  const long page = sysconf(_SC_PAGESIZE);
  for (int64_t begin = 0; begin < count; begin += kTokensPerSlice) {
    const int64_t end = std::min(count, begin + kTokensPerSlice);
    Token largest = 0;
    for (int64_t i = begin; i < end; ++i) largest = std::max(largest, tokens[i]);
    if (largest >= vocab_size) {
      for (int64_t i = begin; i < end; ++i) {
        if (tokens[i] >= vocab_size) return i;
      }
    }
    // Whole pages the slice covered alone (the next slice reads the last one's rest).
    const auto from = reinterpret_cast<uintptr_t>(tokens + begin) / page * page;
    const auto to = reinterpret_cast<uintptr_t>(tokens + end) / page * page;
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
  }
  return -1;
}

size_t width_of(TokenDtype dtype) { return dtype == TokenDtype::kUint32 ? 4 : 2; }
std::string name_of(TokenDtype dtype) { return dtype == TokenDtype::kUint32 ? "uint32" : "uint16"; }

// What llm.c writes, for the messages about a shard that is not that.
const char* const kLlmcShards =
    "llm.c writes version 1 (GPT-2, uint16 tokens) under magic 20240520 and version 7 (Llama 3, "
    "uint32 tokens) under magic 20240801";

}  // namespace

TokenDataset::TokenDataset(const std::string& path, int64_t block_size, int64_t vocab_size,
                           std::optional<TokenDtype> dtype)
    : path_(path), block_size_(block_size) {
  if (block_size < 1) {
    throw std::invalid_argument("block size " + std::to_string(block_size) +
                                " must be at least 1 (--block-size)");
  }
  if (vocab_size < 1) {
    throw std::invalid_argument("vocabulary size " + std::to_string(vocab_size) +
                                " must be at least 1 (--vocab-size)");
  }
  const FileMapping mapped = map_file(path, "token file");
  mapping_ = mapped.address;
  mapped_bytes_ = mapped.bytes;
  // From here on the destructor does not run if the constructor throws: unmap by hand.
  auto fail = [&](const std::string& what) {
    if (mapping_ != nullptr) munmap(mapping_, mapped_bytes_);
    mapping_ = nullptr;
    throw std::invalid_argument("token file " + path + " " + what);
  };
  const auto* bytes = static_cast<const unsigned char*>(mapping_);
  size_t first_token = 0;
  int32_t magic = 0;
  if (mapped_bytes_ >= sizeof(magic)) std::memcpy(&magic, bytes, sizeof(magic));
  if (magic == kLlmcGpt2Magic || magic == kLlmcLlama3Magic) {
    format_ = TokenFileFormat::kLlmc;
    if (mapped_bytes_ < kLlmcHeaderBytes) {
      fail("starts with llm.c's magic " + std::to_string(magic) + " but is shorter (" +
           std::to_string(mapped_bytes_) + " bytes) than its 1024-byte header");
    }
    int32_t header[3];
    std::memcpy(header, bytes, sizeof(header));
    const int32_t expected_version =
        magic == kLlmcGpt2Magic ? kLlmcGpt2Version : kLlmcLlama3Version;
    if (header[1] != expected_version) {
      fail("is an llm.c shard of version " + std::to_string(header[1]) + " (magic " +
           std::to_string(magic) + "), which llm.c does not write: " + kLlmcShards);
    }
    dtype_ = magic == kLlmcGpt2Magic ? TokenDtype::kUint16 : TokenDtype::kUint32;
    if (dtype && *dtype != dtype_) {
      fail("is an llm.c shard of " + name_of(dtype_) + " tokens (magic " + std::to_string(magic) +
           ", version " + std::to_string(header[1]) + "), not " + name_of(*dtype) +
           " ones as asked");
    }
    first_token = kLlmcHeaderBytes;
    const size_t width = width_of(dtype_);
    const size_t payload = mapped_bytes_ - kLlmcHeaderBytes;
    if (payload % width != 0 || static_cast<int64_t>(payload / width) != header[2]) {
      fail("has a header saying " + std::to_string(header[2]) + " tokens, but " +
           std::to_string(payload) + " bytes follow it (" + std::to_string(payload / width) + " " +
           name_of(dtype_) + " tokens" +
           (payload % width ? " and " + std::to_string(payload % width) + " bytes more" : "") +
           "): the file is truncated or not an llm.c shard");
    }
  } else if (magic == kLossMaskMagic) {
    fail("is a loss mask (magic " + std::to_string(magic) +
         "), not tokens: give the token file it lies beside (" +
         (path.size() > 5 && path.compare(path.size() - 5, 5, ".mask") == 0
              ? path.substr(0, path.size() - 5) + ".bin"
              : std::string("its name with .bin for .mask")) +
         ")");
  } else if (looks_like_llmc_header(bytes, mapped_bytes_)) {
    int32_t header[3];
    std::memcpy(header, bytes, sizeof(header));
    fail("starts with what is laid out as llm.c's 1024-byte header (a count of " +
         std::to_string(header[2]) +
         " tokens, the bytes that follow it, and zeros) but with magic " +
         std::to_string(header[0]) + " and version " + std::to_string(header[1]) +
         ", which llm.c does not write (" + kLlmcShards +
         "): read as raw tokens its header would train as tokens; write it again with llm.c's "
         "magic and version, or without the header");
  } else {
    dtype_ = dtype.value_or(TokenDtype::kUint16);
    const size_t width = width_of(dtype_);
    if (mapped_bytes_ % width != 0) {
      fail(width == 2 ? "has an odd number of bytes (" + std::to_string(mapped_bytes_) +
                            "), so it is not uint16 tokens (nanoGPT's .bin) nor an llm.c shard "
                            "(magic 20240520 or 20240801)"
                      : "has " + std::to_string(mapped_bytes_) +
                            " bytes, not a multiple of 4, so it is not uint32 tokens nor an llm.c "
                            "shard (magic 20240520 or 20240801)");
    }
  }
  num_tokens_ = static_cast<int64_t>((mapped_bytes_ - first_token) / width_of(dtype_));
  tokens_ = bytes + first_token;
  if (!dtype && dtype_ == TokenDtype::kUint16 && looks_like_uint32(tokens_, num_tokens_)) {
    fail("looks like 32-bit tokens (every second 16-bit value of its first " +
         std::to_string(std::min<int64_t>(num_tokens_, kTokensLookedAt)) +
         " is 0, as little-endian uint32 ids below 65536 give), which read as nanoGPT's 16-bit "
         "ones would train on the wrong ids: give its width (TokenDtype::kUint32), or write it "
         "as an llm.c shard, whose header says it");
  }
  if (num_tokens_ < block_size_ + 1) {
    fail("holds " + std::to_string(num_tokens_) + " tokens, fewer than one window of block size " +
         std::to_string(block_size_) + " + 1: use a longer file or a smaller --block-size");
  }
  // Every id is checked now, once: a window read only late in a run (or never, in a short one)
  // would otherwise let a bad file pass.
  madvise(mapping_, mapped_bytes_, MADV_SEQUENTIAL);
  const int64_t outside = dtype_ == TokenDtype::kUint32
                              ? first_token_outside<uint32_t>(tokens_, num_tokens_, vocab_size)
                              : first_token_outside<uint16_t>(tokens_, num_tokens_, vocab_size);
  madvise(mapping_, mapped_bytes_, MADV_NORMAL);  // windows are read in shuffled order
  if (outside >= 0) {
    const int64_t id = dtype_ == TokenDtype::kUint32
                           ? reinterpret_cast<const uint32_t*>(tokens_)[outside]
                           : reinterpret_cast<const uint16_t*>(tokens_)[outside];
    fail("holds token id " + std::to_string(id) + " at position " + std::to_string(outside) +
         ", not below the vocabulary size " + std::to_string(vocab_size) +
         " (--vocab-size): give the vocabulary the file was tokenized with");
  }
  const std::string mask_path = loss_mask_path(path);
  if (std::filesystem::exists(mask_path)) {
    try {
      mask_ = std::make_unique<const LossMask>(mask_path);
    } catch (const std::invalid_argument& e) {
      fail("has a loss mask beside it that cannot be read: " + std::string(e.what()));
    }
    if (mask_->num_tokens() != num_tokens_) {
      fail("holds " + std::to_string(num_tokens_) + " tokens, and its loss mask " + mask_path +
           " " + std::to_string(mask_->num_tokens()) +
           ": they were not written together; prepare the data again");
    }
  }
}

TokenDataset::~TokenDataset() {
  if (mapping_ != nullptr) munmap(mapping_, mapped_bytes_);
}

int64_t TokenDataset::size() const { return (num_tokens_ - 1) / block_size_; }

Batch TokenDataset::get_batch(const std::vector<int64_t>& indices,
                              const FieldsWanted& wanted) const {
  const int64_t rows = static_cast<int64_t>(indices.size());
  const int64_t width = block_size_ + 1;
  auto windows = torch::empty({rows, width}, torch::kInt64);
  int64_t* out = windows.data_ptr<int64_t>();
  const long page = sysconf(_SC_PAGESIZE);
  const auto base = reinterpret_cast<uintptr_t>(mapping_);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t index = indices[static_cast<size_t>(row)];
    if (index < 0 || index >= size()) {
      throw std::out_of_range("window " + std::to_string(index) + " is outside token file " +
                              path_ + " (" + std::to_string(size()) + " windows)");
    }
    const size_t token_bytes = width_of(dtype_);
    const unsigned char* window = tokens_ + static_cast<size_t>(index * block_size_) * token_bytes;
    int64_t* row_out = out + row * width;
    // Both widths are aligned: the mapping starts on a page and a header is 1024 bytes.
    if (dtype_ == TokenDtype::kUint32) {
      const auto* tokens = reinterpret_cast<const uint32_t*>(window);
      for (int64_t t = 0; t < width; ++t) row_out[t] = tokens[t];
    } else {
      const auto* tokens = reinterpret_cast<const uint16_t*>(window);
      for (int64_t t = 0; t < width; ++t) row_out[t] = tokens[t];
    }
    // The bytes are copied out: drop this window's pages from the process (the page cache keeps
    // them), so an epoch over a large file does not leave all of it resident.
    const auto begin = reinterpret_cast<uintptr_t>(window) / page * page;
    const auto end = reinterpret_cast<uintptr_t>(window + static_cast<size_t>(width) * token_bytes);
    madvise(reinterpret_cast<void*>(begin),
            std::min<size_t>(end - begin, mapped_bytes_ - (begin - base)), MADV_DONTNEED);
  }
  Batch batch;
  if (wanted.data) batch.data = windows.slice(1, 0, block_size_).contiguous();
  if (wanted.target) {
    batch.target = windows.slice(1, 1, width).contiguous();
    if (mask_) {
      // Target t of window i is token i x block_size + 1 + t: masked where its mask is 0.
      int64_t* targets = batch.target.data_ptr<int64_t>();
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t first = indices[static_cast<size_t>(row)] * block_size_ + 1;
        for (int64_t t = 0; t < block_size_; ++t) {
          if (!mask_->carries_loss(first + t)) targets[row * block_size_ + t] = kMaskedTarget;
        }
      }
    }
  }
  return batch;
}

namespace {

template <typename Token>
void write_tokens(const std::string& path, const std::vector<Token>& tokens,
                  TokenFileFormat format) {
  if (format == TokenFileFormat::kLlmc &&
      tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("token file " + path + ": " + std::to_string(tokens.size()) +
                                " tokens are more than an llm.c header counts (2^31 - 1)");
  }
  AtomicFile file(path);
  if (format == TokenFileFormat::kLlmc) {
    const bool wide = sizeof(Token) == 4;
    int32_t header[256] = {};
    header[0] = wide ? kLlmcLlama3Magic : kLlmcGpt2Magic;
    header[1] = wide ? kLlmcLlama3Version : kLlmcGpt2Version;
    header[2] = static_cast<int32_t>(tokens.size());
    file.write(header, sizeof(header));
  }
  file.write(tokens.data(), tokens.size() * sizeof(Token));
  file.commit();
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens,
                      TokenFileFormat format) {
  write_tokens(path, tokens, format);
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      TokenFileFormat format) {
  write_tokens(path, tokens, format);
}

}  // namespace pipetrain
