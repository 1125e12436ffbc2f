#include "pipetrain/data.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain {
namespace {

TensorDataset numbers(int64_t n) {
  auto x = torch::arange(n, torch::kFloat32).unsqueeze(1);
  return {x, x * 10};
}

TEST(DataLoader, CoversEveryRowOncePerEpochInASeededOrder) {
  DataLoader loader(numbers(10), DataLoaderOptions().batch_size(4).shuffle(true).seed(3));
  ASSERT_EQ(loader.num_batches(), 3);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < 3; ++i) {
    const auto batch = loader.batch(0, i);
    EXPECT_TRUE(torch::equal(batch.target, batch.data * 10));
    rows.push_back(batch.data);
  }
  const auto epoch0 = torch::cat(rows).squeeze(1);
  EXPECT_TRUE(torch::equal(std::get<0>(epoch0.sort()), torch::arange(10, torch::kFloat32)));
  EXPECT_FALSE(torch::equal(epoch0, torch::arange(10, torch::kFloat32)));

  DataLoader same(numbers(10), DataLoaderOptions().batch_size(4).shuffle(true).seed(3));
  EXPECT_TRUE(torch::equal(same.batch(0, 1).data, loader.batch(0, 1).data));
  EXPECT_FALSE(torch::equal(loader.batch(1, 0).data, loader.batch(0, 0).data));
}

TEST(DataLoader, DropLastAndValidation) {
  DataLoader loader(numbers(10), DataLoaderOptions().batch_size(4).drop_last(true));
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_TRUE(
      torch::equal(loader.batch(0, 1).data.squeeze(1), torch::arange(4, 8, torch::kFloat32)));
  EXPECT_THROW(DataLoader(numbers(10), DataLoaderOptions().batch_size(0)), std::invalid_argument);
  EXPECT_THROW(DataLoader({torch::zeros({3, 1}), torch::zeros({2})}, DataLoaderOptions()),
               std::invalid_argument);
}

}  // namespace
}  // namespace pipetrain
