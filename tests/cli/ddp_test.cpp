// `ddp` and `ddp_pipe` against the reference: replicas of a (pipelined) model trained on shards of
// a global batch must follow the same trajectory as one process on the whole global batch.
// Tolerance: fp32 on CPU, relative 1e-5 for losses and absolute 1e-5 for parameters (the sums run
// in another order: micro-batches, replicas and bucketed all-reduces).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/launcher.h"
#include "pipetrain/safetensors.h"
#include "support/command.h"
#include "support/multiprocess.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::ddp_test {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 10;

// The boring model (SGD) compares parameters well: Adam's normalised steps turn float noise in a
// near-zero gradient into whole learning-rate steps. Its 64 rows make the epochs' last global
// batch partial, and reshuffle every few steps.
std::vector<std::string> fit(const std::string& root, int64_t batch_size,
                             std::vector<std::string> extra, int steps = kSteps,
                             const std::string& model = "boring") {
  extra.insert(extra.begin(),
               {"--lr", model == "boring" ? "0.2" : "0.003", "--max-steps", std::to_string(steps),
                "--batch-size", std::to_string(batch_size), "--seed", "7"});
  return csv_logged_command("fit", model, root, 2, std::move(extra));
}

TensorMap final_weights(const std::string& root) {
  return read_checkpoint_weights(root + "/lightning_logs/version_0/checkpoints/last.ckpt");
}

// The runs under `expected` and `actual` logged the same losses and saved the same weights.
void expect_same_run(const std::string& expected_root, const std::string& actual_root) {
  const auto expected = read_csv_column(metrics_csv(expected_root), "train_loss");
  const auto actual = read_csv_column(metrics_csv(actual_root), "train_loss");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
  expect_same_losses(expected, actual, 1e-5);
  const auto expected_weights = final_weights(expected_root);
  const auto actual_weights = final_weights(actual_root);
  ASSERT_EQ(actual_weights.size(), expected_weights.size());
  for (const auto& [name, tensor] : expected_weights) {
    ASSERT_TRUE(actual_weights.count(name)) << name;
    EXPECT_TRUE(torch::allclose(actual_weights.at(name), tensor, 0, 1e-5))
        << name << " differs by " << (actual_weights.at(name) - tensor).abs().max().item<double>();
  }
}

// Trains `layout` with `batch_size` rows per replica and `reference` with the whole global batch
// in one process; both see the same samples at every step.
void expect_same_training(const std::vector<std::string>& layout, int64_t batch_size,
                          int64_t replicas, std::vector<std::string> common = {}) {
  const auto root = make_temp_dir("ddp");
  auto single = common;
  single.insert(single.end(), {"--strategy", "single"});
  auto parallel = common;
  parallel.insert(parallel.end(), layout.begin(), layout.end());
  run_ok(fit(root + "/single", batch_size * replicas, single));
  run_ok(fit(root + "/parallel", batch_size, parallel));
  expect_same_run(root + "/single", root + "/parallel");
  fs::remove_all(root);
}

