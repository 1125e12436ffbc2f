// Ranks meet in a TCPStore. Under torchrun the agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True)
// and every rank, rank 0 included, joins it as a client, keeping its keys under
// /worker/attempt_<restart count>/ as torch.distributed does.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "distributed/world_connection.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/world.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::world_rendezvous_test {
namespace {

PIPETRAIN_WORKER(agent_store_worker) {
  EnvironmentVariables env = current_environment();
  env.erase("PIPETRAIN_RENDEZVOUS_FILE");  // this test's own launcher's file, unused here
  env["MASTER_PORT"] = env.at("TEST_AGENT_STORE_PORT");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "3";
  auto world = World::connect(TorchElasticEnvironment(env));
  world->barrier();
  store(*world)->set("joined/" + std::to_string(world->rank()), std::vector<uint8_t>{1});
  world->barrier();
}

TEST(WorldRendezvous, EveryRankJoinsAStoreItsLauncherHosts) {
  c10d::TCPStoreOptions options;
  options.port = 0;  // any free port: the point is that no rank listens on it
  options.isServer = true;
  options.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  ASSERT_EQ(run_ranks(2, "agent_store_worker",
                      {{"TEST_AGENT_STORE_PORT", std::to_string(store->getPort())}}),
            0);
  EXPECT_TRUE(store->check({"/worker/attempt_3/joined/0", "/worker/attempt_3/joined/1"}));
}

}  // namespace
}  // namespace pipetrain::testing::world_rendezvous_test
