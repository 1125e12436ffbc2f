#include "pipeline/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <mutex>
#include <stdexcept>

namespace pipetrain {

CheckpointMode parse_checkpoint_mode(const std::string& name) {
  if (name == "always") return CheckpointMode::kAlways;
  if (name == "except_last") return CheckpointMode::kExceptLast;
  if (name == "never") return CheckpointMode::kNever;
  throw std::invalid_argument("unknown checkpoint mode '" + name +
                              "': use always, except_last or never");
}

std::vector<std::string> checkpoint_mode_names() { return {"always", "except_last", "never"}; }

int64_t recompute_below(CheckpointMode mode, int64_t chunks) {
  switch (mode) {
    case CheckpointMode::kAlways:
      return chunks;
    case CheckpointMode::kExceptLast:
      return chunks - 1;
    case CheckpointMode::kNever:
      return 0;
  }
  return 0;
}

namespace {

at::Tensor state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace

RngState RngState::capture(const c10::Device& device) {
  RngState state;
  state.cpu_state_ = state_of(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda()) {
    state.device_ = device;
    state.device_state_ = state_of(at::globalContext().defaultGenerator(device));
  }
  return state;
}

RngState RngState::from(at::Tensor cpu_state, const c10::Device& device, at::Tensor device_state) {
  RngState state;
  state.cpu_state_ = std::move(cpu_state);
  if (device.is_cuda() && device_state.defined()) {
    state.device_ = device;
    state.device_state_ = std::move(device_state);
  }
  return state;
}

void RngState::restore() const {
  set_state(at::detail::getDefaultCPUGenerator(), cpu_state_);
  if (device_state_.defined())
    set_state(at::globalContext().defaultGenerator(device_), device_state_);
}

}  // namespace pipetrain