// Starts the ranks of a 2 nodes x 2 processes ddp_pipe run as separate commands, each with the
// environment `env_of(i)` (i = node or rank), and requires them to train as one process would.
void expect_multi_node_run_equals_single(
    int commands, const std::function<std::map<std::string, std::string>(int)>& env_of) {
  const auto root = make_temp_dir("ddp-nodes");
  run_ok(fit(root + "/single", 48, {"--strategy", "single"}));
  const auto argv = fit(root + "/nodes", 24,
                        {"--strategy", "ddp_pipe", "--devices", "2", "--num-nodes", "2", "--stages",
                         "2", "--chunks", "2"});
  std::vector<RunningCommand> running;
  for (int i = 0; i < commands; ++i) running.push_back(start_command(argv, env_of(i)));
  for (const auto& command : running) {
    const auto result = wait_command(command, std::chrono::seconds(120));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  expect_same_run(root + "/single", root + "/nodes");
  fs::remove_all(root);
}

TEST(Ddp, TwoReplicasEqualOneProcessOnTheGlobalBatch) {
  expect_same_training({"--strategy", "ddp", "--devices", "2"}, 24, 2);
}

TEST(Ddp, ThreeReplicasSplitAPartialBatchUnevenly) {
  // 64 rows in global batches of 3 x 10: each epoch ends with 4 rows, split 2, 1, 1.
  expect_same_training({"--strategy", "ddp", "--devices", "3"}, 10, 3);
}

TEST(DdpPipe, TwoReplicasOfTwoStagesEqualOneProcess) {
  expect_same_training({"--strategy", "ddp_pipe", "--devices", "4", "--stages", "2", "--chunks",
                        "3", "--schedule", "1f1b"},
                       24, 2);
}

TEST(DdpPipe, TwoReplicasOfThreeStagesEqualOneProcess) {
  expect_same_training({"--strategy", "ddp_pipe", "--devices", "6", "--stages", "3", "--chunks",
                        "2", "--checkpoint", "always"},
                       12, 2);
}

TEST(DdpPipe, GlobalNormClippingAndAccumulationEqualOneProcess) {
  expect_same_training(
      {"--strategy", "ddp_pipe", "--devices", "4", "--stages", "2", "--chunks", "2"}, 16, 2,
      {"--gradient-clip-val", "0.05", "--accumulate-grad-batches", "2"});
}

// Fused Linear layers hand autograd no weight gradient, so GradientSync's hooks never see theirs;
// it must still average them (at the end of backward), whether stage 1 defers them past its send
// (1F1B, checkpoint except_last) or both stages compute them after their last backward (GPipe,
// checkpoint never). The MLP
// (8 Linear layers) against the same layout unfused; both run Adam, and only where the adds
// happen differs.
TEST(DdpPipe, FusedGradientAccumulationTrainsAsUnfused) {
  const auto root = make_temp_dir("ddp-fused");
  for (const auto& [schedule, checkpoint] :
       {std::pair<std::string, std::string>{"1f1b", "except_last"}, {"gpipe", "never"}}) {
    SCOPED_TRACE(schedule);
    const std::vector<std::string> layout{"--strategy",
                                          "ddp_pipe",
                                          "--devices",
                                          "4",
                                          "--stages",
                                          "2",
                                          "--chunks",
                                          "2",
                                          "--schedule",
                                          schedule,
                                          "--checkpoint",
                                          checkpoint,
                                          "--accumulate-grad-batches",
                                          "2"};
    auto fused = layout;
    fused.insert(fused.end(), {"--fuse-gradient-accumulation", "true"});
    const auto dir = root + "/" + schedule;
    run_ok(fit(dir + "/unfused", 16, layout, kSteps, "mlp"));
    run_ok(fit(dir + "/fused", 16, fused, kSteps, "mlp"));
    expect_same_run(dir + "/unfused", dir + "/fused");
  }
  fs::remove_all(root);
}

// Lightning's manual multi-node launch: the same command on every node with NODE_RANK, MASTER_ADDR
// and MASTER_PORT set; here two "nodes" on 127.0.0.1.
TEST(DdpPipe, TwoNodeLaunchesOfTwoProcessesEachEqualOneProcess) {
  const std::string port = std::to_string(find_free_port());
  expect_multi_node_run_equals_single(2, [&](int node) {
    return std::map<std::string, std::string>{
        {"NODE_RANK", std::to_string(node)}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
  });
}

// srun starts every rank itself, with SLURM's variables.
TEST(DdpPipe, RanksStartedBySlurmEqualOneProcess) {
  const std::string port = std::to_string(find_free_port());
  expect_multi_node_run_equals_single(4, [&](int rank) {
    return std::map<std::string, std::string>{{"SLURM_NTASKS", "4"},
                                              {"SLURM_PROCID", std::to_string(rank)},
                                              {"SLURM_LOCALID", std::to_string(rank % 2)},
                                              {"SLURM_NODEID", std::to_string(rank / 2)},
                                              {"SLURM_NNODES", "2"},
                                              {"SLURM_NTASKS_PER_NODE", "2"},
                                              {"SLURM_JOB_NAME", "ddp_test"},
                                              {"SLURM_JOB_ID", "4242"},
                                              {"SLURM_NODELIST", "127.0.0.1"},
                                              {"MASTER_PORT", port}};
  });
}

TEST(DdpPipe, StagesMustDivideTheDevices) {
  const auto root = make_temp_dir("ddp-bad");
  const auto result =
      run_command(fit(root, 8, {"--strategy", "ddp_pipe", "--devices", "3", "--stages", "2"}));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--stages 2 does not divide the 3 devices"), std::string::npos)
      << result.output;
  fs::remove_all(root);
}

// ZeRO stage 1 changes which replica updates a parameter, not what it computes: every replica's
// optimizer steps its own share with the gradients plain data parallelism has (all-reduced,
// clipped by the global norm), so the runs equal plain ddp's. The MLP (Adam), whose moments are
// the state shared out; clipping and accumulation on.
TEST(DdpZero, StageOneTrainsAsPlainDdpAndPipelines) {
  const auto root = make_temp_dir("ddp-zero");
  const std::vector<std::string> common{"--gradient-clip-val", "0.05", "--accumulate-grad-batches",
                                        "2"};
  for (const auto& layout :
       {std::vector<std::string>{"--strategy", "ddp", "--devices", "2"},
        std::vector<std::string>{"--strategy", "ddp_pipe", "--devices", "4", "--stages", "2",
                                 "--chunks", "2", "--schedule", "1f1b"}}) {
    SCOPED_TRACE(layout[1]);
    auto plain = common;
    plain.insert(plain.end(), layout.begin(), layout.end());
    auto zero = plain;
    zero.insert(zero.end(), {"--zero-stage", "1"});
    const auto dir = root + "/" + layout[1];
    run_ok(fit(dir + "/plain", 16, plain, kSteps, "mlp"));
    const auto output = run_ok(fit(dir + "/zero", 16, zero, kSteps, "mlp")).output;
    EXPECT_NE(output.find("ZeRO stage 1 over 2 replicas: rank 0 keeps the optimizer state of"),
              std::string::npos)
        << output;
    expect_same_run(dir + "/plain", dir + "/zero");

    // Each replica's file holds its own share of the state: about half of what the first
    // replica's rank writes without ZeRO, and the other replica's rank writes the other half.
    const auto ckpt = [&](const std::string& run, int64_t rank) {
      return checkpoint_rank_path(
          dir + "/" + run + "/lightning_logs/version_0/checkpoints/last.ckpt", rank);
    };
    const int64_t replica_one = layout[1] == "ddp" ? 1 : 2;
    const auto whole = static_cast<double>(fs::file_size(ckpt("plain", 0)));
    for (const int64_t rank : {int64_t{0}, replica_one}) {
      EXPECT_LT(static_cast<double>(fs::file_size(ckpt("zero", rank))), 0.75 * whole) << rank;
      EXPECT_GT(static_cast<double>(fs::file_size(ckpt("zero", rank))), 0.25 * whole) << rank;
    }
  }
  fs::remove_all(root);
}

// bf16 weights on CPU processes (Gloo, which has no bfloat16 collectives): the tied head's first
// copy, the tied gradients and the replicas' gradient average travel as float32, so a tied
// decoder built per rank trains under pipe and ddp as in one process (within bf16 rounding of
// sums taken in another order: relative 3e-2).
TEST(Bf16True, ATiedDecoderTrainsUnderPipeAndDdpAsInOneProcess) {
  const auto root = make_temp_dir("bf16-true");
  ASSERT_EQ(
      run_command(pipetrain_command({"prepare-data", "--input", "/usr/share/common-licenses/GPL-3",
                                     "--output", root + "/data"}))
          .exit_code,
      0);
  auto run = [&](const std::string& name, int64_t batch_size, std::vector<std::string> layout) {
    std::vector<std::string> argv{"fit",
                                  "--model",
                                  "llama",
                                  "--n-layer",
                                  "2",
                                  "--n-embd",
                                  "32",
                                  "--n-head",
                                  "2",
                                  "--n-kv-head",
                                  "1",
                                  "--intermediate-size",
                                  "64",
                                  "--vocab-size",
                                  "256",
                                  "--block-size",
                                  "16",
                                  "--tie-word-embeddings",
                                  "true",
                                  "--precision",
                                  "bf16-true",
                                  "--train-data",
                                  root + "/data/train.bin",
                                  "--batch-size",
                                  std::to_string(batch_size),
                                  "--max-steps",
                                  "4",
                                  "--lr",
                                  "0.01",
                                  "--limit-val-batches",
                                  "0",
                                  "--num-sanity-val-steps",
                                  "0",
                                  "--log-every-n-steps",
                                  "1",
                                  "--enable-progress-bar",
                                  "false",
                                  "--enable-checkpointing",
                                  "false",
                                  "--logger",
                                  "csv",
                                  "--default-root-dir",
                                  root + "/" + name};
    argv.insert(argv.end(), layout.begin(), layout.end());
    run_ok(pipetrain_command(argv));
    return read_csv_column(metrics_csv(root + "/" + name), "train_loss");
  };
  const auto single = run("single", 8, {});
  ASSERT_EQ(single.size(), 4u);
  expect_same_losses(
      single, run("pipe", 8, {"--strategy", "pipe", "--devices", "2", "--chunks", "2"}), 3e-2);
  expect_same_losses(single, run("ddp", 4, {"--strategy", "ddp", "--devices", "2"}), 3e-2);
  fs::remove_all(root);
}

TEST(DdpZero, RefusedWhereThereAreNoReplicasAndAboveStageOne) {
  const auto root = make_temp_dir("ddp-zero-bad");
  for (const auto& [flags, expected] :
       {std::pair<std::vector<std::string>, std::string>{
            {"--strategy", "pipe", "--devices", "2", "--zero-stage", "1"},
            "zero_stage (--zero-stage) 1 shares optimizer state out among data-parallel "
            "replicas, which strategy 'pipe' does not have"},
        {{"--strategy", "ddp", "--devices", "2", "--zero-stage", "2"},
         "zero_stage (--zero-stage) 2 is not supported"}}) {
    const auto result = run_command(fit(root, 8, flags));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  }
  fs::remove_all(root);
}

// A checkpoint written by 2 replicas x 2 stages, with the optimizer state whole on the first
// replica or shared out by ZeRO, resumes under `pipe`, `single` and the other ZeRO setting: the
// resumed steps log the losses of an uninterrupted single-process run.
TEST(DdpPipe, CheckpointResumesUnderPipeSingleAndZero) {
  const auto root = make_temp_dir("ddp-resume");
  const std::vector<std::string> every{"--every-n-train-steps", "5"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), every.begin(), every.end());
    return flags;
  };
  // The MLP (Adam): its moments must move with the parameters.
  run_ok(fit(root + "/straight", 32, with({"--strategy", "single"}), kSteps, "mlp"));
  const auto straight = read_csv_column(metrics_csv(root + "/straight"), "train_loss");
  ASSERT_EQ(straight.size(), static_cast<size_t>(kSteps));
  const std::vector<std::string> ddp_pipe{"--strategy", "ddp_pipe", "--devices",
                                          "4",          "--stages", "2"};

  for (const bool zero : {false, true}) {
    auto saving = ddp_pipe;
    if (zero) saving.insert(saving.end(), {"--zero-stage", "1"});
    const auto saved_root = root + (zero ? "/zero" : "/plain");
    run_ok(fit(saved_root, 16, with(saving), 5, "mlp"));
    const auto ckpt = saved_root + "/lightning_logs/version_0/checkpoints/last.ckpt";
    // Resumed by 32 rows in one process, or 16 on each of 2 replicas.
    for (const auto& [layout, rows] :
         {std::pair<std::vector<std::string>, int64_t>{
              {"--strategy", "pipe", "--devices", "2", "--balance", "7,8"}, 32},
          {{"--strategy", "single"}, 32},
          {{"--strategy", "ddp", "--devices", "2", "--zero-stage", zero ? "0" : "1"}, 16}}) {
      SCOPED_TRACE((zero ? "saved with ZeRO, resumed under " : "resumed under ") + layout[1]);
      const auto resumed_root = make_temp_dir("ddp-resumed");
      auto flags = layout;
      flags.insert(flags.end(), {"--ckpt-path", ckpt});
      run_ok(fit(resumed_root, rows, flags, kSteps, "mlp"));
      const auto resumed = read_csv_column(metrics_csv(resumed_root), "train_loss");
      const auto steps = read_csv_column(metrics_csv(resumed_root), "step");
      ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - 5));
      EXPECT_EQ(steps.front(), 5);
      for (size_t i = 0; i < resumed.size(); ++i) {
        EXPECT_NEAR(resumed[i], straight[5 + i], 1e-5 * straight[5 + i]) << "step " << 5 + i;
      }
      fs::remove_all(resumed_root);
    }
  }
  fs::remove_all(root);
}

