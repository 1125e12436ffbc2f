// A whole file mapped read-only, the way the token and loss-mask readers open theirs: the bytes
// stay readable after the descriptor is closed, and the reader unmaps them (munmap) when done.
#pragma once

#include <cstddef>
#include <string>

namespace pipetrain {

struct FileMapping {
  void* address = nullptr;  // null for an empty file
  size_t bytes = 0;
};

// Maps `path`; `what` names the file in errors ("token file"). Throws std::invalid_argument
// naming it, the path and the system's reason when it cannot be opened, read or mapped.
FileMapping map_file(const std::string& path, const std::string& what);

}  // namespace pipetrain
