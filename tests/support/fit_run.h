// A fit that a test runs in its own process or hands to worker ranks (run_ranks): the settings such
// tests vary, the files the run leaves under its root, how the settings reach the ranks (their
// environment) and how a failing rank's error comes back (a file).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "pipetrain/safetensors.h"
#include "pipetrain/trainer_options.h"
#include "support/multiprocess.h"

// Visits each named member, `visit(name, member)`, the name as written ("batch_size").
#define PIPETRAIN_VISIT_FIELDS(visit, ...) \
  ::pipetrain::testing::visit_named_fields(visit, #__VA_ARGS__, __VA_ARGS__)

namespace pipetrain::testing {

// The names in `names` ("root, strategy", as PIPETRAIN_VISIT_FIELDS writes them), in order.
std::vector<std::string> split_field_names(const std::string& names);

template <typename Visit, typename... Fields>
void visit_named_fields(Visit& visit, const char* names, Fields&... fields) {
  const auto split = split_field_names(names);
  size_t next = 0;
  (visit(split.at(next++), fields), ...);
}

// A test's own run derives from FitRun and lists its own settings after FitRun's:
//   template <typename Visit>
//   void fields(Visit&& visit) {
//     FitRun::fields(visit);
//     PIPETRAIN_VISIT_FIELDS(visit, batch_size, seed);
//   }
// to_env() and from_env() walk that one list both ways, each setting under its member's name, and
// the struct's initialisers are the defaults.
struct FitRun {
  std::string root;  // where it logs (lightning_logs/version_N) and saves (checkpoints/)
  std::string strategy = "single";
  int64_t devices = 1;
  int64_t chunks = 1;
  std::string schedule = "gpipe";
  std::string checkpoint = "except_last";  // the pipe's checkpoint mode
  int64_t max_steps = -1;
  std::string resume;  // a checkpoint file to resume from, or ""

  template <typename Visit>
  void fields(Visit&& visit) {
    PIPETRAIN_VISIT_FIELDS(visit, root, strategy, devices, chunks, schedule, checkpoint, max_steps,
                           resume);
  }

  // logged_run_options(root) with this strategy, devices and max_steps, and `pipe` with these
  // chunks, schedule and checkpoint mode.
  TrainerOptions trainer_options(PipeOptions pipe = PipeOptions()) const;

  // The checkpoint the fit saved last, and the model's weights in it.
  std::string last_checkpoint() const;
  TensorMap final_weights() const;
  // Where rank `rank` wrote the tensors of its layers (save_local_tensors).
  std::string rank_tensors(int64_t rank) const;

  // Runs `fit`; where it throws, the error's text goes to a file of this rank's under root first,
  // for recorded_error(), and the exception goes on.
  void record_error_of(const std::function<void()>& fit) const;
  // What rank `rank` recorded, or "" where it recorded no error.
  std::string recorded_error(int64_t rank) const;
};

// A pipeline layout a test trains against `single`: one process a stage, its schedule and
// checkpoint mode, stages per process, and whether Linear layers fuse gradient accumulation.
struct PipeLayout {
  int64_t stages;
  std::string schedule, checkpoint;
  int64_t virtual_stages = 1;
  bool fuse = false;  // PipeOptions::fuse_gradient_accumulation
};

// A FitRun that also sets the pipe's stages per process and gradient-accumulation fusion, and so
// can run any PipeLayout.
struct PipeLayoutRun : FitRun {
  int64_t virtual_stages = 1;
  bool fuse = false;

  template <typename Visit>
  void fields(Visit&& visit) {
    FitRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, virtual_stages, fuse);
  }

  // FitRun's, with these virtual stages and fusion.
  TrainerOptions trainer_options(PipeOptions pipe = PipeOptions()) const;

  // `layout` under `pipe` on `chunks` micro-batches, rooted at
  // dir/<stages>-<schedule>-<checkpoint>, "-fused" appended where it fuses.
  void set_layout(const PipeLayout& layout, const std::string& dir, int64_t chunks);
};

// This process's rank (RANK, as the launcher sets it; 0 in a test's own process).
int64_t worker_rank();

namespace fit_run_detail {

// A setting's variable in the environment: FIT_RUN_BATCH_SIZE for batch_size, prefixed to keep
// clear of the launcher's variables.
std::string variable(const std::string& name);

template <typename T>
std::string to_text(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "1" : "0";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    static_assert(std::is_floating_point_v<T>, "a setting is a string, bool, integer or float");
    std::ostringstream text;
    text << std::setprecision(17) << value;  // read back exactly
    return text.str();
  }
}

template <typename T>
void from_text(const std::string& text, T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    value = text;
  } else if constexpr (std::is_same_v<T, bool>) {
    value = text == "1";
  } else if constexpr (std::is_integral_v<T>) {
    value = static_cast<T>(std::stoll(text));
  } else {
    value = std::stod(text);
  }
}

}  // namespace fit_run_detail

// `run`'s settings as environment variables, for run_ranks().
template <typename Run>
std::map<std::string, std::string> to_env(Run run) {  // a copy: fields() hands out references
  std::map<std::string, std::string> env;
  run.fields([&](const std::string& name, const auto& value) {
    env[fit_run_detail::variable(name)] = fit_run_detail::to_text(value);
  });
  return env;
}

// The run to_env() described, in a worker rank.
template <typename Run>
Run from_env() {
  Run run;
  run.fields([](const std::string& name, auto& value) {
    if (const char* text = std::getenv(fit_run_detail::variable(name).c_str())) {
      fit_run_detail::from_text(text, value);
    }
  });
  return run;
}

// `run` in run.devices processes of this test binary, each running the PIPETRAIN_WORKER `worker`
// (train_from_env), after its root is made; a failure if any rank fails.
template <typename Run>
void train_in_ranks(const Run& run, const std::string& worker) {
  std::filesystem::create_directories(run.root);
  ASSERT_EQ(run_ranks(static_cast<int>(run.devices), worker, to_env(run)), 0) << run.root;
}

// In a worker rank: `train` on the run to_env() described, a failure recorded for
// recorded_error().
template <typename Run>
void train_from_env(void (*train)(const Run&)) {
  const auto run = from_env<Run>();
  run.record_error_of([&] { train(run); });
}

// A test whose runs each log and save in a folder of their own under `dir`, removed after it.
template <typename Run, typename Test = ::testing::Test>
class FitRunsTest : public Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir); }
  // A run of Run's defaults rooted at dir/name.
  Run named_run(const std::string& name) const {
    Run r;
    r.root = dir + "/" + name;
    return r;
  }
  std::string dir = make_temp_dir("fit-runs");
};

}  // namespace pipetrain::testing
