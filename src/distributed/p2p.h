// Tensors between neighbouring stages. Users never declare stage shapes: the first packet of each
// direction in a step is preceded by a small header (per tensor: dtype, dims, whether it needs a
// gradient) so the receiver can allocate it; the rest of the step's packets have the same shapes
// apart from dim 0, the micro-batch's rows, which both sides know. One header per step, not per
// micro-batch, because on a GPU reading a header means waiting for it on the host. Sends are
// asynchronous and only awaited at the end of a step, so two stages sending to each other at the
// same moment (1F1B's steady state) never wait on each other; activations and gradients travel in
// process groups of their own (on NCCL, streams of their own) for the same reason.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "util/compat.h"

namespace pipetrain {

class World;

// The two directions of a pipeline (activations to the next stage, gradients to the previous),
// each with tags of its own.
enum class Flow { kActivation, kGradient };

// Tensors that travel together: a stage's outputs for one micro-batch, or their gradients.
struct Packet {
  std::vector<at::Tensor> tensors;
  // Per tensor, whether the receiver gets it as a leaf that requires grad (empty: none do).
  std::vector<bool> requires_grad;
  int64_t label = 0;  // the sender's word on what the tensors are (Pipe: how a layer packed them)
};

class PeerToPeer {
 public:
  // Packets larger than this many tensors are refused: the header has a fixed size.
  static constexpr int64_t kMaxTensors = 16;

  explicit PeerToPeer(std::shared_ptr<World> world);

  // Starts sending `packet`'s tensors (of the world's device) to rank `dst`; they are kept alive
  // until wait_for_sends(). Within a step, every packet of a flow and channel must have the first
  // one's label, dtypes and shapes but for dim 0; given `rows` (>= 0), every tensor's dim 0 must
  // be `rows` (stage boundaries pass batch-first tensors on). A channel is a boundary of its own
  // between the same two ranks (ranks holding several stages), with a header of its own; packets of
  // all channels of a flow still arrive in the order sent. Returns the last send, for callers that
  // must not overwrite the tensors before they have gone.
  WorkPtr send(const Packet& packet, int64_t dst, Flow flow, int64_t rows = -1,
               int64_t channel = 0);
  WorkPtr send(const at::Tensor& tensor, int64_t dst, Flow flow, int64_t rows = -1);
  // Receives the next packet of `flow` from rank `src`, whose tensors have `rows` rows (dim 0)
  // unless it is the first of the step on its channel. On CUDA it returns at once, the current
  // stream waiting for the data. Blocks (up to the world's timeout) on CPU, and for headers.
  Packet recv(int64_t src, Flow flow, int64_t rows = -1, int64_t channel = 0);
  // Asks rank `src` now for the next packet of `flow` that recv() will take, where its shape is
  // known (this step's header for `channel` has come): Gloo sends a tensor's bytes only once the
  // receiver has asked, so asking early lets them travel while this rank computes instead of
  // costing a round trip when recv() comes. recv() takes posted packets in the order posted, which
  // must be the order it would have received them in. Returns false, posting nothing, where the
  // shape is not known yet.
  bool post_recv(int64_t src, Flow flow, int64_t rows, int64_t channel = 0);
  // The one tensor of the next packet.
  at::Tensor recv_tensor(int64_t src, Flow flow, int64_t rows = -1);
  // Waits until every started send has completed, and starts a new step: the next packet of each
  // flow carries a header again.
  void wait_for_sends();

 private:
  struct TensorShape {
    c10::ScalarType dtype;
    bool requires_grad;
    std::vector<int64_t> sizes;
    bool operator==(const TensorShape& other) const;
  };
  struct PacketShape {
    int64_t label = 0;
    std::vector<TensorShape> tensors;
  };
  const ProcessGroupPtr& group(Flow flow) const;
  // Throws naming both shapes when `now` is not `first` but for dim 0.
  static void check_same_shape(const PacketShape& first, const PacketShape& now, Flow flow);

  std::shared_ptr<World> world_;
  std::shared_ptr<World> gradients_;  // a twin of world_ carrying gradients only
  struct Send {
    WorkPtr work;
    int64_t dst;
    at::Tensor tensor;  // alive until the send completes
  };
  std::vector<Send> pending_sends_;
  // A packet whose tensors' receives have started.
  struct Arriving {
    int64_t channel = 0;
    int64_t rows = -1;
    Packet packet;
    std::vector<WorkPtr> works;
  };
  Arriving start_receiving(int64_t src, Flow flow, const PacketShape& shape, int64_t channel,
                           int64_t rows);
  // The shape of the next packet on `channel`: this step's header's, but for `rows`; the header is
  // received first where none has come yet (or `rows` < 0).
  PacketShape next_shape(int64_t src, Flow flow, int64_t rows, int64_t channel);
  // Posted ahead by post_recv, per (peer, flow), oldest first.
  std::map<std::pair<int64_t, Flow>, std::deque<Arriving>> posted_;
  // What this step's first header said, per (peer, flow, channel).
  std::map<std::tuple<int64_t, Flow, int64_t>, PacketShape> sent_, received_;
};

}  // namespace pipetrain
