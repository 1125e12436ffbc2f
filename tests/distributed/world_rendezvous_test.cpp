// Ranks meet in a TCPStore. Under torchrun the agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True)
// and every rank, rank 0 included, joins it as a client, keeping its keys under
// /worker/attempt_<restart count>/ as torch.distributed does. Whatever answers at MASTER_PORT, the
// rendezvous gives up after the timeout.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

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

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A port where connections are accepted and never answered: another program on MASTER_PORT.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    accepter_ = std::thread([this] {
      for (int client; (client = accept(fd_, nullptr, nullptr)) >= 0;) clients_.push_back(client);
    });
  }
  ~SilentListener() {
    shutdown(fd_, SHUT_RDWR);  // ends accept()
    accepter_.join();
    for (int client : clients_) close(client);
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> clients_;
  std::thread accepter_;
};

PIPETRAIN_WORKER(silent_store_worker) {
  alarm(120);  // a rendezvous that never gives up ends here, failing the test instead of hanging
  EnvironmentVariables env = current_environment();
  env.erase("PIPETRAIN_RENDEZVOUS_FILE");
  env["MASTER_PORT"] = env.at("TEST_SILENT_PORT");
  env["RANK"] = "1";  // a client of the store rank 0 would serve there
  env["WORLD_SIZE"] = "2";
  std::string error = "World::connect returned";
  try {
    World::connect(TorchElasticEnvironment(env), std::chrono::seconds(1));
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::ofstream(env.at("TEST_ERROR_FILE")) << error;
}

TEST(WorldRendezvous, AStoreThatNeverAnswersFailsWithinTheTimeout) {
  SilentListener listener;
  const std::string error_file = make_temp_dir("silent-store") + "/error.txt";
  ASSERT_EQ(run_ranks(1, "silent_store_worker",
                      {{"TEST_SILENT_PORT", std::to_string(listener.port())},
                       {"TEST_ERROR_FILE", error_file}}),
            0);
  const std::string error = read_text(error_file);
  std::filesystem::remove_all(std::filesystem::path(error_file).parent_path());
  EXPECT_NE(error.find("rank 1: the rendezvous at 127.0.0.1:" + std::to_string(listener.port()) +
                       " did not answer within 1 s (--timeout)"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace pipetrain::testing::world_rendezvous_test
