// Token files of both layouts against an independent reading in Python (struct only), 32-bit
// tokens against bytes laid out here as llm.c's data_common.py writes them, and every malformed
// file refused with its path and what is wrong.
#include "pipetrain/token_dataset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "support/command.h"
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

std::string construction_error(const std::string& file, int64_t block, int64_t vocab,
                               std::optional<TokenDtype> dtype = std::nullopt) {
  try {
    TokenDataset dataset(file, block, vocab, dtype);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

void write_bytes(const std::string& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary) << bytes;
}

std::string llmc_header(int32_t version, int32_t count, int32_t magic = 20240520) {
  std::string header(1024, '\0');
  const int32_t fields[3] = {magic, version, count};
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
       "is an llm.c shard of version 2 (magic 20240520), which llm.c does not write: llm.c writes "
       "version 1 (GPT-2, uint16 tokens) under magic 20240520 and version 7 (Llama 3, uint32 "
       "tokens) under magic 20240801"},
      {"version-llama.bin", llmc_header(1, 10, 20240801) + std::string(40, '\1'),
       "is an llm.c shard of version 1 (magic 20240801), which llm.c does not write"},
      {"count.bin", llmc_header(1, 50) + std::string(40, '\1'),
       "has a header saying 50 tokens, but 40 bytes follow it (20 uint16 tokens)"},
      {"count-llama.bin", llmc_header(7, 50, 20240801) + std::string(42, '\1'),
       "has a header saying 50 tokens, but 42 bytes follow it (10 uint32 tokens and 2 bytes more)"},
      {"header.bin", llmc_header(1, 0).substr(0, 100), "shorter (100 bytes) than its 1024-byte"},
      {"header-llama.bin", llmc_header(7, 0, 20240801).substr(0, 8),
       "starts with llm.c's magic 20240801 but is shorter (8 bytes)"},
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

// Little-endian uint32 `tokens`, after llm.c's Llama 3 header (magic 20240801, version 7, the
// count) where `header`: the bytes llm.c's write_datafile(..., model_desc="llama-3") writes.
std::string uint32_bytes(const std::vector<uint32_t>& tokens, bool header) {
  std::string bytes = header ? llmc_header(7, static_cast<int32_t>(tokens.size()), 20240801) : "";
  for (uint32_t token : tokens) {
    for (int shift = 0; shift < 32; shift += 8) bytes += static_cast<char>((token >> shift) & 0xff);
  }
  return bytes;
}

std::string file_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Ids of a Llama 3 vocabulary (128256), most of them above what uint16 holds.
std::vector<uint32_t> wide_tokens(int count) {
  std::vector<uint32_t> tokens;
  for (int i = 0; i < count; ++i) tokens.push_back(static_cast<uint32_t>((i * 70001) % 128256));
  return tokens;
}

TEST_F(TokenFiles, ThirtyTwoBitTokensReadBackFromARawFileAndALlama3Shard) {
  const auto tokens = wide_tokens(300);
  for (const bool header : {false, true}) {
    SCOPED_TRACE(header ? "llm.c Llama 3 shard" : "raw uint32");
    const std::string file = path(header ? "llama3.bin" : "raw32.bin");
    write_bytes(file, uint32_bytes(tokens, header));
    // The shard's header says its width; a raw file's is told.
    const TokenDataset dataset =
        header ? TokenDataset(file, 8, 128256) : TokenDataset(file, 8, 128256, TokenDtype::kUint32);
    EXPECT_EQ(dataset.dtype(), TokenDtype::kUint32);
    EXPECT_EQ(dataset.format(), header ? TokenFileFormat::kLlmc : TokenFileFormat::kNanoGpt);
    EXPECT_EQ(dataset.num_tokens(), 300);
    EXPECT_EQ(dataset.size(), 299 / 8);
    const std::vector<int64_t> indices{0, 36, 12};
    const Batch batch = dataset.get_batch(indices, {});
    for (size_t row = 0; row < indices.size(); ++row) {
      for (int64_t t = 0; t < 8; ++t) {
        const size_t at = static_cast<size_t>(indices[row] * 8 + t);
        EXPECT_EQ(batch.data[row][t].item<int64_t>(), tokens[at]);
        EXPECT_EQ(batch.target[row][t].item<int64_t>(), tokens[at + 1]);
      }
    }
    EXPECT_GT(batch.data.max().item<int64_t>(), 65535);
    // The writer lays out the same bytes.
    const std::string written = path(header ? "written-llama3.bin" : "written-raw32.bin");
    write_token_file(written, tokens, header ? TokenFileFormat::kLlmc : TokenFileFormat::kNanoGpt);
    EXPECT_EQ(file_bytes(written), file_bytes(file));
  }
}

TEST_F(TokenFiles, AWidthThatDisagreesWithTheFileIsRefused) {
  write_bytes(path("llama3.bin"), uint32_bytes(wide_tokens(20), true));
  const std::string narrow = construction_error(path("llama3.bin"), 8, 128256);
  EXPECT_EQ(narrow, "") << narrow;
  const std::string asked = construction_error(path("llama3.bin"), 8, 128256, TokenDtype::kUint16);
  EXPECT_NE(asked.find("token file " + path("llama3.bin") +
                       " is an llm.c shard of uint32 tokens (magic 20240801, version 7), not "
                       "uint16 ones as asked"),
            std::string::npos)
      << asked;
  write_bytes(path("odd32.bin"), std::string(42, '\1'));
  const std::string odd = construction_error(path("odd32.bin"), 8, 128256, TokenDtype::kUint32);
  EXPECT_NE(odd.find("has 42 bytes, not a multiple of 4, so it is not uint32 tokens"),
            std::string::npos)
      << odd;
}

// A raw file of 32-bit ids below 65536, opened without its width, would read as 16-bit ids of which
// every second is 0, all within a small vocabulary: training on them would be silently wrong, so
// it is refused; told its width it reads, and real 16-bit tokens are not mistaken for it.
TEST_F(TokenFiles, ThirtyTwoBitTokensOpenedAsSixteenBitOnesAreRefused) {
  std::vector<uint32_t> small(300);
  std::vector<uint16_t> narrow(300);
  for (size_t i = 0; i < small.size(); ++i) {
    small[i] = static_cast<uint32_t>(1 + (i * 7) % 250);
    narrow[i] = static_cast<uint16_t>(small[i]);
  }
  write_bytes(path("raw32.bin"), uint32_bytes(small, false));
  const std::string refused = construction_error(path("raw32.bin"), 8, 256);
  EXPECT_NE(refused.find("looks like 32-bit tokens (every second 16-bit value of its first 600 is "
                         "0"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("TokenDtype::kUint32"), std::string::npos) << refused;
  EXPECT_EQ(TokenDataset(path("raw32.bin"), 8, 256, TokenDtype::kUint32).num_tokens(), 300);
  EXPECT_EQ(TokenDataset(path("raw32.bin"), 8, 256, TokenDtype::kUint16).num_tokens(), 600);
  write_token_file(path("raw16.bin"), narrow, TokenFileFormat::kNanoGpt);
  EXPECT_EQ(construction_error(path("raw16.bin"), 8, 256), "");
}

// Every id is checked when the file is opened, not when its window is read: a run too short to
// reach a bad window (or a shuffle that reaches it late) would end without noticing it.
TEST_F(TokenFiles, ATokenOutsideTheVocabularyIsRefusedWhenTheFileIsOpened) {
  std::vector<uint16_t> tokens(100, 3);
  tokens[95] = 300;
  write_token_file(path("bytes.bin"), tokens);
  const std::string error = construction_error(path("bytes.bin"), 10, 256);
  EXPECT_NE(error.find("token file " + path("bytes.bin") +
                       " holds token id 300 at position 95, not below the vocabulary size 256 "
                       "(--vocab-size)"),
            std::string::npos)
      << error;
  // The last token, a target alone, is checked as well.
  tokens[95] = 3;
  tokens[99] = 256;
  write_token_file(path("last.bin"), tokens, TokenFileFormat::kLlmc);
  EXPECT_NE(construction_error(path("last.bin"), 10, 256).find("holds token id 256 at position 99"),
            std::string::npos);
  EXPECT_EQ(construction_error(path("last.bin"), 10, 257), "");
}

TEST_F(TokenFiles, AThirtyTwoBitTokenOutsideTheVocabularyIsRefusedWhenTheFileIsOpened) {
  std::vector<uint32_t> tokens(100, 70000);
  tokens[45] = 128256;
  write_token_file(path("wide.bin"), tokens, TokenFileFormat::kLlmc);
  EXPECT_NE(construction_error(path("wide.bin"), 10, 128256)
                .find("token file " + path("wide.bin") +
                      " holds token id 128256 at position 45, not below the vocabulary size "
                      "128256 (--vocab-size)"),
            std::string::npos);
  // A uint16 vocabulary's model on these tokens stops at the first.
  const std::string first = construction_error(path("wide.bin"), 10, 65536);
  EXPECT_NE(first.find("holds token id 70000 at position 0"), std::string::npos) << first;
}

// The file is read in slices: an id past the first slice (16M tokens) is found at its position.
TEST_F(TokenFiles, ATokenOutsideTheVocabularyPastTheFirstSliceIsFound) {
  constexpr int64_t kSlice = int64_t{1} << 24;
  std::vector<uint16_t> tokens(static_cast<size_t>(kSlice + 1000), 7);
  tokens[static_cast<size_t>(kSlice + 5)] = 50257;
  write_token_file(path("long.bin"), tokens);
  const std::string error = construction_error(path("long.bin"), 64, 50257);
  EXPECT_NE(error.find("holds token id 50257 at position " + std::to_string(kSlice + 5)),
            std::string::npos)
      << error;
  EXPECT_EQ(construction_error(path("long.bin"), 64, 50258), "");
}

// llm.c's header under another magic (a writer's typo, another tool's version) would read as raw
// tokens, header included: a uint16 shard would train on the magic's halves and the zeros, and a
// uint32 one on each id followed by 0. Its layout gives it away, and it is refused.
TEST_F(TokenFiles, AnLlmcHeaderUnderAnotherMagicIsRefused) {
  std::vector<uint16_t> narrow(300, 5);
  write_token_file(path("gpt2.bin"), narrow, TokenFileFormat::kLlmc);
  std::string bytes = file_bytes(path("gpt2.bin"));
  const int32_t typo = 20240521;
  std::memcpy(bytes.data(), &typo, sizeof(typo));
  write_bytes(path("gpt2-typo.bin"), bytes);
  const std::string gpt2 = construction_error(path("gpt2-typo.bin"), 8, 65536);
  EXPECT_NE(gpt2.find("token file " + path("gpt2-typo.bin") +
                      " starts with what is laid out as llm.c's 1024-byte header (a count of 300 "
                      "tokens, the bytes that follow it, and zeros) but with magic 20240521 and "
                      "version 1, which llm.c does not write"),
            std::string::npos)
      << gpt2;
  // A Llama 3 shard whose magic was lost, opened as uint32 tokens as it would have to be.
  std::string wide = uint32_bytes(wide_tokens(300), true);
  std::memset(wide.data(), 0, sizeof(int32_t));
  write_bytes(path("llama3-zeroed.bin"), wide);
  const std::string llama =
      construction_error(path("llama3-zeroed.bin"), 8, 128256, TokenDtype::kUint32);
  EXPECT_NE(llama.find("but with magic 0 and version 7, which llm.c does not write"),
            std::string::npos)
      << llama;
  // Raw tokens that start with zeros are not taken for a header: their count field is 0 too.
  write_token_file(path("zeros.bin"), std::vector<uint16_t>(2000, 0));
  EXPECT_EQ(construction_error(path("zeros.bin"), 8, 256), "");
}

}  // namespace
}  // namespace pipetrain::testing::token_dataset_test
