// One reader of sizes in bytes for every flag that takes one (--max-memory, --device-memory,
// --link-bandwidth, export's --max-shard-size): the spellings transformers' max_shard_size and
// Slurm's --mem take, and a refusal naming the flag and its text.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "models/byte_size.h"

namespace pipetrain::testing::byte_size_test {
namespace {

using cli::parse_byte_size;

// parse_byte_size's refusal of `text` contains each of `parts`.
void expect_refused(const std::string& flag, const std::string& text, int64_t minimum,
                    const std::vector<std::string>& parts) {
  try {
    parse_byte_size(flag, text, minimum);
    ADD_FAILURE() << flag << " " << text << " was accepted";
  } catch (const std::invalid_argument& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ByteSize, ReadsTransformersAndSlurmSpellings) {
  EXPECT_EQ(parse_byte_size("--max-shard-size", "5GB"), 5'000'000'000);
  EXPECT_EQ(parse_byte_size("--max-shard-size", "500MB"), 500'000'000);
  EXPECT_EQ(parse_byte_size("--max-shard-size", "100kb"), 100'000);
  EXPECT_EQ(parse_byte_size("--max-memory", "2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("--max-memory", "512 MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("--max-shard-size", "1.5GB"), 1'500'000'000);
  EXPECT_EQ(parse_byte_size("--max-shard-size", "1000000"), 1'000'000);
  EXPECT_EQ(parse_byte_size("--max-memory", "0"), 0);
}

TEST(ByteSize, RefusesNamingTheFlagAndText) {
  for (const char* bad : {"", "GB", "5XB", "-1GB", "1.2.3GB", "5 GBs", "nan"}) {
    expect_refused("--max-shard-size", bad, 1,
                   {"--max-shard-size " + std::string(bad) + ":", "5GB"});
  }
  // Below the flag's least: a shard of 0 bytes holds nothing.
  expect_refused("--max-shard-size", "0", 1, {"--max-shard-size 0", "at least 1"});
  for (const char* huge : {"1e19", "inf", "10000000TB"}) {
    expect_refused("--max-memory", huge, 0,
                   {"--max-memory " + std::string(huge), "more bytes than any machine holds"});
  }
}

}  // namespace
}  // namespace pipetrain::testing::byte_size_test
