// A checkpoint's weights, fuzzed, loaded into a model as resuming does (StoredWeights' listing,
// then load_weights with its name and shape checks and the tensors read): a clear std::exception or loaded
// weights, never a crash. PIPETRAIN_FUZZ_SEEDS names a directory to write a valid file into.
#include <cstdlib>
#include <filesystem>

#include "fuzz_file.h"
#include "pipetrain/checkpoint_io.h"
#include "pipetrain/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("PIPETRAIN_FUZZ_SEEDS")) {
    pipetrain::TensorMap tensors;
    for (const auto& item : pipetrain::fuzz::small_model()->named_parameters()) {
      tensors[item.key()] = item.value().detach();
    }
    pipetrain::save_safetensors(std::string(seeds) + "/model.safetensors", tensors,
                                {{"format", "pt"}});
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto model = pipetrain::fuzz::small_model();
  const std::string checkpoint = pipetrain::fuzz::scratch_dir() + "/weights.ckpt";
  std::filesystem::create_directories(checkpoint);
  pipetrain::fuzz::write_bytes(checkpoint + "/model.safetensors", data, size);
  try {
    pipetrain::load_weights(model, pipetrain::StoredWeights(checkpoint));
  } catch (const std::exception&) {
  }
  return 0;
}