// The issue's own case: a sharded checkpoint of 4 stages (each rank writing its own layers'
// shard and optimizer state) resumes under 2 stages, under 2 replicas x 2 stages with ZeRO, and
// in one process, each continuing as an uninterrupted single-process run.
TEST(DdpPipe, AFourStageCheckpointResumesUnderTwoStagesTwoByTwoWithZeroAndSingle) {
  const auto root = make_temp_dir("four-stage-resume");
  run_ok(fit(root + "/straight", 32, {"--strategy", "single"}, kSteps, "mlp"));
  const auto straight = read_csv_column(metrics_csv(root + "/straight"), "train_loss");
  run_ok(
      fit(root + "/pipe4", 32,
          {"--strategy", "pipe", "--devices", "4", "--chunks", "2", "--every-n-train-steps", "5"},
          5, "mlp"));
  const auto ckpt = root + "/pipe4/lightning_logs/version_0/checkpoints/last.ckpt";
  for (int64_t shard = 1; shard <= 4; ++shard) {
    EXPECT_TRUE(fs::exists(ckpt + "/model-0000" + std::to_string(shard) + "-of-00004.safetensors"))
        << shard;
  }
  for (const auto& [layout, rows] :
       {std::pair<std::vector<std::string>, int64_t>{{"--strategy", "pipe", "--devices", "2"}, 32},
        {{"--strategy", "ddp_pipe", "--devices", "4", "--stages", "2", "--zero-stage", "1"}, 16},
        {{"--strategy", "single"}, 32}}) {
    SCOPED_TRACE(layout[1]);
    const auto resumed_root = make_temp_dir("four-stage-resumed");
    auto flags = layout;
    flags.insert(flags.end(), {"--ckpt-path", ckpt});
    run_ok(fit(resumed_root, rows, flags, kSteps, "mlp"));
    const auto resumed = read_csv_column(metrics_csv(resumed_root), "train_loss");
    ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - 5));
    for (size_t i = 0; i < resumed.size(); ++i) {
      EXPECT_NEAR(resumed[i], straight[5 + i], 1e-5 * straight[5 + i]) << "step " << 5 + i;
    }
    fs::remove_all(resumed_root);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::ddp_test
