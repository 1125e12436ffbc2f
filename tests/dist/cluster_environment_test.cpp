// Checks that launcher variables (torchrun, srun, none) become the right rank layout and that
// malformed ones fail loudly with the variable's name, since a silent mistake here shows up only
// as a distributed job that hangs at rendezvous.
#include "pipetrain/cluster_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace pipetrain {
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

// Runs `body`, which must throw std::invalid_argument, and returns the message.
template <typename Body>
std::string invalid_argument_message(Body body) {
  try {
    body();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
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
  EXPECT_EQ(env.main_address(), "10.0.0.5");
  EXPECT_EQ(env.main_port(), 29500);
  EXPECT_EQ(env.global_rank(), 5);
  EXPECT_EQ(env.world_size(), 8);
  EXPECT_EQ(env.local_rank(), 1);
  EXPECT_EQ(env.local_world_size(), 4);
  EXPECT_EQ(env.node_rank(), 1);
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
  const std::string message = invalid_argument_message([&] { TorchElasticEnvironment{env}; });
  EXPECT_NE(message.find("TORCHELASTIC_USE_AGENT_STORE='yes'"), std::string::npos) << message;
}

TEST(TorchElasticEnvironmentTest, HandWrittenLaunchIsOneNode) {
  const TorchElasticEnvironment env(
      {{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}, {"RANK", "2"}, {"WORLD_SIZE", "3"}});
  EXPECT_EQ(env.local_rank(), 2);
  EXPECT_EQ(env.local_world_size(), 3);
  EXPECT_EQ(env.node_rank(), 0);
}

TEST(TorchElasticEnvironmentTest, NonIntegerRankNamesVariableAndValue) {
  EnvironmentVariables env = torchrun_env();
  env["RANK"] = "abc";
  const std::string message = invalid_argument_message([&] { TorchElasticEnvironment{env}; });
  EXPECT_NE(message.find("RANK"), std::string::npos) << message;
  EXPECT_NE(message.find("abc"), std::string::npos) << message;
}

TEST(TorchElasticEnvironmentTest, RejectsTrailingGarbageAndEmptyValues) {
  for (const char* value : {"1x", "", " 1", "0x1"}) {
    EnvironmentVariables env = torchrun_env();
    env["WORLD_SIZE"] = value;
    const std::string message = invalid_argument_message([&] { select_cluster_environment(env); });
    EXPECT_NE(message.find("WORLD_SIZE"), std::string::npos) << "value '" << value << "'";
  }
}

TEST(TorchElasticEnvironmentTest, RankMustBeBelowWorldSize) {
  EnvironmentVariables env = torchrun_env();
  env["RANK"] = "8";
  const std::string message = invalid_argument_message([&] { select_cluster_environment(env); });
  EXPECT_NE(message.find("RANK=8"), std::string::npos) << message;
  EXPECT_NE(message.find("WORLD_SIZE=8"), std::string::npos) << message;

  env["RANK"] = "-1";
  EXPECT_NE(invalid_argument_message([&] { select_cluster_environment(env); }).find("RANK=-1"),
            std::string::npos);
}

TEST(TorchElasticEnvironmentTest, WorldSizeMustBePositive) {
  EnvironmentVariables env = torchrun_env();
  env["WORLD_SIZE"] = "0";
  env["RANK"] = "0";
  EXPECT_NE(invalid_argument_message([&] { select_cluster_environment(env); }).find("WORLD_SIZE=0"),
            std::string::npos);
}

TEST(TorchElasticEnvironmentTest, LocalRankMustBeBelowLocalWorldSize) {
  EnvironmentVariables env = torchrun_env();
  env["LOCAL_RANK"] = "4";
  const std::string message = invalid_argument_message([&] { select_cluster_environment(env); });
  EXPECT_NE(message.find("LOCAL_RANK=4"), std::string::npos) << message;
  EXPECT_NE(message.find("LOCAL_WORLD_SIZE=4"), std::string::npos) << message;
}

TEST(TorchElasticEnvironmentTest, RejectsBadPortAndEmptyAddress) {
  EnvironmentVariables env = torchrun_env();
  env["MASTER_PORT"] = "70000";
  EXPECT_NE(invalid_argument_message([&] { select_cluster_environment(env); }).find("MASTER_PORT"),
            std::string::npos);
  env = torchrun_env();
  env["MASTER_ADDR"] = "";
  EXPECT_NE(invalid_argument_message([&] { select_cluster_environment(env); }).find("MASTER_ADDR"),
            std::string::npos);
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
        invalid_argument_message([&] { SLURMEnvironment::first_host(nodelist); });
    EXPECT_NE(message.find("SLURM_NODELIST"), std::string::npos) << "'" << nodelist << "'";
  }
}

