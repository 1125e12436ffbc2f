#include "pipetrain/p2p.h"

#include <torch/torch.h>

#include <stdexcept>

#include "pipetrain/error.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

// Header layout: [dtype, ndim, dim0, ..., dim7]. Eight dims cover every layer output we know of.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;

int header_tag(Flow flow) { return 2 * static_cast<int>(flow); }
int payload_tag(Flow flow) { return header_tag(flow) + 1; }
const char* flow_name(Flow flow) {
  switch (flow) {
    case Flow::kActivation:
      return "activation";
    case Flow::kGradient:
      return "gradient";
    case Flow::kResult:
      return "result";
  }
  return "tensor";
}

// dtype, rank and sizes of `tensor`, as the receiver needs them to allocate its buffer.
at::Tensor make_header(const at::Tensor& tensor) {
  if (tensor.dim() > kMaxDims) {
    throw std::invalid_argument("a stage output has " + std::to_string(tensor.dim()) +
                                " dimensions; pipetrain sends at most " + std::to_string(kMaxDims) +
                                " between stages");
  }
  auto header = torch::zeros({kHeaderSize}, torch::kInt64);
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(tensor.scalar_type());
  h[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) h[2 + d] = tensor.size(d);
  return header;
}

}  // namespace

PeerToPeer::PeerToPeer(std::shared_ptr<World> world)
    : world_(std::move(world)), gradients_(world_->twin()) {}

const ProcessGroupPtr& PeerToPeer::group(Flow flow) const {
  return flow == Flow::kGradient ? gradients_->process_group() : world_->process_group();
}

WorkPtr PeerToPeer::send(const at::Tensor& tensor, int64_t dst, Flow flow) {
  auto payload = tensor.contiguous();
  auto& pg = group(flow);
  const auto key = std::make_pair(dst, flow);
  auto first = sent_.find(key);
  if (flow == Flow::kResult || first == sent_.end()) {
    const auto header = make_header(payload).to(world_->device());
    std::vector<at::Tensor> tensors{header};
    pending_sends_.push_back(
        {pg->send(tensors, static_cast<int>(dst), header_tag(flow)), dst, header});
    if (flow != Flow::kResult) sent_[key] = {payload.scalar_type(), payload.sizes().vec()};
  } else {
    const Shape& shape = first->second;
    const bool same = payload.scalar_type() == shape.dtype && payload.dim() > 0 &&
                      payload.dim() == static_cast<int64_t>(shape.sizes.size()) &&
                      payload.sizes().slice(1).equals(at::IntArrayRef(shape.sizes).slice(1));
    if (!same) {
      throw std::invalid_argument(
          std::string("a stage passed on a ") + flow_name(flow) + " of shape " +
          shape_text(payload.sizes()) + " after one of shape " + shape_text(shape.sizes) +
          " in the same step: apart from dim 0 (the micro-batch's rows) every micro-batch's "
          "tensors must have the same shape and dtype");
    }
  }
  std::vector<at::Tensor> body{payload};
  pending_sends_.push_back(
      {pg->send(body, static_cast<int>(dst), payload_tag(flow)), dst, payload});
  return pending_sends_.back().work;
}

at::Tensor PeerToPeer::recv(int64_t src, Flow flow, int64_t rows) {
  auto& pg = group(flow);
  const auto key = std::make_pair(src, flow);
  try {
    auto first = received_.find(key);
    Shape shape;
    if (flow == Flow::kResult || rows < 0 || first == received_.end()) {
      std::vector<at::Tensor> header{torch::empty(
          {kHeaderSize}, torch::TensorOptions(torch::kInt64).device(world_->device()))};
      world_->wait(pg->recv(header, static_cast<int>(src), header_tag(flow)));
      const auto h_cpu = header[0].cpu();  // the one host wait of the step for this flow
      auto h = h_cpu.accessor<int64_t, 1>();
      shape.dtype = static_cast<c10::ScalarType>(h[0]);
      shape.sizes.assign(h.data() + 2, h.data() + 2 + h[1]);
      if (flow != Flow::kResult) received_[key] = shape;
    } else {
      shape = first->second;
      shape.sizes[0] = rows;
    }
    std::vector<at::Tensor> body{
        torch::empty(shape.sizes, torch::TensorOptions(shape.dtype).device(world_->device()))};
    world_->wait(pg->recv(body, static_cast<int>(src), payload_tag(flow)));
    return body[0];
  } catch (const std::exception& e) {
    world_->fail(std::string("receive the ") + flow_name(flow) + " from", e, src);
  }
}

void PeerToPeer::wait_for_sends() {
  for (auto& send : pending_sends_) {
    try {
      world_->wait(send.work);
    } catch (const std::exception& e) {
      world_->fail("send to", e, send.dst);
    }
  }
  pending_sends_.clear();
  sent_.clear();
  received_.clear();
}

}  // namespace pipetrain
