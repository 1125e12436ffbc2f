#include "process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

namespace pipetrain {
namespace {

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& main_address) {
  if (is_loopback(main_address)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

ProcessGroupPtr make_gloo_group(const StorePtr& store, int64_t rank, int64_t size,
                                std::chrono::milliseconds timeout,
                                const std::string& main_address) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  options->devices.push_back(gloo_device(main_address));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                     static_cast<int>(size), options);
}

}  // namespace pipetrain
