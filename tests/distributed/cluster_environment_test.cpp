// Checks that launcher variables (torchrun, srun, none) become the right rank layout and that
// malformed ones fail loudly with the variable's name, since a silent mistake here shows up only
// as a distributed job that hangs at rendezvous.
#include "pipetrain/cluster_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "support/errors.h"

namespace pipetrain::cluster_environment_test {
namespace {

EnvironmentVariables torchrun_env() {
  return {{"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29500"}, {"RANK", "5"},
          {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"},         {"PATH", "/usr/bin:/bin"}};
}

EnvironmentVariables srun_env() {
  return {{"SLURM_NTASKS", "8"},       {"SLURM_PROCID", "6"},
          {"SLURM_LOCALID", "2"},      {"SLURM_NODEID", "1"},
          {"SLURM_NNODES", "2"},       {"SLURM_NODELIST", "node[01-04,07],gpu7"},
          {"SLURM_JOB_ID", "1234567"}, {"SLURM_JOB_NAME", "train"}};
}

// `env` with some variables set to other values.
EnvironmentVariables with(EnvironmentVariables env, const EnvironmentVariables& changes) {
  for (const auto& [name, value] : changes) env[name] = value;
  return env;
}

// The message of the std::invalid_argument that reading `env` as an `Environment` throws; anything
// else is a text in angle brackets, which no test's expected words match.
template <typename Environment>
std::string error_reading(const EnvironmentVariables& env) {
  return testing::error_of<std::invalid_argument>([&] { Environment{env}; });
}

// The same through select_cluster_environment, which reads `env` as the environment it detects.
std::string error_selecting(const EnvironmentVariables& env) {
  return testing::error_of<std::invalid_argument>([&] { select_cluster_environment(env); });
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every rank getter of `env` against `expected`, each failure naming its field.
void expect_layout(const ClusterEnvironment& env, const detail::RankLayout& expected) {
  EXPECT_EQ(env.main_address(), expected.main_address);
  EXPECT_EQ(env.main_port(), expected.main_port);
  EXPECT_EQ(env.world_size(), expected.world_size);
  EXPECT_EQ(env.global_rank(), expected.global_rank);
  EXPECT_EQ(env.local_rank(), expected.local_rank);
  EXPECT_EQ(env.local_world_size(), expected.local_world_size);
  EXPECT_EQ(env.node_rank(), expected.node_rank);
}

TEST(TorchElasticEnvironmentTest, DetectsOnlyWithAllFourRendezvousVariables) {
  EXPECT_TRUE(TorchElasticEnvironment::detect(torchrun_env()));
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    EnvironmentVariables env = torchrun_env();
    env.erase(name);
    EXPECT_FALSE(TorchElasticEnvironment::detect(env)) << "without " << name;
  }
  EXPECT_FALSE(TorchElasticEnvironment::detect({}));
}

TEST(TorchElasticEnvironmentTest, ReadsTorchrunVariables) {
  const TorchElasticEnvironment env(torchrun_env());
  EXPECT_EQ(env.name(), "torchelastic");
  expect_layout(env, {"10.0.0.5", 29500, /*world_size=*/8, /*global_rank=*/5, /*local_rank=*/1,
                      /*local_world_size=*/4, /*node_rank=*/1});
}

TEST(TorchElasticEnvironmentTest, AgentStoreAndRestartCountAsTorchrunSetsThem) {
  EXPECT_FALSE(TorchElasticEnvironment(torchrun_env()).launcher_hosts_store());
  EnvironmentVariables env = torchrun_env();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "2";
  const TorchElasticEnvironment agent(env);
  EXPECT_TRUE(agent.launcher_hosts_store());
  EXPECT_EQ(agent.store_prefix(), "/worker/attempt_2");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(TorchElasticEnvironment(env).launcher_hosts_store());
  env["TORCHELASTIC_USE_AGENT_STORE"] = "yes";
  const std::string message = error_reading<TorchElasticEnvironment>(env);
  EXPECT_TRUE(contains(message, "TORCHELASTIC_USE_AGENT_STORE='yes'")) << message;
}

TEST(TorchElasticEnvironmentTest, HandWrittenLaunchIsOneNode) {
  const TorchElasticEnvironment env(
      {{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}, {"RANK", "2"}, {"WORLD_SIZE", "3"}});
  EXPECT_EQ(env.local_rank(), 2);
  EXPECT_EQ(env.local_world_size(), 3);
  EXPECT_EQ(env.node_rank(), 0);
}

TEST(TorchElasticEnvironmentTest, NonIntegerRankNamesVariableAndValue) {
  const std::string message =
      error_reading<TorchElasticEnvironment>(with(torchrun_env(), {{"RANK", "abc"}}));
  EXPECT_TRUE(contains(message, "RANK")) << message;
  EXPECT_TRUE(contains(message, "abc")) << message;
}

TEST(TorchElasticEnvironmentTest, RejectsTrailingGarbageAndEmptyValues) {
  for (const char* value : {"1x", "", " 1", "0x1"}) {
    const std::string message = error_selecting(with(torchrun_env(), {{"WORLD_SIZE", value}}));
    EXPECT_TRUE(contains(message, "WORLD_SIZE")) << "value '" << value << "': " << message;
  }
}

TEST(TorchElasticEnvironmentTest, RankMustBeBelowWorldSize) {
  std::string message = error_selecting(with(torchrun_env(), {{"RANK", "8"}}));
  EXPECT_TRUE(contains(message, "RANK=8")) << message;
  EXPECT_TRUE(contains(message, "WORLD_SIZE=8")) << message;

  message = error_selecting(with(torchrun_env(), {{"RANK", "-1"}}));
  EXPECT_TRUE(contains(message, "RANK=-1")) << message;
}

TEST(TorchElasticEnvironmentTest, WorldSizeMustBePositive) {
  const std::string message =
      error_selecting(with(torchrun_env(), {{"WORLD_SIZE", "0"}, {"RANK", "0"}}));
  EXPECT_TRUE(contains(message, "WORLD_SIZE=0")) << message;
}

TEST(TorchElasticEnvironmentTest, LocalRankMustBeBelowLocalWorldSize) {
  const std::string message = error_selecting(with(torchrun_env(), {{"LOCAL_RANK", "4"}}));
  EXPECT_TRUE(contains(message, "LOCAL_RANK=4")) << message;
  EXPECT_TRUE(contains(message, "LOCAL_WORLD_SIZE=4")) << message;
}

TEST(TorchElasticEnvironmentTest, RejectsBadPortAndEmptyAddress) {
  std::string message = error_selecting(with(torchrun_env(), {{"MASTER_PORT", "70000"}}));
  EXPECT_TRUE(contains(message, "MASTER_PORT")) << message;
  message = error_selecting(with(torchrun_env(), {{"MASTER_ADDR", ""}}));
  EXPECT_TRUE(contains(message, "MASTER_ADDR")) << message;
}

TEST(SLURMEnvironmentTest, FirstHostOfCompressedNodeLists) {
  EXPECT_EQ(SLURMEnvironment::first_host("node[01-04,07],gpu7"), "node01");
  EXPECT_EQ(SLURMEnvironment::first_host("a-b[9-11]"), "a-b9");
  EXPECT_EQ(SLURMEnvironment::first_host("host"), "host");
  EXPECT_EQ(SLURMEnvironment::first_host("host3,host1"), "host3");
  EXPECT_EQ(SLURMEnvironment::first_host("host0 host1"), "host0");
  EXPECT_EQ(SLURMEnvironment::first_host("node[7]"), "node7");
  EXPECT_EQ(SLURMEnvironment::first_host("node[3,1-2]"), "node3");
  EXPECT_EQ(SLURMEnvironment::first_host("rack[2-3]-gpu[08-09]"), "rack2-gpu08");
  EXPECT_EQ(SLURMEnvironment::first_host("gpu-a100.cluster"), "gpu-a100.cluster");
}

TEST(SLURMEnvironmentTest, MalformedNodeListsThrow) {
  for (const char* nodelist : {"", "node[01-04", "node]", "node[]", ",node"}) {
    const std::string message =
        testing::error_of<std::invalid_argument>([&] { SLURMEnvironment::first_host(nodelist); });
    EXPECT_TRUE(contains(message, "SLURM_NODELIST")) << "'" << nodelist << "': " << message;
  }
}

TEST(SLURMEnvironmentTest, ReadsSrunVariables) {
  const SLURMEnvironment env(srun_env());
  EXPECT_EQ(env.name(), "slurm");
  expect_layout(env, {"node01", 15000 + 4567, /*world_size=*/8, /*global_rank=*/6,
                      /*local_rank=*/2, /*local_world_size=*/4, /*node_rank=*/1});
}

TEST(SLURMEnvironmentTest, PortFromShortJobIdKeepsLeadingDigits) {
  EXPECT_EQ(SLURMEnvironment(with(srun_env(), {{"SLURM_JOB_ID", "42"}})).main_port(), 15042);
  EXPECT_EQ(SLURMEnvironment(with(srun_env(), {{"SLURM_JOB_ID", "990007"}})).main_port(), 15007);
}

TEST(SLURMEnvironmentTest, MasterVariablesOverrideDerivedOnes) {
  const SLURMEnvironment slurm(
      with(srun_env(), {{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29400"}}));
  EXPECT_EQ(slurm.main_address(), "10.1.2.3");
  EXPECT_EQ(slurm.main_port(), 29400);
}

TEST(SLURMEnvironmentTest, NonNumericJobIdNamesVariable) {
  const std::string message =
      error_reading<SLURMEnvironment>(with(srun_env(), {{"SLURM_JOB_ID", "12ab"}}));
  EXPECT_TRUE(contains(message, "SLURM_JOB_ID='12ab'")) << message;
}

TEST(SLURMEnvironmentTest, FallsBackToJobNodeList) {
  EnvironmentVariables env = srun_env();
  env.erase("SLURM_NODELIST");
  env["SLURM_JOB_NODELIST"] = "cn[100-101]";
  EXPECT_EQ(SLURMEnvironment(env).main_address(), "cn100");
}

TEST(SLURMEnvironmentTest, LocalWorldSizeFromTasksPerNode) {
  EnvironmentVariables env = srun_env();
  env["SLURM_NTASKS_PER_NODE"] = "4(x2)";
  EXPECT_EQ(SLURMEnvironment(env).local_world_size(), 4);

  env["SLURM_NTASKS_PER_NODE"] = "4";
  EXPECT_EQ(SLURMEnvironment(env).local_world_size(), 4);

  // Uneven layout: node 0 runs 5 tasks, node 1 runs 3.
  env["SLURM_NTASKS_PER_NODE"] = "5,3";
  env["SLURM_PROCID"] = "6";
  env["SLURM_LOCALID"] = "1";
  EXPECT_EQ(SLURMEnvironment(env).local_world_size(), 3);

  env["SLURM_NTASKS_PER_NODE"] = "4(x";
  const std::string message = error_reading<SLURMEnvironment>(env);
  EXPECT_TRUE(contains(message, "SLURM_NTASKS_PER_NODE")) << message;
}

TEST(SLURMEnvironmentTest, UnevenTasksWithoutPerNodeCountThrow) {
  const std::string message = error_reading<SLURMEnvironment>(
      with(srun_env(), {{"SLURM_NTASKS", "7"}, {"SLURM_PROCID", "0"}}));
  EXPECT_TRUE(contains(message, "SLURM_NNODES=2")) << message;
}

TEST(SLURMEnvironmentTest, DetectionSkipsInteractiveShells) {
  EXPECT_TRUE(SLURMEnvironment::detect(srun_env()));
  EnvironmentVariables env = srun_env();
  env["SLURM_JOB_NAME"] = "bash";
  EXPECT_FALSE(SLURMEnvironment::detect(env));
  env["SLURM_JOB_NAME"] = "interactive";
  EXPECT_FALSE(SLURMEnvironment::detect(env));
  env = srun_env();
  env.erase("SLURM_PROCID");
  EXPECT_FALSE(SLURMEnvironment::detect(env));
}

TEST(SLURMEnvironmentTest, BadProcIdNamesVariable) {
  EnvironmentVariables env = with(srun_env(), {{"SLURM_PROCID", "8"}});
  std::string message = error_selecting(env);
  EXPECT_TRUE(contains(message, "SLURM_PROCID=8")) << message;
  EXPECT_TRUE(contains(message, "SLURM_NTASKS=8")) << message;

  env.erase("SLURM_LOCALID");
  message = error_selecting(env);
  EXPECT_TRUE(contains(message, "SLURM_LOCALID")) << message;
}

TEST(SelectClusterEnvironmentTest, TorchElasticWinsOverSlurm) {
  // torchrun inside an sbatch allocation: torchrun's variables describe the training processes.
  EnvironmentVariables env = srun_env();
  for (const auto& [name, value] : torchrun_env()) env[name] = value;
  const auto selected = select_cluster_environment(env);
  EXPECT_EQ(selected->name(), "torchelastic");
  EXPECT_EQ(selected->global_rank(), 5);
}

TEST(SelectClusterEnvironmentTest, SlurmWinsOverLocal) {
  const auto selected = select_cluster_environment(srun_env());
  EXPECT_EQ(selected->name(), "slurm");
  EXPECT_EQ(selected->global_rank(), 6);
}

TEST(SelectClusterEnvironmentTest, InteractiveSlurmShellFallsBackToLocal) {
  EnvironmentVariables env = srun_env();
  env["SLURM_JOB_NAME"] = "interactive";
  EXPECT_EQ(select_cluster_environment(env)->name(), "local");
}

TEST(SelectClusterEnvironmentTest, NothingSetIsOneLocalProcess) {
  const auto selected = select_cluster_environment(EnvironmentVariables{{"HOME", "/root"}});
  EXPECT_EQ(selected->name(), "local");
  expect_layout(*selected, {"127.0.0.1", /*main_port=*/0, /*world_size=*/1, /*global_rank=*/0,
                            /*local_rank=*/0, /*local_world_size=*/1, /*node_rank=*/0});
}

TEST(CurrentEnvironmentTest, SnapshotsEnviron) {
  setenv("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST", "a=b", 1);
  const EnvironmentVariables env = current_environment();
  unsetenv("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST");
  ASSERT_EQ(env.count("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST"), 1u);
  EXPECT_EQ(env.at("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST"), "a=b");
}

}  // namespace
}  // namespace pipetrain::cluster_environment_test
