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

TEST(DataLoader, ReplicasShareAGlobalBatchThatDoesNotDependOnTheirNumber) {
  // 10 rows: global batches of 2 x 3 rows are rows 0-5 and 6-9 (split 2 + 2).
  DataLoader loader(numbers(10), DataLoaderOptions().batch_size(3).shuffle(true).seed(5));
  DataLoader one(numbers(10), DataLoaderOptions().batch_size(6).shuffle(true).seed(5));
  ASSERT_EQ(loader.num_batches(2), 2);
  for (int64_t index = 0; index < 2; ++index) {
    const auto first = loader.batch(1, index, {0, 2, true, true});
    const auto second = loader.batch(1, index, {1, 2, true, true});
    EXPECT_TRUE(torch::equal(torch::cat({first.data, second.data}), one.batch(1, index).data));
    EXPECT_TRUE(torch::equal(second.target, second.data * 10));
  }
  EXPECT_EQ(loader.batch(0, 1, {0, 2, true, true}).data.size(0), 2);
  EXPECT_DOUBLE_EQ(loader.share(0, {0, 2, true, true}), 1.0);
  // 10 rows in global batches of 3 x 3: the last has 1 row, too few for 3 replicas.
  EXPECT_EQ(loader.num_batches(3), 1);
  // 11 rows, 2 x 4: the last global batch has 3 rows, split 2 + 1.
  DataLoader uneven(numbers(11), DataLoaderOptions().batch_size(4));
  EXPECT_DOUBLE_EQ(uneven.share(1, {0, 2, true, true}), 2.0 * 2 / 3);
  EXPECT_DOUBLE_EQ(uneven.share(1, {1, 2, true, true}), 1.0 * 2 / 3);
}

TEST(DataLoader, StagesThatDoNotReadInputsOrTargetsGetOnlyTheRowCount) {
  DataLoader loader(numbers(10), DataLoaderOptions().batch_size(4));
  const auto batch = loader.batch(0, 2, {0, 1, false, true});
  EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(torch::equal(batch.target.squeeze(1), torch::tensor({80.0f, 90.0f})));
}

}  // namespace
}  // namespace pipetrain
