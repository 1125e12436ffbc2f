// GradientSync between two real processes: gradients become the replicas' average, reductions
// start from inside backward (not after it), a parameter nobody used keeps no gradient, and
// parameters of different groups never share a bucket.
#include "distributed/gradient_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/world.h"
#include "support/multiprocess.h"

namespace pipetrain::gradient_sync_test {
namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(4, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 2));
}

at::Tensor data_of(int64_t rank) {
  torch::manual_seed(100 + rank);
  return torch::randn({8, 4});
}

// The gradients one process gets from the mean loss over both ranks' data.
std::vector<at::Tensor> reference_gradients() {
  auto model = make_model();
  auto loss =
      (model->forward(data_of(0)).pow(2).mean() + model->forward(data_of(1)).pow(2).mean()) / 2;
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad());
  return grads;
}

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

// Runs the checks with parameters in `group_count` groups (round robin, as ZeRO's owners come).
void check_sync(const std::shared_ptr<World>& world, int64_t group_count) {
  auto model = make_model();
  auto unused = torch::zeros({3}, torch::requires_grad());
  // First in order, so last to be reduced: its bucket is the only one backward cannot complete.
  std::vector<at::Tensor> parameters{unused};
  for (const auto& p : model->parameters()) parameters.push_back(p);
  std::vector<int64_t> groups;
  for (size_t i = 0; i < parameters.size(); ++i) {
    groups.push_back(static_cast<int64_t>(i) % group_count);
  }
  // The 64 x 64 weight alone is 16 KiB: 8 KiB buckets make several.
  GradientSync sync(parameters, world, groups, /*bucket_bytes=*/8 << 10);
  require(sync.num_buckets() >= 3, "expected several buckets");
  for (const auto& bucket : sync.buckets()) {
    for (int64_t i : bucket) {
      require(groups[i] == groups[bucket.front()], "a bucket mixes groups");
    }
  }

  // Two backward passes accumulate; only the armed one reduces.
  model->forward(data_of(world->rank())).pow(2).mean().mul(0.5).backward();
  require(sync.started_buckets() == 0, "an unarmed backward started reductions");
  sync.arm();
  model->forward(data_of(world->rank())).pow(2).mean().mul(0.5).backward();
  require(sync.started_buckets() == sync.num_buckets() - 1,
          "backward should have started every bucket but the unused parameter's, started " +
              std::to_string(sync.started_buckets()) + " of " + std::to_string(sync.num_buckets()));
  sync.finish();

  const auto expected = reference_gradients();
  const auto actual = model->parameters();
  for (size_t i = 0; i < expected.size(); ++i) {
    require(torch::allclose(actual[i].grad(), expected[i], 1e-6, 1e-7),
            "gradient " + std::to_string(i) + " is not the replicas' average");
  }
  require(!unused.grad().defined(), "an unused parameter got a gradient");
}

PIPETRAIN_WORKER(gradient_sync_worker) {
  auto world = World::connect(*select_cluster_environment());
  check_sync(world, 1);
  check_sync(world, 2);
}

TEST(GradientSync, AveragesOverReplicasStartingDuringBackward) {
  EXPECT_EQ(testing::run_ranks(2, "gradient_sync_worker"), 0);
}

}  // namespace
}  // namespace pipetrain::gradient_sync_test
