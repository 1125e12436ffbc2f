// Model weights in Hugging Face's safetensors format, so checkpoints move between pipetrain and the
// Python ecosystem (`safetensors.torch.load_file` reads what we write, and we read what it writes)
// without pickle: an 8-byte little-endian header length, a JSON header naming every tensor's
// dtype, shape and byte range, then the tightly packed little-endian tensor bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace pipetrain {

// Sorted names: the same tensors always make the same file, byte for byte.
using TensorMap = std::map<std::string, at::Tensor>;

// Writes `tensors` (and string `metadata`, stored under "__metadata__") to `path`. Atomic: writes
// "<path>.tmp-<pid>", fsyncs it and renames it over `path`, so a crash mid-write never leaves a
// truncated file at `path`, and a failed save leaves the old file there and no temp file behind.
// Tensors may be non-contiguous or on any device: each is copied to contiguous CPU memory as it is
// written. Supported dtypes: float64/32/16, bfloat16, int64/32/16/8, uint8 and bool; anything else
// throws std::invalid_argument naming the tensor. Throws std::runtime_error naming the path on I/O
// failure.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` into CPU tensors that own their memory; fills `*metadata` (when
// given) with the header's "__metadata__" (empty when there is none). Validates the whole file as
// the reference implementation does (header size and JSON, dtypes, shapes against byte ranges,
// ranges tightly packed and covering exactly the rest of the file) and throws std::runtime_error
// whose message names the file, says what is wrong and what to do about it.
TensorMap load_safetensors(const std::string& path,
                           std::map<std::string, std::string>* metadata = nullptr);

// The named tensors of `path` alone (the file validated whole, the others' bytes not read); a name
// the file does not hold throws, naming it.
TensorMap load_safetensors(const std::string& path, const std::set<std::string>& names);

// A tensor as the header lists it.
struct SafetensorsEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
};

// Every tensor of `path` as its header lists it, the file validated as load_safetensors does, but
// no tensor read: what a file holds, for the cost of its header.
std::map<std::string, SafetensorsEntry> read_safetensors_header(const std::string& path);

}  // namespace pipetrain
