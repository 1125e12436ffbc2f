// Token files read as one dataset: a file's tokens cut into shards that overlap by one token give
// that file's windows, index for index; no window crosses from one shard into the next; one
// file's windows are its TokenDataset's; folders and globs name their files in sorted order.
#include "pipetrain/token_shards.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "support/token_shard_files.h"

namespace pipetrain::testing::token_shards_test {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> all_windows(const Dataset& data) {
  std::vector<int64_t> indices(static_cast<size_t>(data.size()));
  std::iota(indices.begin(), indices.end(), 0);
  return indices;
}

void expect_same_batch(const Batch& actual, const Batch& expected) {
  EXPECT_TRUE(torch::equal(actual.data, expected.data)) << actual.data << expected.data;
  EXPECT_TRUE(torch::equal(actual.target, expected.target)) << actual.target << expected.target;
}

TEST_F(TokenShardFiles, ShardsOverlappingByATokenGiveTheWholeFilesWindows) {
  // 41 tokens, block 4: 10 windows, window i from token 4i. Shards of 3 windows' tokens, each
  // starting at the last token of the one before, hold the same windows.
  const int64_t block = 4;
  const auto whole = shard("whole.bin", 0, 41);
  const std::vector<std::string> parts{
      shard("d_train_000000.bin", 0, 13), shard("d_train_000001.bin", 12, 13),
      shard("d_train_000002.bin", 24, 13), shard("d_train_000003.bin", 36, 5)};
  const TokenDataset file(whole, block, 100);
  const TokenShards shards(parts, block, 100);
  ASSERT_EQ(shards.size(), file.size());
  EXPECT_EQ(shards.num_tokens(), 44);
  EXPECT_EQ(shards.dtype(), TokenDtype::kUint16);
  // Every window, in a shuffled order crossing shards, and each shard's alone.
  const std::vector<int64_t> shuffled{7, 0, 9, 3, 4, 8, 1, 6, 2, 5};
  expect_same_batch(shards.get_batch(shuffled, {}), file.get_batch(shuffled, {}));
  expect_same_batch(shards.get_batch({4, 5}, {}), file.get_batch({4, 5}, {}));
  // A process that reads only the targets (a pipeline's last stage) gets only those.
  const Batch targets = shards.get_batch(shuffled, {false, true});
  EXPECT_FALSE(targets.data.defined());
  EXPECT_TRUE(torch::equal(targets.target, file.get_batch(shuffled, {}).target));
  EXPECT_THROW(shards.get_batch({10}, {}), std::out_of_range);
}

TEST_F(TokenShardFiles, NoWindowCrossesIntoTheNextShard) {
  // 11 tokens a shard, block 4: 2 windows each (from its tokens 0 and 4; 9 and 10 are left), so
  // the third window is the second shard's first.
  const TokenShards shards({shard("a.bin", 0, 11), shard("b.bin", 100, 11)}, 4, 200);
  ASSERT_EQ(shards.size(), 4);
  const Batch batch = shards.get_batch({1, 2}, {});
  EXPECT_TRUE(
      torch::equal(batch.data, torch::tensor({{4, 5, 6, 7}, {100, 101, 102, 103}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(batch.target,
                           torch::tensor({{5, 6, 7, 8}, {101, 102, 103, 104}}, torch::kInt64)));
}

TEST_F(TokenShardFiles, OneFileGivesItsTokenDatasetsWindows) {
  const auto file = shard("one.bin", 7, 50);
  const TokenDataset alone(file, 8, 100);
  const TokenShards shards({file}, 8, 100);
  ASSERT_EQ(shards.size(), alone.size());
  expect_same_batch(shards.get_batch(all_windows(alone), {}),
                    alone.get_batch(all_windows(alone), {}));
}

TEST_F(TokenShardFiles, EveryFileIsCheckedAndTheyShareOneWidth) {
  const auto narrow = shard("a.bin", 0, 20);
  const auto out_of_vocabulary = shard("b.bin", 90, 20);
  try {
    TokenShards({narrow, out_of_vocabulary}, 4, 100);
    ADD_FAILURE() << "a token outside the vocabulary in the second file passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("token file " + out_of_vocabulary +
                                         " holds token id 100 at position 10"),
              std::string::npos)
        << e.what();
  }
  std::vector<uint32_t> wide(20, 1);
  write_token_file(path("wide.bin"), wide, TokenFileFormat::kLlmc);
  try {
    TokenShards({narrow, path("wide.bin")}, 4, 100);
    ADD_FAILURE() << "files of two widths passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(path("wide.bin") + " holds 32-bit tokens and " + narrow +
                                         " 16-bit ones"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TokenShardFiles, FoldersAndPatternsNameTheirFilesInSortedOrder) {
  // Written out of order; a val shard and a file of another name beside them.
  for (const auto* name : {"x_train_000002.bin", "x_train_000000.bin", "x_train_000001.bin",
                           "x_val_000000.bin", "notes.txt"}) {
    shard(name, 0, 20);
  }
  const std::vector<std::string> train{path("x_train_000000.bin"), path("x_train_000001.bin"),
                                       path("x_train_000002.bin")};
  EXPECT_EQ(find_token_files(dir, "train"), train);
  EXPECT_EQ(find_token_files(dir, "val"), std::vector<std::string>{path("x_val_000000.bin")});
  EXPECT_EQ(find_token_files(dir + "/x_train_*.bin", "train"), train);
  EXPECT_EQ(find_token_files(dir + "/x_*_00000[0].bin", "val"),
            (std::vector<std::string>{path("x_train_000000.bin"), path("x_val_000000.bin")}));
  // A file is itself, whatever its name.
  EXPECT_EQ(find_token_files(path("notes.txt"), "train"),
            std::vector<std::string>{path("notes.txt")});

  // nanoGPT's layout: train.bin and val.bin in the folder.
  fs::create_directories(path("nano"));
  shard("nano/train.bin", 0, 20);
  EXPECT_EQ(find_token_files(path("nano"), "train"),
            std::vector<std::string>{path("nano/train.bin")});
  try {
    find_token_files(path("nano"), "val");
    ADD_FAILURE() << "a folder without val files passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "token folder " + path("nano") +
                                         " holds no val shards (*_val_*.bin, as prepare-data "
                                         "--tokenizer and llm.c name them) and no val.bin");
  }
  try {
    find_token_files(dir + "/y_train_*.bin", "train");
    ADD_FAILURE() << "a pattern matching nothing passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/y_train_*.bin: no file matches the pattern"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::testing::token_shards_test
