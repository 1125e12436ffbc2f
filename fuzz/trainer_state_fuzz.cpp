// read_training_state on an arbitrary trainer_state.json: a clear std::exception or a state,
// never a crash. PIPETRAIN_FUZZ_SEEDS names a directory to write a valid file into.
#include <cstdlib>
#include <filesystem>

#include "fuzz_file.h"
#include "pipetrain/checkpoint_io.h"

namespace {
const char* kValid = R"({
  "format_version": 1, "epoch": 2, "global_step": 40, "batch_idx": 3, "epoch_finished": false,
  "lr_scheduler_steps": -1, "world_size": 2,
  "layout": {"balance": "1,1", "replicas": "1", "stages": "2"},
  "callbacks": {"ModelCheckpoint": {"best_model_path": "", "last_global_step_saved": "40"}}
})";
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("PIPETRAIN_FUZZ_SEEDS")) {
    std::ofstream(std::string(seeds) + "/trainer_state.json") << kValid;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string checkpoint = pipetrain::fuzz::scratch_dir() + "/state.ckpt";
  std::filesystem::create_directories(checkpoint);
  pipetrain::fuzz::write_bytes(checkpoint + "/trainer_state.json", data, size);
  try {
    (void)pipetrain::read_training_state(checkpoint);
  } catch (const std::exception&) {
  }
  return 0;
}
