// PeerToPeer between two ranks (Gloo), driven directly: packets of several tensors arrive with
// their dtypes, shapes, requires_grad flags and label; later packets of a step reuse the first
// one's header with their own rows; a packet that changes shape mid-step, or a tensor that is not
// batch-first, is refused by name before anything is sent. Receives posted ahead (post_recv) give
// the packets recv() would have, in order, and a receive taken out of that order is refused.
#include "distributed/p2p.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/world.h"
#include "support/errors.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::p2p_test {
namespace {

// A worker's results: saved as `name` in RESULT_DIR, read back by the test from `dir`.
void save_result(const std::vector<at::Tensor>& tensors, const std::string& name) {
  torch::save(tensors, env_or("RESULT_DIR", ".") + "/" + name);
}

std::vector<at::Tensor> load_result(const std::string& dir, const std::string& name) {
  std::vector<at::Tensor> tensors;
  torch::load(tensors, dir + "/" + name);
  return tensors;
}

PIPETRAIN_WORKER(p2p_worker) {
  auto world = World::connect(*select_cluster_environment());
  PeerToPeer p2p(world);
  const auto values = torch::arange(12, torch::kFloat).reshape({3, 4});
  const auto mask = torch::tensor({1, 0, 1}, torch::kInt64);
  if (world->rank() == 0) {
    p2p.send(Packet{{values, mask}, {true, false}, 2}, 1, Flow::kActivation, 3);
    // The same step: the header of the first packet holds, with 2 rows.
    p2p.send(Packet{{values.slice(0, 0, 2) * 2, mask.slice(0, 0, 2)}, {true, false}, 2}, 1,
             Flow::kActivation, 2);
    std::ofstream errors(env_or("RESULT_DIR", ".") + "/errors.txt");
    errors << error_of([&] {
      p2p.send(Packet{{torch::zeros({2, 5}), mask.slice(0, 0, 2)}, {true, false}, 2}, 1,
               Flow::kActivation, 2);
    }) << "\n";
    errors << error_of([&] { p2p.send(torch::zeros({4, 4}), 1, Flow::kGradient, 3); }) << "\n";
    p2p.wait_for_sends();
    // Results gather on rank 0 in any shape and dtype, as tensors of its own.
    const at::Tensor own = torch::ones({2});
    const at::Tensor gathered = world->gather_to_zero(at::Tensor(), 1);
    const at::Tensor kept = world->gather_to_zero(own, 0);
    save_result(
        {gathered, kept, torch::tensor({static_cast<int64_t>(kept.data_ptr() == own.data_ptr())})},
        "gathered.pt");
  } else {
    auto first = p2p.recv(0, Flow::kActivation, 3);
    auto second = p2p.recv(0, Flow::kActivation, 2);
    p2p.wait_for_sends();
    EXPECT_FALSE(world->gather_to_zero(torch::full({7, 2}, 3, torch::kInt32), 1).defined());
    EXPECT_FALSE(world->gather_to_zero(torch::ones({2}), 0).defined());
    save_result({first.tensors[0].detach(), first.tensors[1], second.tensors[0].detach(),
                 second.tensors[1], torch::tensor({first.label, second.label}),
                 torch::tensor({static_cast<int64_t>(first.requires_grad[0]),
                                static_cast<int64_t>(first.requires_grad[1]),
                                static_cast<int64_t>(first.tensors[0].requires_grad())})},
                "received.pt");
  }
}

TEST(PeerToPeer, PacketsCarryTheirTensorsShapesAndFlagsAndRefuseChangesMidStep) {
  const auto dir = make_temp_dir("p2p");
  ASSERT_EQ(run_ranks(2, "p2p_worker", {{"RESULT_DIR", dir}}), 0);
  const auto received = load_result(dir, "received.pt");
  const auto values = torch::arange(12, torch::kFloat).reshape({3, 4});
  EXPECT_TRUE(torch::equal(received[0], values));
  EXPECT_EQ(received[1].scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(received[1], torch::tensor({1, 0, 1}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(received[2], values.slice(0, 0, 2) * 2));
  EXPECT_EQ(received[3].sizes(), (std::vector<int64_t>{2}));
  EXPECT_TRUE(torch::equal(received[4], torch::tensor({2, 2})));
  EXPECT_TRUE(torch::equal(received[5], torch::tensor({1, 0, 1})));
  const auto gathered = load_result(dir, "gathered.pt");
  EXPECT_TRUE(torch::equal(gathered[0], torch::full({7, 2}, 3, torch::kInt32)));
  EXPECT_TRUE(torch::equal(gathered[1], torch::ones({2})));
  EXPECT_EQ(gathered[2].item<int64_t>(), 0) << "rank 0's own result must be a copy";

  std::ifstream in(dir + "/errors.txt");
  std::string shape_change, not_batch_first;
  std::getline(in, shape_change);
  std::getline(in, not_batch_first);
  EXPECT_NE(
      shape_change.find("activations ([2, 5] Float, [2] Long) after ([3, 4] Float, [3] Long)"),
      std::string::npos)
      << shape_change;
  EXPECT_NE(not_batch_first.find("gradients of shapes [4, 4] for a micro-batch of 3 rows"),
            std::string::npos)
      << not_batch_first;
  EXPECT_NE(not_batch_first.find("batch-first"), std::string::npos) << not_batch_first;
}

PIPETRAIN_WORKER(posted_worker) {
  auto world = World::connect(*select_cluster_environment());
  PeerToPeer p2p(world);
  const auto rows = [](int64_t n, float value) { return torch::full({n, 3}, value); };
  if (world->rank() == 0) {
    p2p.send(Packet{{rows(3, 1)}, {}, 0}, 1, Flow::kActivation, 3, /*channel=*/0);
    p2p.send(Packet{{rows(2, 2)}, {}, 0}, 1, Flow::kActivation, 2, /*channel=*/0);
    p2p.send(Packet{{rows(2, 3)}, {}, 0}, 1, Flow::kActivation, 2, /*channel=*/1);
    p2p.send(Packet{{rows(1, 4)}, {}, 0}, 1, Flow::kActivation, 1, /*channel=*/0);
    p2p.wait_for_sends();
    return;
  }
  std::ofstream out(env_or("RESULT_DIR", ".") + "/posted.txt");
  // Before a channel's header has come its shape is unknown: nothing is posted.
  out << p2p.post_recv(0, Flow::kActivation, 3, 0) << "\n";
  const auto a = p2p.recv(0, Flow::kActivation, 3, 0);
  out << p2p.post_recv(0, Flow::kActivation, 2, 0) << "\n";
  out << error_of<std::logic_error>([&] { p2p.recv(0, Flow::kActivation, 2, 1); }) << "\n";
  const auto b = p2p.recv(0, Flow::kActivation, 2, 0);
  out << p2p.post_recv(0, Flow::kActivation, 2, 1) << "\n";  // channel 1's header: not yet
  const auto c = p2p.recv(0, Flow::kActivation, 2, 1);
  out << p2p.post_recv(0, Flow::kActivation, 1, 0) << "\n";
  const auto d = p2p.recv(0, Flow::kActivation, 1, 0);
  p2p.wait_for_sends();
  save_result({a.tensors[0], b.tensors[0], c.tensors[0], d.tensors[0]}, "posted.pt");
}

TEST(PeerToPeer, ReceivesPostedAheadGiveThePacketsInOrder) {
  const auto dir = make_temp_dir("p2p-posted");
  ASSERT_EQ(run_ranks(2, "posted_worker", {{"RESULT_DIR", dir}}), 0);
  const auto received = load_result(dir, "posted.pt");
  ASSERT_EQ(received.size(), 4u);
  const std::vector<std::pair<int64_t, float>> sent{{3, 1}, {2, 2}, {2, 3}, {1, 4}};
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_TRUE(torch::equal(received[i], torch::full({sent[i].first, 3}, sent[i].second)))
        << "packet " << i << ": " << received[i];
  }
  std::ifstream in(dir + "/posted.txt");
  std::string before_header, posted, out_of_order, other_channel, posted_again;
  std::getline(in, before_header);
  std::getline(in, posted);
  std::getline(in, out_of_order);
  std::getline(in, other_channel);
  std::getline(in, posted_again);
  EXPECT_EQ(before_header, "0");
  EXPECT_EQ(posted, "1");
  EXPECT_NE(
      out_of_order.find(
          "on channel 1 (2 rows) came while one on channel 0 (2 rows) was posted ahead of it"),
      std::string::npos)
      << out_of_order;
  EXPECT_EQ(other_channel, "0");
  EXPECT_EQ(posted_again, "1");
}

}  // namespace
}  // namespace pipetrain::testing::p2p_test
