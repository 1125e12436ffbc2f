#include "process_group.h"

#include "rendezvous_store.h"

#ifdef PIPETRAIN_HAS_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef PIPETRAIN_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/cuda.h>

#include <cstdlib>
#include <stdexcept>

namespace pipetrain {

#ifdef PIPETRAIN_HAS_GLOO
namespace {

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& main_address) {
  if (is_loopback_address(main_address)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace
#endif

ProcessGroupPtr make_gloo_group(const StorePtr& store, int64_t rank, int64_t size,
                                std::chrono::milliseconds timeout,
                                const std::string& main_address) {
#ifdef PIPETRAIN_HAS_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  options->devices.push_back(gloo_device(main_address));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                     static_cast<int>(size), options);
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)main_address;
  throw std::runtime_error(
      "this pipetrain was built without Gloo (its libtorch ships no gloo headers), so processes "
      "on CPU cannot talk to each other: use --accelerator cuda, or build against a libtorch "
      "with Gloo headers");
#endif
}

ProcessGroupPtr make_nccl_group(const StorePtr& store, int64_t rank, int64_t size,
                                std::chrono::milliseconds timeout, int64_t device) {
#ifdef PIPETRAIN_HAS_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                     static_cast<int>(size), options);
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)device;
  throw std::runtime_error(
      "this pipetrain was built against a libtorch without CUDA: use --accelerator cpu");
#endif
}

bool cuda_available() {
#ifdef PIPETRAIN_HAS_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

}  // namespace pipetrain
