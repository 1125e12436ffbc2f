// What the fuzz targets share: the input written where the reader under test opens it (tmpfs
// where there is one), and a small model whose checkpoint seeds the corpus.
#pragma once

#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace pipetrain::fuzz {

// A directory of this process's own for the current input.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    const std::string path = base + "/pipetrain-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(path);
    return path;
  }();
  return dir;
}

inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// Two Linear layers: the model whose weights the checkpoint target loads.
inline torch::nn::Sequential small_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
}

}  // namespace pipetrain::fuzz
