// Model weights in Hugging Face's safetensors format, so checkpoints move between pipetrain and the
// Python ecosystem (`safetensors.torch.load_file` reads what we write, and we read what it writes)
// without pickle: an 8-byte little-endian header length, a JSON header naming every tensor's
// dtype, shape and byte range, then the tightly packed little-endian tensor bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

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

}  // namespace pipetrain
