#include "distributed/p2p.h"

#include <torch/torch.h>

#include <stdexcept>

#include "distributed/world_connection.h"
#include "pipetrain/error.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

// Header layout: [label, tensor count, then per tensor: dtype, requires_grad, ndim, dim0..dim7].
// Eight dims cover every layer output we know of.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kPerTensor = 3 + kMaxDims;
constexpr int64_t kHeaderSize = 2 + PeerToPeer::kMaxTensors * kPerTensor;

int header_tag(Flow flow) { return 2 * static_cast<int>(flow); }
int payload_tag(Flow flow) { return header_tag(flow) + 1; }
const char* flow_name(Flow flow) {
  switch (flow) {
    case Flow::kActivation:
      return "activation";
    case Flow::kGradient:
      return "gradient";
  }
  return "tensor";
}

std::string packet_text(const std::vector<at::Tensor>& tensors) {
  std::string text;
  for (const auto& t : tensors) text += (text.empty() ? "" : ", ") + shape_text(t.sizes());
  return text;
}

}  // namespace

bool PeerToPeer::TensorShape::operator==(const TensorShape& other) const {
  return dtype == other.dtype && requires_grad == other.requires_grad &&
         sizes.size() == other.sizes.size() &&
         (sizes.empty() ||
          at::IntArrayRef(sizes).slice(1).equals(at::IntArrayRef(other.sizes).slice(1)));
}

void PeerToPeer::check_same_shape(const PacketShape& first, const PacketShape& now, Flow flow) {
  bool same = first.label == now.label && first.tensors.size() == now.tensors.size();
  for (size_t i = 0; same && i < now.tensors.size(); ++i) same = first.tensors[i] == now.tensors[i];
  if (same) return;
  const auto text = [](const PacketShape& shape) {
    std::string out;
    for (const auto& t : shape.tensors) {
      out += (out.empty() ? "" : ", ") + shape_text(t.sizes) + " " + c10::toString(t.dtype);
    }
    return "(" + out + ")";
  };
  throw std::invalid_argument(
      std::string("a stage passed on ") + flow_name(flow) + "s " + text(now) + " after " +
      text(first) +
      " in the same step: apart from dim 0 (the micro-batch's rows) every micro-batch's tensors "
      "must have the same number, shapes and dtypes");
}

PeerToPeer::PeerToPeer(std::shared_ptr<World> world)
    : world_(std::move(world)), gradients_(world_->twin()) {}

const ProcessGroupPtr& PeerToPeer::group(Flow flow) const {
  return flow == Flow::kGradient ? process_group(*gradients_) : process_group(*world_);
}

WorkPtr PeerToPeer::send(const at::Tensor& tensor, int64_t dst, Flow flow, int64_t rows) {
  return send(Packet{{tensor}, {}, 0}, dst, flow, rows);
}

WorkPtr PeerToPeer::send(const Packet& packet, int64_t dst, Flow flow, int64_t rows,
                         int64_t channel) {
  const auto count = static_cast<int64_t>(packet.tensors.size());
  if (count < 1 || count > kMaxTensors) {
    throw std::invalid_argument("a stage passed on " + std::to_string(count) +
                                " tensors at once; " + "pipetrain sends 1 to " +
                                std::to_string(kMaxTensors) + " between stages");
  }
  PacketShape shape{packet.label, {}};
  std::vector<at::Tensor> payloads;
  for (int64_t i = 0; i < count; ++i) {
    auto payload = packet.tensors[i].contiguous();
    if (payload.dim() > kMaxDims) {
      throw std::invalid_argument("a stage output has " + std::to_string(payload.dim()) +
                                  " dimensions; pipetrain sends at most " +
                                  std::to_string(kMaxDims) + " between stages");
    }
    if (rows >= 0 && (payload.dim() == 0 || payload.size(0) != rows)) {
      throw std::invalid_argument(
          std::string("a stage passed on ") + flow_name(flow) + "s of shapes " +
          packet_text(packet.tensors) + " for a micro-batch of " + std::to_string(rows) +
          " rows: every tensor that crosses a stage boundary must be batch-first (dim 0 the "
          "micro-batch's rows), as the micro-batches are cut along dim 0");
    }
    const bool requires_grad =
        i < static_cast<int64_t>(packet.requires_grad.size()) && packet.requires_grad[i];
    shape.tensors.push_back({payload.scalar_type(), requires_grad, payload.sizes().vec()});
    payloads.push_back(std::move(payload));
  }
  auto& pg = group(flow);
  const auto key = std::make_tuple(dst, flow, channel);
  auto first = sent_.find(key);
  if (first == sent_.end()) {
    auto header = torch::zeros({kHeaderSize}, torch::kInt64);
    auto h = header.accessor<int64_t, 1>();
    h[0] = shape.label;
    h[1] = count;
    for (int64_t i = 0; i < count; ++i) {
      const TensorShape& t = shape.tensors[i];
      const int64_t at = 2 + i * kPerTensor;
      h[at] = static_cast<int64_t>(t.dtype);
      h[at + 1] = t.requires_grad ? 1 : 0;
      h[at + 2] = static_cast<int64_t>(t.sizes.size());
      for (size_t d = 0; d < t.sizes.size(); ++d) h[at + 3 + d] = t.sizes[d];
    }
    header = header.to(world_->device());
    std::vector<at::Tensor> tensors{header};
    pending_sends_.push_back(
        {pg->send(tensors, static_cast<int>(dst), header_tag(flow)), dst, header});
    sent_[key] = shape;
  } else {
    check_same_shape(first->second, shape, flow);
  }
  for (auto& payload : payloads) {
    std::vector<at::Tensor> body{payload};
    pending_sends_.push_back(
        {pg->send(body, static_cast<int>(dst), payload_tag(flow)), dst, std::move(payload)});
  }
  return pending_sends_.back().work;
}

