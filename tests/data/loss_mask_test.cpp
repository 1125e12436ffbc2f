// Loss masks beside token files: a target whose mask is 0 is read as kMaskedTarget (the losses'
// ignore index), whichever windows a batch holds and however shards cut the file; a mask that is
// not its file's (another length), a mask given as tokens, unreadable values and shards with and
// without masks mixed are refused, naming the file.
#include "pipetrain/loss_mask.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "pipetrain/token_dataset.h"
#include "pipetrain/token_shards.h"
#include "support/token_shard_files.h"

namespace pipetrain::testing::loss_mask_test {
namespace {

class LossMaskFiles : public TokenShardFiles {
 protected:
  // An llm.c shard of tokens 100, 101, ..., 100 + count - 1; with `mask`, its loss mask beside it.
  std::string shard(const std::string& name, size_t count, std::vector<uint8_t> mask = {}) const {
    TokenShardFiles::shard(name, 100, count);
    if (!mask.empty()) write_loss_mask(loss_mask_path(path(name)), mask);
    return path(name);
  }
  // The message of what `make` throws as std::invalid_argument ("" where it throws nothing).
  template <typename Make>
  static std::string refusal(Make make) {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(LossMaskFiles, TheMaskBesideAShardNamesItsTokensWithBinForMask) {
  EXPECT_EQ(loss_mask_path("data/chat_train_000000.bin"), "data/chat_train_000000.mask");
  EXPECT_EQ(loss_mask_path("train.bin"), "train.mask");
  EXPECT_EQ(loss_mask_path("tokens"), "tokens.mask");
}

TEST_F(LossMaskFiles, TargetsWhoseMaskIsZeroAreTheIgnoreIndex) {
  // 13 tokens, block 4: 3 windows. Mask 1 on tokens 2-5 and 9-12.
  const std::vector<uint8_t> mask{0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1};
  const TokenDataset data(shard("chat_train_000000.bin", 13, mask), 4, 200);
  ASSERT_TRUE(data.masked());
  const Batch batch = data.get_batch({2, 0, 1}, {});
  // Window i holds tokens 4i .. 4i + 4; its targets are tokens 4i + 1 .. 4i + 4.
  const int m = static_cast<int>(kMaskedTarget);  // as the other literals, for torch::tensor
  EXPECT_TRUE(torch::equal(
      batch.data, torch::tensor({{108, 109, 110, 111}, {100, 101, 102, 103}, {104, 105, 106, 107}},
                                torch::kInt64)))
      << batch.data;
  EXPECT_TRUE(torch::equal(
      batch.target,
      torch::tensor({{109, 110, 111, 112}, {m, 102, 103, 104}, {105, m, m, m}}, torch::kInt64)))
      << batch.target;
  // Without a mask every target is a token.
  const TokenDataset plain(shard("plain.bin", 13), 4, 200);
  EXPECT_FALSE(plain.masked());
  EXPECT_EQ(plain.get_batch({0}, {}).target.min().item<int64_t>(), 101);
}

TEST_F(LossMaskFiles, ShardsReadTheirMasksAsTheFileTheyWereCutFrom) {
  const std::vector<uint8_t> mask{1, 0, 1, 1, 0, 0, 1, 0, 1};
  const TokenShards shards(
      {shard("d_train_000000.bin", 9, mask), shard("d_train_000001.bin", 9, mask)}, 4, 200);
  ASSERT_TRUE(shards.masked());
  const Batch batch = shards.get_batch({3, 0}, {false, true});
  const int m = static_cast<int>(kMaskedTarget);  // as the other literals, for torch::tensor
  EXPECT_TRUE(torch::equal(batch.target,
                           torch::tensor({{m, 106, m, 108}, {m, 102, 103, m}}, torch::kInt64)))
      << batch.target;
}

TEST_F(LossMaskFiles, AMaskThatIsNotItsFilesIsRefusedNamingIt) {
  // Another length.
  const auto tokens = shard("short_train_000000.bin", 9, std::vector<uint8_t>(8, 1));
  auto message = refusal([&] { TokenDataset(tokens, 4, 200); });
  EXPECT_NE(message.find(tokens), std::string::npos) << message;
  EXPECT_NE(message.find("holds 9 tokens, and its loss mask " + loss_mask_path(tokens) + " 8"),
            std::string::npos)
      << message;
  // A mask given as the token file.
  const auto given = loss_mask_path(shard("mask_train_000000.bin", 9, std::vector<uint8_t>(9, 1)));
  message = refusal([&] { TokenDataset(given, 4, 200); });
  EXPECT_NE(message.find("is a loss mask"), std::string::npos) << message;
  EXPECT_NE(message.find(path("mask_train_000000.bin")), std::string::npos) << message;
  // A value other than 0 or 1, and a file without the header.
  EXPECT_THROW(write_loss_mask(path("x.mask"), {0, 2}), std::invalid_argument);
  const auto bad = shard("bad.bin", 9);
  std::ofstream(loss_mask_path(bad), std::ios::binary) << std::string(9, '\1');
  message = refusal([&] { TokenDataset(bad, 4, 200); });
  EXPECT_NE(message.find(loss_mask_path(bad)), std::string::npos) << message;
  EXPECT_NE(message.find("does not start with a loss mask's header"), std::string::npos) << message;
}

TEST_F(LossMaskFiles, ShardsWithAndWithoutMasksAreRefusedNamingThem) {
  const auto masked = shard("d_train_000000.bin", 9, std::vector<uint8_t>(9, 1));
  const auto plain = shard("d_train_000001.bin", 9);
  for (const auto& paths : {std::vector<std::string>{masked, plain}, {plain, masked}}) {
    const auto message = refusal([&] { TokenShards(paths, 4, 200); });
    EXPECT_NE(message.find("token file " + masked + " has a loss mask beside it"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("and " + plain + " has none"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pipetrain::testing::loss_mask_test
