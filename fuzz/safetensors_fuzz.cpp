// load_safetensors on arbitrary bytes: a clear std::exception or tensors, never a crash, a hang
// or a sanitizer report. PIPETRAIN_FUZZ_SEEDS names a directory to write a valid file into.
#include <cstdlib>

#include "fuzz_file.h"
#include "pipetrain/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("PIPETRAIN_FUZZ_SEEDS")) {
    pipetrain::TensorMap tensors;
    for (const auto& item : pipetrain::fuzz::small_model()->named_parameters()) {
      tensors[item.key()] = item.value().detach();
    }
    tensors["ids"] = torch::arange(5, torch::kInt64);
    tensors["half"] = torch::ones({2, 2}, torch::kBFloat16);
    pipetrain::save_safetensors(std::string(seeds) + "/model.safetensors", tensors,
                                {{"format", "pt"}});
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pipetrain::fuzz::scratch_dir() + "/input.safetensors";
  pipetrain::fuzz::write_bytes(path, data, size);
  try {
    for (const auto& [name, tensor] : pipetrain::load_safetensors(path)) {
      if (tensor.numel() > 0) (void)tensor.sum();  // the data must be readable
    }
  } catch (const std::exception&) {
  }
  return 0;
}
