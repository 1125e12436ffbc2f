// Writing files so that a failure loses nothing and says why. A full disk, a quota or a size
// limit makes a write fail: the error names the file and the system's reason ("No space left on
// device"), and nothing half-written is left in place of what was there.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pipetrain {

// A file written under a temporary name beside `path` and renamed over it once complete and on
// disk (fsync). Throws std::runtime_error on any failed write; the temporary file is removed
// unless commit() succeeded, and `path` keeps what it held.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Flushes, closes and renames the file into place.
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what, int error) const;

  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// `text` written to `path` through an AtomicFile.
void write_file(const std::string& path, std::string_view text);

// Appends `text` to `path` (created if missing) and flushes it to the kernel; throws
// std::runtime_error naming the file and the reason when the write fails, after cutting the file
// back to its old length (no half line).
void append_file(const std::string& path, std::string_view text);

}  // namespace pipetrain
