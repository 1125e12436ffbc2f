#include "pipetrain/p2p.h"

#include <torch/torch.h>

#include <sstream>
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

PeerToPeer::PeerToPeer(std::shared_ptr<World> world) : world_(std::move(world)) {}

void PeerToPeer::send(const at::Tensor& tensor, int64_t dst, Flow flow) {
  auto payload = tensor.contiguous();
  std::vector<at::Tensor> header{make_header(payload)};
  std::vector<at::Tensor> body{payload};
  auto& pg = world_->process_group();
  pending_sends_.push_back(pg->send(header, static_cast<int>(dst), header_tag(flow)));
  pending_sends_.push_back(pg->send(body, static_cast<int>(dst), payload_tag(flow)));
  pending_tensors_.push_back(header[0]);
  pending_tensors_.push_back(payload);
}

at::Tensor PeerToPeer::recv(int64_t src, Flow flow) {
  auto& pg = world_->process_group();
  try {
    std::vector<at::Tensor> header{torch::empty({kHeaderSize}, torch::kInt64)};
    pg->recv(header, static_cast<int>(src), header_tag(flow))->wait(world_->timeout());
    auto h = header[0].accessor<int64_t, 1>();
    std::vector<int64_t> sizes(h.data() + 2, h.data() + 2 + h[1]);
    auto dtype = static_cast<c10::ScalarType>(h[0]);
    std::vector<at::Tensor> body{torch::empty(sizes, torch::TensorOptions().dtype(dtype))};
    pg->recv(body, static_cast<int>(src), payload_tag(flow))->wait(world_->timeout());
    return body[0];
  } catch (const std::exception& e) {
    std::ostringstream message;
    message << "rank " << world_->global_rank(world_->rank()) << " could not receive the "
            << flow_name(flow) << " from rank " << world_->global_rank(src) << ": "
            << error_message(e);
    const auto first = world_->published_error();
    if (!first.empty())
      message << "\nfirst error: " << first;
    else
      message << "\nrank " << world_->global_rank(src)
              << " may have exited: see its error, if any, above.";
    throw std::runtime_error(message.str());
  }
}

void PeerToPeer::wait_for_sends() {
  for (auto& work : pending_sends_) work->wait(world_->timeout());
  pending_sends_.clear();
  pending_tensors_.clear();
}

}  // namespace pipetrain
