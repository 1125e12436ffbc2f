#include "pipetrain/data.h"

#include "pipetrain/torch_dataset.h"
#include "support/errors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace pipetrain::data_test {
namespace {

using testing::error_of;

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

// A dataset of the user's own that only knows get(): the loader stacks its examples.
class Squares : public Dataset {
 public:
  int64_t size() const override { return 10; }
  Example get(int64_t index) const override {
    const auto x = torch::full({2}, static_cast<float>(index));
    return {x, x * x, {{"weight", torch::tensor(static_cast<float>(index) / 10)}}};
  }
};

TEST(Dataset, ExamplesOfAUsersDatasetAreStackedWithTheirExtraFields) {
  DataLoader loader(std::make_shared<Squares>(),
                    DataLoaderOptions().batch_size(4).shuffle(true).seed(5));
  const Batch batch = loader.batch(0, 1);
  ASSERT_EQ(batch.data.sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(torch::equal(batch.target, batch.data * batch.data));
  EXPECT_TRUE(torch::allclose(batch.field("weight"), batch.data.select(1, 0) / 10));
  // The last stage alone reads the target and the extra fields; the first the data alone.
  const Batch first = loader.batch(0, 1, {0, 1, true, false});
  EXPECT_EQ(first.target.sizes(), (std::vector<int64_t>{4, 0}));
  EXPECT_TRUE(first.fields.empty());
  const Batch last = loader.batch(0, 1, {0, 1, false, true});
  EXPECT_EQ(last.data.sizes(), (std::vector<int64_t>{4, 0}));
  EXPECT_TRUE(torch::equal(last.field("weight"), batch.field("weight")));
  const std::string missing = error_of<std::out_of_range>([&] { batch.field("mask"); });
  EXPECT_NE(missing.find("'mask' (its fields: weight)"), std::string::npos) << missing;
}

TEST(Dataset, ExtraFieldsOfATensorDatasetFollowTheirRowsAcrossReplicas) {
  auto x = torch::arange(10, torch::kFloat32).unsqueeze(1);
  DataLoader loader(TensorDataset(x, x * 10, {{"id", torch::arange(10)}}),
                    DataLoaderOptions().batch_size(3).shuffle(true).seed(1));
  for (int64_t replica = 0; replica < 2; ++replica) {
    const Batch batch = loader.batch(2, 1, {replica, 2, true, true});
    EXPECT_TRUE(torch::equal(batch.field("id").to(torch::kFloat32), batch.data.squeeze(1)));
  }
  EXPECT_THROW(TensorDataset(x, x, {{"id", torch::arange(9)}}), std::invalid_argument);
}

class Ragged : public Dataset {
 public:
  int64_t size() const override { return 8; }
  Example get(int64_t index) const override {
    if (index == 2) throw std::runtime_error("corrupt record");
    return {torch::zeros({index == 5 ? 3 : 2}), torch::zeros({1}), {}};
  }
};

// Reading batch `index` of epoch 0, `dataset`'s examples taken in batches of `batch_size`, throws a
// std::runtime_error saying each of `words`.
void expect_batch_refused(std::shared_ptr<const Dataset> dataset, int64_t batch_size, int64_t index,
                          const std::vector<std::string>& words) {
  const DataLoader loader(std::move(dataset), DataLoaderOptions().batch_size(batch_size));
  const std::string message = error_of<std::runtime_error>([&] { loader.batch(0, index); });
  for (const auto& said : words) EXPECT_NE(message.find(said), std::string::npos) << message;
}

TEST(Dataset, ExamplesOfDifferentShapesOrAFailingReadAreNamed) {
  expect_batch_refused(
      std::make_shared<Ragged>(), 4, 1,
      {"examples 4 and 5 of the dataset have data of different shapes, [2] and [3]",
       "batch 1 of epoch 0"});
  expect_batch_refused(std::make_shared<Ragged>(), 2, 1,
                       {"reading example 2 of the dataset failed: corrupt record"});
}

// Examples at odd indices have a target and a 'mask' the others lack.
class OddOnesHaveMore : public Dataset {
 public:
  int64_t size() const override { return 8; }
  Example get(int64_t index) const override {
    if (index % 2 == 0) return {torch::zeros({2}), at::Tensor(), {}};
    return {torch::zeros({2}), torch::ones({1}), {{"mask", torch::ones({2})}}};
  }
};

// A target or field that the batch's first example lacks and a later one has was dropped from
// the batch without a word (the other way round was refused): refused too, naming both examples.
TEST(Dataset, AFieldOrTargetOnlyLaterExamplesHaveIsRefusedNotDropped) {
  expect_batch_refused(std::make_shared<OddOnesHaveMore>(), 4, 0,
                       {"example 1 of the dataset has a target, but example 0 has none"});
  class OddMasks : public OddOnesHaveMore {
    Example get(int64_t index) const override {
      Example example = OddOnesHaveMore::get(index);
      example.target = torch::ones({1});
      return example;
    }
  };
  expect_batch_refused(std::make_shared<OddMasks>(), 4, 0,
                       {"example 1 of the dataset has field 'mask', but example 0 has none"});
}

// A dataset whose get_batch returns the wrong number of rows is caught, not trained on.
class Short : public Dataset {
 public:
  int64_t size() const override { return 8; }
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted&) const override {
    return {torch::zeros({static_cast<int64_t>(indices.size()) - 1, 2}),
            torch::zeros({static_cast<int64_t>(indices.size())})};
  }
};

TEST(Dataset, AGetBatchOfTheWrongRowsIsRefused) {
  expect_batch_refused(std::make_shared<Short>(), 4, 0, {"a data of shape [3, 2]", "needs 4 rows"});
}

// LibTorch's own datasets, as they are: one of Example<>s, then the same with a transform and
// with Stack<> (a batch transform).
class TorchSquares : public torch::data::datasets::Dataset<TorchSquares> {
 public:
  torch::data::Example<> get(size_t index) override {
    const auto x = torch::full({2}, static_cast<float>(index));
    return {x, x * x};
  }
  torch::optional<size_t> size() const override { return 10; }
};

TEST(Dataset, LibTorchDatasetsAreReadAsTheyAre) {
  const auto options = DataLoaderOptions().batch_size(4).shuffle(true).seed(2);
  const DataLoader plain(from_torch_dataset(TorchSquares()), options);
  const DataLoader reference(std::make_shared<Squares>(), options);
  EXPECT_EQ(plain.num_batches(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(plain.batch(1, i).data, reference.batch(1, i).data));
    EXPECT_TRUE(torch::equal(plain.batch(1, i).target, reference.batch(1, i).target));
  }
  auto halve =
      torch::data::transforms::Lambda<torch::data::Example<>>([](torch::data::Example<> e) {
        return torch::data::Example<>{e.data / 2, e.target};
      });
  const DataLoader mapped(from_torch_dataset(TorchSquares().map(halve)), options);
  EXPECT_TRUE(torch::equal(mapped.batch(1, 2).data * 2, reference.batch(1, 2).data));
  const DataLoader stacked(
      from_torch_dataset(TorchSquares().map(torch::data::transforms::Stack<>())), options);
  EXPECT_TRUE(torch::equal(stacked.batch(1, 2).target, reference.batch(1, 2).target));
}

}  // namespace
}  // namespace pipetrain::data_test
