// Token files of both layouts against an independent reading in Python (struct only), and every
// malformed file refused with its path and what is wrong.
#include "pipetrain/token_dataset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/command.h"
#include "support/errors.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::token_dataset_test {
namespace {

namespace fs = std::filesystem;

const std::string kScript = std::string(PIPETRAIN_SOURCE_DIR) + "/tests/io/token_windows.py";

class TokenFiles : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return dir + "/" + name; }
  std::string dir = make_temp_dir("token-files");
};

// Python's windows `indices` of `file`, each block + 1 tokens.
std::vector<std::vector<int64_t>> python_windows(const std::string& file, int64_t block,
                                                 const std::vector<int64_t>& indices) {
  std::vector<std::string> argv{"python3", kScript, "read", file, std::to_string(block)};
  for (int64_t index : indices) argv.push_back(std::to_string(index));
  const auto result = run_command(argv);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::vector<int64_t>> windows;
  std::istringstream lines(result.output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream tokens(line);
    windows.emplace_back();
    for (int64_t token; tokens >> token;) windows.back().push_back(token);
  }
  return windows;
}

void expect_windows_match_python(const std::string& file, const TokenDataset& dataset,
                                 const std::vector<int64_t>& indices) {
  const Batch batch = dataset.get_batch(indices, {});
  const auto expected = python_windows(file, dataset.block_size(), indices);
  ASSERT_EQ(expected.size(), indices.size());
  for (size_t row = 0; row < indices.size(); ++row) {
    SCOPED_TRACE("window " + std::to_string(indices[row]));
    const auto window = torch::tensor(expected[row], torch::kInt64);
    ASSERT_EQ(window.numel(), dataset.block_size() + 1);
    EXPECT_TRUE(torch::equal(batch.data[row], window.slice(0, 0, dataset.block_size())));
    EXPECT_TRUE(torch::equal(batch.target[row], window.slice(0, 1)));
  }
}

TEST_F(TokenFiles, BothLayoutsGiveThePythonReadingsWindows) {
  for (const std::string layout : {"nanogpt", "llmc"}) {
    SCOPED_TRACE(layout);
    const std::string file = path(layout + ".bin");
    ASSERT_EQ(run_command({"python3", kScript, "write", file, layout, "1000"}).exit_code, 0);
    const TokenDataset dataset(file, 16, 50257);
    EXPECT_EQ(dataset.num_tokens(), 1000);
    EXPECT_EQ(dataset.size(), 999 / 16);
    EXPECT_EQ(dataset.format(),
              layout == "llmc" ? TokenFileFormat::kLlmc : TokenFileFormat::kNanoGpt);
    expect_windows_match_python(file, dataset, {0, 61, 7, 30, 61});
  }
}

TEST_F(TokenFiles, WrittenFilesReadBackInPython) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(static_cast<uint16_t>((i * 31) % 65535));
  for (const auto format : {TokenFileFormat::kNanoGpt, TokenFileFormat::kLlmc}) {
    const std::string file = path(format == TokenFileFormat::kLlmc ? "w-llmc.bin" : "w.bin");
    write_token_file(file, tokens, format);
    expect_windows_match_python(file, TokenDataset(file, 8, 65536), {0, 36, 12});
  }
}

std::string construction_error(const std::string& file, int64_t block, int64_t vocab) {
  try {
    TokenDataset dataset(file, block, vocab);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

void write_bytes(const std::string& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary) << bytes;
}

std::string llmc_header(int32_t version, int32_t count) {
  std::string header(1024, '\0');
  const int32_t fields[3] = {20240520, version, count};
  std::memcpy(header.data(), fields, sizeof(fields));
  return header;
}

TEST_F(TokenFiles, MalformedFilesAreRefusedWithTheirPathAndFault) {
  struct Case {
    std::string name, bytes, expected;
  };
  const std::vector<Case> cases{
      {"odd.bin", std::string(101, '\1'), "has an odd number of bytes (101)"},
      {"version.bin", llmc_header(2, 10) + std::string(40, '\1'),
       "is an llm.c shard of version 2; only version 1"},
      {"count.bin", llmc_header(1, 50) + std::string(40, '\1'),
       "has a header saying 50 tokens, but 40 bytes follow it (20 uint16 tokens)"},
      {"header.bin", llmc_header(1, 0).substr(0, 100), "shorter (100 bytes) than its 1024-byte"},
      {"short.bin", std::string(16, '\1'), "holds 8 tokens, fewer than one window of block size 8"},
      {"empty.bin", "", "holds 0 tokens"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    write_bytes(path(c.name), c.bytes);
    const std::string message = construction_error(path(c.name), 8, 65536);
    EXPECT_NE(message.find(path(c.name)), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
  const std::string missing = construction_error(path("missing.bin"), 8, 256);
  EXPECT_NE(missing.find("cannot open token file " + path("missing.bin")), std::string::npos)
      << missing;
}

TEST_F(TokenFiles, ATokenOutsideTheVocabularyIsNamedWithItsPosition) {
  std::vector<uint16_t> tokens(100, 3);
  tokens[45] = 300;
  write_token_file(path("bytes.bin"), tokens);
  const TokenDataset dataset(path("bytes.bin"), 10, 256);
  EXPECT_NO_THROW(dataset.get_batch({0, 1, 2, 3}, {}));
  const auto error = error_of<std::invalid_argument>([&] { dataset.get_batch({1, 4}, {}); });
  EXPECT_NE(error.find("holds token id 300 at position 45, not below the vocabulary size 256 "
                       "(--vocab-size)"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace pipetrain::testing::token_dataset_test