TEST(SLURMEnvironmentTest, ReadsSrunVariables) {
  const SLURMEnvironment env(srun_env());
  EXPECT_EQ(env.name(), "slurm");
  EXPECT_EQ(env.main_address(), "node01");
  EXPECT_EQ(env.main_port(), 15000 + 4567);
  EXPECT_EQ(env.world_size(), 8);
  EXPECT_EQ(env.global_rank(), 6);
  EXPECT_EQ(env.local_rank(), 2);
  EXPECT_EQ(env.local_world_size(), 4);
  EXPECT_EQ(env.node_rank(), 1);
}

TEST(SLURMEnvironmentTest, PortFromShortJobIdKeepsLeadingDigits) {
  EnvironmentVariables env = srun_env();
  env["SLURM_JOB_ID"] = "42";
  EXPECT_EQ(SLURMEnvironment(env).main_port(), 15042);
  env["SLURM_JOB_ID"] = "990007";
  EXPECT_EQ(SLURMEnvironment(env).main_port(), 15007);
}

TEST(SLURMEnvironmentTest, MasterVariablesOverrideDerivedOnes) {
  EnvironmentVariables env = srun_env();
  env["MASTER_ADDR"] = "10.1.2.3";
  env["MASTER_PORT"] = "29400";
  const SLURMEnvironment slurm(env);
  EXPECT_EQ(slurm.main_address(), "10.1.2.3");
  EXPECT_EQ(slurm.main_port(), 29400);
}

TEST(SLURMEnvironmentTest, NonNumericJobIdNamesVariable) {
  EnvironmentVariables env = srun_env();
  env["SLURM_JOB_ID"] = "12ab";
  const std::string message = invalid_argument_message([&] { SLURMEnvironment{env}; });
  EXPECT_NE(message.find("SLURM_JOB_ID='12ab'"), std::string::npos) << message;
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
  EXPECT_NE(invalid_argument_message([&] { SLURMEnvironment{env}; }).find("SLURM_NTASKS_PER_NODE"),
            std::string::npos);
}

TEST(SLURMEnvironmentTest, UnevenTasksWithoutPerNodeCountThrow) {
  EnvironmentVariables env = srun_env();
  env["SLURM_NTASKS"] = "7";
  env["SLURM_PROCID"] = "0";
  const std::string message = invalid_argument_message([&] { SLURMEnvironment{env}; });
  EXPECT_NE(message.find("SLURM_NNODES=2"), std::string::npos) << message;
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
  EnvironmentVariables env = srun_env();
  env["SLURM_PROCID"] = "8";
  const std::string message = invalid_argument_message([&] { select_cluster_environment(env); });
  EXPECT_NE(message.find("SLURM_PROCID=8"), std::string::npos) << message;
  EXPECT_NE(message.find("SLURM_NTASKS=8"), std::string::npos) << message;

  env.erase("SLURM_LOCALID");
  EXPECT_NE(
      invalid_argument_message([&] { select_cluster_environment(env); }).find("SLURM_LOCALID"),
      std::string::npos);
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
  EXPECT_EQ(selected->main_address(), "127.0.0.1");
  EXPECT_EQ(selected->main_port(), 0);
  EXPECT_EQ(selected->world_size(), 1);
  EXPECT_EQ(selected->global_rank(), 0);
  EXPECT_EQ(selected->local_rank(), 0);
  EXPECT_EQ(selected->local_world_size(), 1);
  EXPECT_EQ(selected->node_rank(), 0);
}

TEST(CurrentEnvironmentTest, SnapshotsEnviron) {
  setenv("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST", "a=b", 1);
  const EnvironmentVariables env = current_environment();
  unsetenv("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST");
  ASSERT_EQ(env.count("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST"), 1u);
  EXPECT_EQ(env.at("PIPETRAIN_CLUSTER_ENVIRONMENT_TEST"), "a=b");
}

}  // namespace
}  // namespace pipetrain
