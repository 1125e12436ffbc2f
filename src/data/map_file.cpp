#include "data/map_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace pipetrain {

FileMapping map_file(const std::string& path, const std::string& what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::invalid_argument("cannot open " + what + " " + path + ": " + std::strerror(errno));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    throw std::invalid_argument("cannot read " + what + " " + path + ": " + std::strerror(error));
  }
  FileMapping mapping;
  mapping.bytes = static_cast<size_t>(info.st_size);
  void* address = nullptr;
  if (mapping.bytes > 0) address = mmap(nullptr, mapping.bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_error = errno;
  close(fd);  // the mapping keeps the file
  if (address == MAP_FAILED) {
    throw std::invalid_argument("cannot map " + what + " " + path + ": " +
                                std::strerror(map_error));
  }
  mapping.address = address;
  return mapping;
}

}  // namespace pipetrain
