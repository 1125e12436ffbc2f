#include "pipetrain/balance.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::balance_test {
namespace {

TEST(BalanceByCost, MinimisesTheLargestStage) {
  EXPECT_EQ(balance_by_cost({1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(balance_by_cost({4, 1, 1, 1, 1}, 2), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(balance_by_cost({1, 2, 3, 4, 5, 6}, 3), (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(balance_by_cost({5, 5, 5}, 3), (std::vector<int64_t>{1, 1, 1}));
}

TEST(BalanceByCost, KeepsFreeLayersWithTheLayerBeforeThem) {
  // Linear, ReLU, Linear, ReLU: both splits cost the same; fewer layers per stage wins.
  EXPECT_EQ(balance_by_cost({10, 0, 10, 0}, 2), (std::vector<int64_t>{2, 2}));
}

TEST(BalanceByCost, RejectsMoreStagesThanLayers) {
  EXPECT_THROW(balance_by_cost({1, 1}, 3), std::invalid_argument);
  EXPECT_THROW(balance_by_cost({1, 1}, 0), std::invalid_argument);
}

TEST(BalanceBySize, CountsParameterElements) {
  torch::nn::Sequential model(torch::nn::Linear(100, 100), torch::nn::ReLU(),
                              torch::nn::Linear(100, 10), torch::nn::ReLU(),
                              torch::nn::Linear(10, 10));
  // 10100 | 1010 + 110 parameters.
  EXPECT_EQ(balance_by_size(model, 2), (std::vector<int64_t>{2, 3}));
}

TEST(BalanceByTime, GivesTheSlowLayerAStageOfItsOwn) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(1024, 1024), torch::nn::Linear(1024, 1024),
                              torch::nn::Linear(1024, 1024), torch::nn::Linear(1024, 4),
                              torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  // Each wide layer costs ~1000x a narrow one, far beyond timing noise on a busy machine.
  const auto balance = balance_by_time(model, torch::randn({256, 1024}), 3, /*repeats=*/9);
  ASSERT_EQ(balance.size(), 3u);
  EXPECT_EQ(balance[0] + balance[1] + balance[2], 6);
  // The three wide layers dominate: they must not share a stage.
  EXPECT_EQ(balance[0], 1);
  EXPECT_EQ(balance[1], 1);
}

TEST(ValidateBalance, NamesTheValue) {
  try {
    validate_balance({3, 3}, 15);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "balance 3,3 sums to 6 but the model has 15 layers: the entries must add up to "
                 "the number of layers");
  }
  EXPECT_THROW(validate_balance({2, 0, 2}, 4), std::invalid_argument);
  EXPECT_THROW(validate_balance({}, 4), std::invalid_argument);
  EXPECT_NO_THROW(validate_balance({1, 3}, 4));
}

}  // namespace
}  // namespace pipetrain::balance_test
