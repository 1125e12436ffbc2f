#include "io/file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace pipetrain {
namespace {

// No std::filesystem here: the torch 2.11 wheel's libtorch.so exports its own copies of those
// symbols, and a binary that binds to them first crashes (seen with remove_all).

// Writes all of `data`, retrying short writes; returns 0 or the errno of the failure.
int write_all(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd, bytes, std::min<size_t>(size, size_t{1} << 30));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return written < 0 ? errno : EIO;
    bytes += written;
    size -= static_cast<size_t>(written);
  }
  return 0;
}

// Makes a rename durable; best effort, the file is already complete and in place.
void sync_parent_directory(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dir = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_(path_ + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int error = errno;
    throw std::runtime_error("cannot write " + path_ + ": cannot create the temporary file " +
                             temp_ + " (" + std::strerror(error) +
                             "); check that the directory exists and is writable");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& what, int error) const {
  throw std::runtime_error("cannot write " + path_ + ": " + what + " " + temp_ + " failed (" +
                           std::strerror(error) + "); check free disk space and quota; " + path_ +
                           " was left as it was");
}

void AtomicFile::write(const void* data, size_t size) {
  if (const int error = write_all(fd_, data, size); error != 0) fail("writing", error);
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("fsync of", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("closing", errno);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    throw std::runtime_error("cannot write " + path_ + ": renaming " + temp_ + " over it failed (" +
                             std::strerror(error) + "); check that " + path_ +
                             " is not a directory and is writable");
  }
  committed_ = true;
  sync_parent_directory(path_);
}

void write_file(const std::string& path, std::string_view text) {
  AtomicFile file(path);
  file.write(text);
  file.commit();
}

void append_file(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    throw std::runtime_error("cannot write " + path + " (" + std::strerror(error) +
                             "); check that the directory exists and is writable");
  }
  struct stat before {};
  const bool sized = ::fstat(fd, &before) == 0;
  const int error = write_all(fd, text.data(), text.size());
  if (error != 0 && sized) {
    if (::ftruncate(fd, before.st_size) != 0) {
      // The file keeps a partial record; the error below still says what happened.
    }
  }
  ::close(fd);
  if (error != 0) {
    throw std::runtime_error("cannot write " + path + " (" + std::strerror(error) +
                             "); check free disk space and quota");
  }
}

}  // namespace pipetrain
