#include "rendezvous_store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace pipetrain {
namespace {

#if TORCH_VERSION_MAJOR >= 2
// A socket listening on `address` (a loopback address) at `port`, for TCPStoreOptions::
// masterListenFd: the store takes it over instead of listening on every interface itself.
int loopback_listener(const std::string& address, int port) {
  const bool ipv6 = address == "::1";
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw std::runtime_error(std::string("cannot create a TCP socket: ") + std::strerror(errno));
  }
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  int bound = -1;
  if (ipv6) {
    sockaddr_in6 socket_address{};
    socket_address.sin6_family = AF_INET6;
    socket_address.sin6_port = htons(static_cast<uint16_t>(port));
    socket_address.sin6_addr = in6addr_loopback;
    bound = bind(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address));
  } else {
    sockaddr_in socket_address{};
    socket_address.sin_family = AF_INET;
    socket_address.sin_port = htons(static_cast<uint16_t>(port));
    // "localhost" and any 127.x address listen on 127.0.0.1, where "localhost" resolves.
    socket_address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (address.rfind("127.", 0) == 0)
      inet_pton(AF_INET, address.c_str(), &socket_address.sin_addr);
    bound = bind(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address));
  }
  if (bound != 0 || listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    close(fd);
    throw std::runtime_error("cannot listen on " + address + ":" + std::to_string(port) + ": " +
                             std::strerror(error) +
                             (error == EADDRINUSE ? " (is another run using MASTER_PORT?)" : ""));
  }
  return fd;
}
#endif

// The port of the peer `fd` is connected to over TCP, or -1 (not a socket, not connected).
int peer_port(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return -1;
  if (peer.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(peer).sin_port);
  if (peer.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(peer).sin6_port);
  }
  return -1;
}

}  // namespace

// c10d's TCPStore client reads a reply without a limit (check, compareSet, add; Torch 1.13's get
// too), so a peer that accepts and never answers (another program on MASTER_PORT, a store whose
// process stopped) held a rank forever; its calls now fail with "Socket Timeout" instead.
void limit_store_waits(int port, std::chrono::milliseconds timeout) {
  if (port <= 0) return;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return;  // no /proc: the store keeps Torch's own limits
  timeval limit{};
  limit.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  limit.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
  while (const dirent* entry = readdir(fds)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == dirfd(fds) || peer_port(fd) != port) continue;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  }
  closedir(fds);
}

bool is_loopback_address(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

std::string describe_rendezvous(const ClusterEnvironment& env) {
  if (!env.rendezvous_file().empty()) return "file " + env.rendezvous_file();
  return env.main_address() + ":" + std::to_string(env.main_port());
}

StorePtr join_rendezvous(const ClusterEnvironment& env, int64_t rank,
                         std::chrono::milliseconds timeout) {
  try {
    if (!env.rendezvous_file().empty()) {
      // No worker count: the launcher removes the file's directory when the run ends, so no rank
      // leaving early can delete it under the others.
      auto store = c10::make_intrusive<c10d::FileStore>(env.rendezvous_file(), -1);
      store->setTimeout(timeout);
      return store;
    }
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.main_port());
    options.isServer = rank == 0 && !env.launcher_hosts_store();
    options.numWorkers = static_cast<std::size_t>(env.world_size());
    // Arrival is checked afterwards, naming who is missing, rather than inside the constructor.
    options.waitWorkers = false;
    options.timeout = timeout;
#if TORCH_VERSION_MAJOR >= 2
    if (options.isServer && is_loopback_address(env.main_address())) {
      options.masterListenFd = loopback_listener(env.main_address(), env.main_port());
    }
#endif
    StorePtr store = c10::make_intrusive<c10d::TCPStore>(env.main_address(), options);
    limit_store_waits(env.main_port(), timeout);
    if (env.launcher_hosts_store()) {
      store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix(), store);
    }
    return store;
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(rank) +
                             ": could not join the rendezvous at " + describe_rendezvous(env) +
                             " (" + e.what() +
                             "). Check MASTER_ADDR/MASTER_PORT and that every rank was started.");
  }
}

}  // namespace pipetrain
