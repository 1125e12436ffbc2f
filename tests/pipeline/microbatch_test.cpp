#include "pipeline/microbatch.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace pipetrain::microbatch_test {
namespace {

std::vector<int64_t> sizes(const std::vector<MicroBatch>& microbatches) {
  std::vector<int64_t> out;
  for (const auto& mb : microbatches) out.push_back(mb.size());
  return out;
}

TEST(SplitMicrobatches, AlwaysGivesExactlyChunksPiecesCoveringTheBatch) {
  EXPECT_EQ(sizes(split_microbatches(8, 4)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(sizes(split_microbatches(13, 3)), (std::vector<int64_t>{5, 4, 4}));
  EXPECT_EQ(sizes(split_microbatches(13, 8)), (std::vector<int64_t>{2, 2, 2, 2, 2, 1, 1, 1}));
  const auto mbs = split_microbatches(13, 8);
  int64_t next = 0;
  for (size_t i = 0; i < mbs.size(); ++i) {
    EXPECT_EQ(mbs[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(mbs[i].begin, next);
    next = mbs[i].end;
  }
  EXPECT_EQ(next, 13);
}

TEST(SplitMicrobatches, RejectsChunksLargerThanTheBatch) {
  try {
    split_microbatches(4, 8);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("chunks (8) is larger than the batch size (4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(split_microbatches(4, 0), std::invalid_argument);
}

}  // namespace
}  // namespace pipetrain::microbatch_test
