// Where the ranks meet must not be reachable from the network when they all run on one machine:
// the test reads the listening TCP sockets of the running processes from /proc/net/tcp{,6}.
#include "distributed/rendezvous_store.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/world.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::rendezvous_store_test {
namespace {

namespace fs = std::filesystem;

struct Listener {
  std::string address;  // "127.0.0.1", "0.0.0.0", "::", "::1", or the hex of another
  int port = 0;
};

// The socket inodes `pid` holds open.
std::set<std::string> socket_inodes(pid_t pid) {
  std::set<std::string> inodes;
  const fs::path fds = fs::path("/proc") / std::to_string(pid) / "fd";
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(fds, error)) {
    const std::string target = fs::read_symlink(entry.path(), error).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  return inodes;
}

// The children of this process (the ranks run_ranks started).
std::vector<pid_t> children() {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // "pid (comm) state ppid ...": comm may hold spaces, so read after its closing parenthesis.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent == getpid()) pids.push_back(std::stoi(name));
  }
  return pids;
}

std::string readable_address(const std::string& hex) {
  if (hex == "0100007F") return "127.0.0.1";
  if (hex == "00000000") return "0.0.0.0";
  if (hex == "00000000000000000000000001000000") return "::1";
  if (hex == "00000000000000000000000000000000") return "::";
  return hex;
}

// The listening TCP sockets that the processes `pids` hold.
std::vector<Listener> listeners_of(const std::vector<pid_t>& pids) {
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    for (const std::string& inode : socket_inodes(pid)) inodes.insert(inode);
  }
  std::vector<Listener> listeners;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream file(table);
    std::string line;
    std::getline(file, line);  // column names
    while (std::getline(file, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
      const size_t colon = local.find(':');
      listeners.push_back({readable_address(local.substr(0, colon)),
                           std::stoi(local.substr(colon + 1), nullptr, 16)});
    }
  }
  return listeners;
}

bool wait_for_file(const fs::path& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// A rank that joins its world, says so, and stays connected until the test has looked.
PIPETRAIN_WORKER(connected_rank_worker) {
  const EnvironmentVariables env = current_environment();
  auto world = World::connect(*select_cluster_environment(env));
  world->barrier();
  const fs::path dir = env.at("TEST_DIR");
  std::ofstream(dir / ("rendezvous_" + std::to_string(world->rank())))
      << env.at("PIPETRAIN_RENDEZVOUS_FILE");
  if (!wait_for_file(dir / "looked", std::chrono::seconds(60))) std::exit(3);
  world->barrier();
}

TEST(RendezvousStore, ALocalLaunchListensOnLoopbackAlone) {
#ifndef PIPETRAIN_HAS_GLOO
  GTEST_SKIP() << "CPU ranks need Gloo, which this libtorch lacks";
#endif
  const fs::path dir = make_temp_dir("rendezvous_store_test");
  int exit_code = -1;
  std::thread launch([&] {
    exit_code = run_ranks(2, "connected_rank_worker", {{"TEST_DIR", dir.string()}});
  });
  const bool joined = wait_for_file(dir / "rendezvous_0", std::chrono::seconds(60)) &&
                      wait_for_file(dir / "rendezvous_1", std::chrono::seconds(60));
  std::vector<pid_t> pids = children();
  pids.push_back(getpid());  // the launcher
  const std::vector<Listener> listeners = listeners_of(pids);
  std::ofstream(dir / "looked") << "";
  launch.join();
  ASSERT_TRUE(joined);
  EXPECT_EQ(exit_code, 0);
  for (const Listener& listener : listeners) {
    EXPECT_TRUE(listener.address == "127.0.0.1" || listener.address == "::1")
        << "a rank or the launcher listens on " << listener.address << ":" << listener.port;
  }
  // Both ranks met in the launcher's file, which is gone with its directory.
  std::ifstream rank0(dir / "rendezvous_0"), rank1(dir / "rendezvous_1");
  std::string file0, file1;
  rank0 >> file0;
  rank1 >> file1;
  EXPECT_EQ(file0, file1);
  EXPECT_FALSE(file0.empty());
  EXPECT_FALSE(fs::exists(fs::path(file0).parent_path())) << file0;
  fs::remove_all(dir);
}

// Rank 0 of a hand launch serves the TCPStore itself. With a loopback MASTER_ADDR it listens
// there alone where Torch can be handed a socket (2.x); Torch 1.13 always listens on every
// interface (a documented limitation: should this start failing on 1.13, update the docs).
TEST(RendezvousStore, RankZeroOfAHandLaunchServesOnTheLoopbackAddress) {
  const int port = find_free_port();
  const TorchElasticEnvironment env({{"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", std::to_string(port)},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "2"}});
  const StorePtr store = join_rendezvous(env, 0, std::chrono::seconds(10));
  store->set("key", std::vector<uint8_t>{7});
  std::vector<std::string> addresses;
  for (const Listener& listener : listeners_of({getpid()})) {
    if (listener.port == port) addresses.push_back(listener.address);
  }
  ASSERT_FALSE(addresses.empty()) << "nothing listens on port " << port;
  for (const std::string& address : addresses) {
#if TORCH_VERSION_MAJOR >= 2
    EXPECT_EQ(address, "127.0.0.1");
#else
    EXPECT_TRUE(address == "::" || address == "0.0.0.0") << address;
#endif
  }
}

TEST(RendezvousStore, AnEmptyRendezvousFileIsRefusedByName) {
  try {
    TorchElasticEnvironment env({{"MASTER_ADDR", "127.0.0.1"},
                                 {"PIPETRAIN_RENDEZVOUS_FILE", ""},
                                 {"RANK", "0"},
                                 {"WORLD_SIZE", "2"}});
    FAIL() << "accepted an empty PIPETRAIN_RENDEZVOUS_FILE";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("PIPETRAIN_RENDEZVOUS_FILE"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::testing::rendezvous_store_test
