#include "pipetrain/loss_mask.h"

#include <sys/mman.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "data/map_file.h"
#include "io/file_writer.h"

namespace pipetrain {
namespace {

// The header: 256 int32 as llm.c's shards have (magic, version, token count, then zeros), which
// keeps the values that follow as aligned as a shard's tokens.
constexpr int32_t kLossMaskVersion = 1;
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

}  // namespace

std::string loss_mask_path(const std::string& token_path) {
  std::filesystem::path path(token_path);
  if (path.extension() == ".bin") return path.replace_extension(".mask").string();
  return token_path + ".mask";
}

void write_loss_mask(const std::string& path, const std::vector<uint8_t>& mask) {
  if (mask.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("loss mask " + path + ": " + std::to_string(mask.size()) +
                                " tokens are more than its header counts (2^31 - 1)");
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] > 1) {
      throw std::invalid_argument("loss mask " + path + ": value " + std::to_string(mask[i]) +
                                  " at token " + std::to_string(i) + " is not 0 or 1");
    }
  }
  int32_t header[256] = {};
  header[0] = kLossMaskMagic;
  header[1] = kLossMaskVersion;
  header[2] = static_cast<int32_t>(mask.size());
  AtomicFile file(path);
  file.write(header, sizeof(header));
  file.write(mask.data(), mask.size());
  file.commit();
}

LossMask::LossMask(const std::string& path) {
  const FileMapping mapped = map_file(path, "loss mask");
  mapping_ = mapped.address;
  mapped_bytes_ = mapped.bytes;
  // The destructor does not run if the constructor throws: unmap by hand.
  const auto fail = [&](const std::string& what) {
    if (mapping_ != nullptr) munmap(mapping_, mapped_bytes_);
    mapping_ = nullptr;
    throw std::invalid_argument("loss mask " + path + " " + what);
  };
  int32_t header[3] = {};
  if (mapped_bytes_ >= kHeaderBytes) std::memcpy(header, mapping_, sizeof(header));
  if (mapped_bytes_ < kHeaderBytes || header[0] != kLossMaskMagic) {
    fail("does not start with a loss mask's header (magic " + std::to_string(kLossMaskMagic) +
         ", 1024 bytes): write it with pipetrain prepare-data (or write_loss_mask), or remove it");
  }
  if (header[1] != kLossMaskVersion) {
    fail("is of version " + std::to_string(header[1]) + "; this pipetrain reads version " +
         std::to_string(kLossMaskVersion));
  }
  const size_t count = mapped_bytes_ - kHeaderBytes;
  if (header[2] < 0 || static_cast<size_t>(header[2]) != count) {
    fail("has a header saying " + std::to_string(header[2]) + " tokens, but " +
         std::to_string(count) + " values follow it: the file is truncated");
  }
  num_tokens_ = static_cast<int64_t>(count);
  values_ = static_cast<const uint8_t*>(mapping_) + kHeaderBytes;
  for (int64_t i = 0; i < num_tokens_; ++i) {
    if (values_[i] > 1) {
      fail("holds " + std::to_string(values_[i]) + " at token " + std::to_string(i) +
           ", where a mask holds 0 (no loss) or 1 (loss)");
    }
  }
}

LossMask::~LossMask() {
  if (mapping_ != nullptr) munmap(mapping_, mapped_bytes_);
}

}  // namespace pipetrain