PeerToPeer::PacketShape PeerToPeer::next_shape(int64_t src, Flow flow, int64_t rows,
                                               int64_t channel) {
  const auto key = std::make_tuple(src, flow, channel);
  const auto first = received_.find(key);
  if (rows >= 0 && first != received_.end()) {
    PacketShape shape = first->second;
    for (auto& t : shape.tensors) t.sizes[0] = rows;
    return shape;
  }
  std::vector<at::Tensor> header{
      torch::empty({kHeaderSize}, torch::TensorOptions(torch::kInt64).device(world_->device()))};
  wait(*world_, group(flow)->recv(header, static_cast<int>(src), header_tag(flow)));
  const auto h_cpu = header[0].cpu();  // the one host wait of the step for this flow
  auto h = h_cpu.accessor<int64_t, 1>();
  PacketShape shape;
  shape.label = h[0];
  for (int64_t i = 0; i < h[1]; ++i) {
    const int64_t at = 2 + i * kPerTensor;
    shape.tensors.push_back(
        {static_cast<c10::ScalarType>(h[at]), h[at + 1] != 0,
         std::vector<int64_t>(h.data() + at + 3, h.data() + at + 3 + h[at + 2])});
  }
  received_[key] = shape;
  return shape;
}

PeerToPeer::Arriving PeerToPeer::start_receiving(int64_t src, Flow flow, const PacketShape& shape,
                                                 int64_t channel, int64_t rows) {
  Arriving arriving{channel, rows, Packet{}, {}};
  arriving.packet.label = shape.label;
  for (const TensorShape& t : shape.tensors) {
    std::vector<at::Tensor> body{
        torch::empty(t.sizes, torch::TensorOptions(t.dtype).device(world_->device()))};
    arriving.works.push_back(group(flow)->recv(body, static_cast<int>(src), payload_tag(flow)));
    arriving.packet.tensors.push_back(body[0]);
    arriving.packet.requires_grad.push_back(t.requires_grad);
  }
  return arriving;
}

bool PeerToPeer::post_recv(int64_t src, Flow flow, int64_t rows, int64_t channel) {
  if (rows < 0 || received_.count(std::make_tuple(src, flow, channel)) == 0) return false;
  try {
    posted_[{src, flow}].push_back(
        start_receiving(src, flow, next_shape(src, flow, rows, channel), channel, rows));
  } catch (const std::exception& e) {
    world_->fail(std::string("receive the ") + flow_name(flow) + " from", e, src);
  }
  return true;
}

Packet PeerToPeer::recv(int64_t src, Flow flow, int64_t rows, int64_t channel) {
  auto& posted = posted_[{src, flow}];
  if (!posted.empty() && (posted.front().channel != channel || posted.front().rows != rows)) {
    throw std::logic_error("a receive of " + std::string(flow_name(flow)) + "s from rank " +
                           std::to_string(src) + " on channel " + std::to_string(channel) + " (" +
                           std::to_string(rows) + " rows) came while one on channel " +
                           std::to_string(posted.front().channel) + " (" +
                           std::to_string(posted.front().rows) +
                           " rows) was posted ahead of it: receives must be taken in the order "
                           "posted");
  }
  try {
    Arriving arriving;
    if (posted.empty()) {
      arriving = start_receiving(src, flow, next_shape(src, flow, rows, channel), channel, rows);
    } else {
      arriving = std::move(posted.front());
      posted.pop_front();
    }
    for (const auto& work : arriving.works) wait(*world_, work);
    for (size_t i = 0; i < arriving.packet.tensors.size(); ++i) {
      if (arriving.packet.requires_grad[i]) arriving.packet.tensors[i].requires_grad_(true);
    }
    return std::move(arriving.packet);
  } catch (const std::exception& e) {
    world_->fail(std::string("receive the ") + flow_name(flow) + " from", e, src);
  }
}

at::Tensor PeerToPeer::recv_tensor(int64_t src, Flow flow, int64_t rows) {
  auto packet = recv(src, flow, rows);
  if (packet.tensors.size() != 1) {
    throw std::logic_error("expected one tensor from rank " + std::to_string(src) + ", got " +
                           std::to_string(packet.tensors.size()));
  }
  return packet.tensors[0];
}

void PeerToPeer::wait_for_sends() {
  for (const auto& [peer_and_flow, posted] : posted_) {
    if (!posted.empty()) {
      const std::string message = "a step ended with " + std::to_string(posted.size()) + " " +
                                  flow_name(peer_and_flow.second) + " receives from rank " +
                                  std::to_string(peer_and_flow.first) + " posted but never taken";
      posted_.clear();
      throw std::logic_error(message);
    }
  }
  posted_.clear();
  for (auto& send : pending_sends_) {
    try {
      wait(*world_, send.work);
    } catch (const std::exception& e) {
      world_->fail("send to", e, send.dst);
    }
  }
  pending_sends_.clear();
  sent_.clear();
  received_.clear();
}

}  // namespace pipetrain
