// safetensors files must round-trip every dtype and layout, match the reference writer byte for
// byte, agree with an independent reader (tests/io/read_safetensors.py, plain Python), and refuse
// every kind of damaged file with a message that names the file and the problem.
#include "pipetrain/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/multiprocess.h"

namespace pipetrain::safetensors_test {
namespace {

namespace fs = std::filesystem;

const std::string kScript = std::string(PIPETRAIN_SOURCE_DIR) + "/tests/io/read_safetensors.py";

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("safetensors"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}

// A file with `header` (padded to 8 bytes) and `data` as its byte buffer.
std::string make_file(std::string header, const std::string& data) {
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return le64(header.size()) + header + data;
}

// Runs a command and returns what it printed; fails the test on a non-zero exit.
std::string run(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for " << command;
    return "";
  }
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << command << " printed:\n" << output;
  return output;
}

// The error load_safetensors(path) throws, or "" when it succeeds.
std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_LOAD_ERROR(path, phrase)                                                          \
  do {                                                                                           \
    const std::string message = load_error(path);                                                \
    EXPECT_NE(message.find(path), std::string::npos) << message;                                 \
    EXPECT_NE(message.find(phrase), std::string::npos)                                           \
        << "expected \"" << (phrase) << "\" in: " << (message.empty() ? "(no error)" : message); \
  } while (0)

// One tensor of every dtype, and the shapes that are easy to get wrong.
TensorMap every_dtype() {
  torch::manual_seed(0);
  TensorMap tensors;
  tensors["f64"] = torch::randn({3, 2}, torch::kFloat64);
  tensors["f32"] = torch::randn({4, 5});
  tensors["f16"] = torch::randn({7}).to(torch::kFloat16);
  tensors["bf16"] = torch::randn({2, 3, 2}).to(torch::kBFloat16);
  tensors["i64"] = torch::randint(-1000000, 1000000, {5}, torch::kInt64);
  tensors["i32"] = torch::randint(-100000, 100000, {2, 2}, torch::kInt32);
  tensors["i16"] = torch::randint(-30000, 30000, {3}, torch::kInt16);
  tensors["i8"] = torch::randint(-128, 128, {9}, torch::kInt8);
  tensors["u8"] = torch::randint(0, 256, {3, 1}, torch::kUInt8);
  tensors["bool"] = torch::rand({6}) > 0.5;
  tensors["scalar"] = torch::tensor(3.5, torch::kFloat64);            // 0-d
  tensors["scalar_int"] = torch::tensor(int64_t{-9}, torch::kInt64);  // 0-d
  tensors["empty"] = torch::zeros({0, 3});
  tensors["empty_i8"] = torch::zeros({4, 0, 2}, torch::kInt8);
  tensors["transposed"] = torch::arange(12, torch::kFloat32).reshape({3, 4}).t();
  tensors["strided"] = torch::arange(20, torch::kInt32).reshape({4, 5}).slice(1, 1, 4, 2);
  return tensors;
}

TEST_F(Safetensors, RoundTripsEveryDtypeShapeAndLayout) {
  const auto tensors = every_dtype();
  ASSERT_FALSE(tensors.at("transposed").is_contiguous());
  ASSERT_FALSE(tensors.at("strided").is_contiguous());
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"epoch", "3"}, {"ü", "ß"}};
  save_safetensors(file("all.safetensors"), tensors, metadata);

  std::map<std::string, std::string> loaded_metadata{{"stale", "entry"}};
  const auto loaded = load_safetensors(file("all.safetensors"), &loaded_metadata);
  EXPECT_EQ(loaded_metadata, metadata);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(loaded.count(name), 1u);
    const auto& got = loaded.at(name);
    EXPECT_EQ(got.scalar_type(), tensor.scalar_type());
    EXPECT_EQ(got.sizes(), tensor.sizes());
    EXPECT_TRUE(got.device().is_cpu());
    EXPECT_TRUE(got.is_contiguous());
    // Owns exactly its own bytes: no view into a shared file buffer.
    EXPECT_EQ(got.storage().nbytes(), static_cast<size_t>(got.numel() * got.element_size()));
    EXPECT_TRUE(torch::equal(got, tensor.contiguous()));
  }
}

TEST_F(Safetensors, WithoutMetadataLoadsNoneAndTakesNoOutput) {
  save_safetensors(file("a.safetensors"), {{"x", torch::ones({2})}});
  std::map<std::string, std::string> metadata{{"stale", "entry"}};
  EXPECT_EQ(load_safetensors(file("a.safetensors"), &metadata).size(), 1u);
  EXPECT_TRUE(metadata.empty());
  EXPECT_EQ(load_safetensors(file("a.safetensors")).size(), 1u);
}

// What a checkpoint's reader uses: a file's listing for the cost of its header, and some of its
// tensors without the rest; a damaged file is refused either way.
TEST_F(Safetensors, HeaderAloneAndSomeTensorsAlone) {
  const auto a = torch::arange(6, torch::kFloat).reshape({2, 3});
  const auto b = torch::arange(4, torch::kBFloat16);
  const auto c = torch::tensor({1, 2}, torch::kLong);
  save_safetensors(file("a.safetensors"), {{"a", a}, {"b", b}, {"c", c}});
  const auto listed = read_safetensors_header(file("a.safetensors"));
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(listed.at("a").dtype, torch::kFloat);
  EXPECT_EQ(listed.at("a").nbytes, 24);
  EXPECT_EQ(listed.at("b").dtype, torch::kBFloat16);
  EXPECT_EQ(listed.at("b").nbytes, 8);
  const auto some = load_safetensors(file("a.safetensors"), std::set<std::string>{"a", "c"});
  ASSERT_EQ(some.size(), 2u);
  EXPECT_TRUE(torch::equal(some.at("a"), a));
  EXPECT_TRUE(torch::equal(some.at("c"), c));
  try {
    load_safetensors(file("a.safetensors"), std::set<std::string>{"a", "d"});
    ADD_FAILURE() << "a missing name was not refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("it holds no tensor \"d\""), std::string::npos)
        << e.what();
  }
  const auto bytes = read_bytes(file("a.safetensors"));
  write_bytes(file("a.safetensors"), bytes.substr(0, bytes.size() - 1));
  EXPECT_THROW(read_safetensors_header(file("a.safetensors")), std::runtime_error);
  EXPECT_THROW(load_safetensors(file("a.safetensors"), std::set<std::string>{"a"}),
               std::runtime_error);
}

TEST_F(Safetensors, SameTensorsGiveTheSameBytes) {
  const auto tensors = every_dtype();
  save_safetensors(file("one.safetensors"), tensors, {{"k", "v"}});
  save_safetensors(file("two.safetensors"), every_dtype(), {{"k", "v"}});
  const auto bytes = read_bytes(file("one.safetensors"));
  EXPECT_EQ(bytes, read_bytes(file("two.safetensors")));

  // Header padded to 8 bytes; widest dtypes first, so every tensor is aligned to its element size.
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  const auto header = nlohmann::json::parse(bytes.substr(8, header_size));
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = info["data_offsets"][0].get<uint64_t>();
    EXPECT_EQ(begin % static_cast<uint64_t>(tensors.at(name).element_size()), 0u) << name;
  }
}

// The bytes the reference implementation writes for the same tensors (its own unit tests).
TEST_F(Safetensors, MatchesTheReferenceWritersBytes) {
  save_safetensors(file("attn.safetensors"),
                   {{"attn.0", torch::arange(6, torch::kFloat32).reshape({1, 2, 3})}});
  std::string data(24, '\0');
  const float values[] = {0, 1, 2, 3, 4, 5};
  std::memcpy(data.data(), values, sizeof(values));
  EXPECT_EQ(read_bytes(file("attn.safetensors")),
            make_file(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", data));

  save_safetensors(file("empty.safetensors"), {});
  EXPECT_EQ(read_bytes(file("empty.safetensors")), le64(8) + "{}      ");
  save_safetensors(file("meta.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(file("meta.safetensors")),
            le64(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
  EXPECT_TRUE(load_safetensors(file("empty.safetensors")).empty());
}

TEST_F(Safetensors, IndependentPythonReaderAgrees) {
  TensorMap tensors = every_dtype();
  tensors["values"] = torch::tensor({0.5, -1.25, 8.0, 1024.5}, torch::kFloat32).reshape({2, 2}).t();
  save_safetensors(file("py.safetensors"), tensors, {{"step", "120"}, {"model", "mlp"}});
  const auto summary =
      nlohmann::json::parse(run("python3 '" + kScript + "' '" + file("py.safetensors") + "'"));
  EXPECT_EQ(summary["metadata"], nlohmann::json({{"step", "120"}, {"model", "mlp"}}));
  ASSERT_EQ(summary["tensors"].size(), tensors.size());
  const std::map<at::ScalarType, std::string> names{
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    const auto& info = summary["tensors"][name];
    EXPECT_EQ(info["dtype"], names.at(tensor.scalar_type()));
    EXPECT_EQ(info["shape"].get<std::vector<int64_t>>(), tensor.sizes().vec());
    const double sum = tensor.to(torch::kFloat64).sum().item<double>();
    EXPECT_NEAR(info["sum"].get<double>(), sum, 1e-9 * (1 + std::abs(sum)));
  }
  EXPECT_DOUBLE_EQ(summary["tensors"]["values"]["sum"].get<double>(), 0.5 - 1.25 + 8.0 + 1024.5);
}

TEST_F(Safetensors, LoadsAFileWrittenByPython) {
  run("python3 '" + kScript + "' --write '" + file("from_py.safetensors") + "'");
  std::map<std::string, std::string> metadata;
  const auto t = load_safetensors(file("from_py.safetensors"), &metadata);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"},
                                                          {"writer", "read_safetensors.py"}}));
  ASSERT_EQ(t.size(), 11u);
  EXPECT_TRUE(torch::equal(
      t.at("weight"),
      torch::tensor({0.5, -1.25, 2.0, 3.75, -4.0, 100.125}, torch::kFloat32).reshape({2, 3})));
  EXPECT_TRUE(torch::equal(t.at("bias"), torch::tensor({0.001, -2.5, 1e10}, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(
      t.at("half"), torch::tensor({0.5, -1.5, 2048.0, 0.25}).to(torch::kFloat16).reshape({2, 2})));
  EXPECT_TRUE(
      torch::equal(t.at("brain"), torch::tensor({1.0, -2.0, 3.140625}).to(torch::kBFloat16)));
  EXPECT_EQ(t.at("step").dim(), 0);
  EXPECT_EQ(t.at("step").scalar_type(), torch::kInt64);
  EXPECT_EQ(t.at("step").item<int64_t>(), -7);
  EXPECT_TRUE(torch::equal(
      t.at("ids"),
      torch::tensor({1, -2, 2147483647, static_cast<int>(-2147483648LL)}, torch::kInt32)));
  EXPECT_TRUE(torch::equal(t.at("short"), torch::tensor({-32768, 32767}, torch::kInt16)));
  EXPECT_TRUE(torch::equal(t.at("tiny"), torch::tensor({-128, 0, 127}, torch::kInt8)));
  EXPECT_TRUE(
      torch::equal(t.at("bytes"), torch::tensor({0, 1, 254, 255}, torch::kUInt8).reshape({2, 2})));
  EXPECT_TRUE(torch::equal(t.at("mask"), torch::tensor({true, false, true})));
  EXPECT_EQ(t.at("empty").sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(t.at("empty").scalar_type(), torch::kFloat32);
}

TEST_F(Safetensors, MissingOrShortFilesAreRefused) {
  EXPECT_LOAD_ERROR(file("nope.safetensors"), "No such file");
  write_bytes(file("empty.safetensors"), "");
  EXPECT_LOAD_ERROR(file("empty.safetensors"), "shorter than the 8-byte header length");
  write_bytes(file("three.safetensors"), "abc");
  EXPECT_LOAD_ERROR(file("three.safetensors"), "shorter than the 8-byte header length");
  EXPECT_LOAD_ERROR(dir_, "not a regular file");
}

TEST_F(Safetensors, DamagedHeaderLengthIsRefused) {
  const std::string path = file("len.safetensors");
  save_safetensors(path, {{"x", torch::ones({4})}});
  auto bytes = read_bytes(path);
  bytes[5] = '\x7f';  // what a flipped bit in the length looks like
  write_bytes(path, bytes);
  EXPECT_LOAD_ERROR(path, "is larger than the rest of the file");

  // A file as long as its (too long) header claims: sparse, so it costs no disk.
  write_bytes(path, le64(200'000'000) + "{}");
  fs::resize_file(path, 200'000'100);
  EXPECT_LOAD_ERROR(path, "exceeds the limit of 100000000 bytes");
}

TEST_F(Safetensors, TruncatedFileIsRefused) {
  const std::string path = file("cut.safetensors");
  save_safetensors(path, {{"a", torch::ones({4})}, {"b", torch::ones({2, 2}, torch::kInt64)}});
  const auto bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 4));
  EXPECT_LOAD_ERROR(path, "truncated");
  write_bytes(path, bytes.substr(0, 20));  // inside the header
  EXPECT_LOAD_ERROR(path, "is larger than the rest of the file");
}

TEST_F(Safetensors, BadHeadersAreRefused) {
  const std::string path = file("bad.safetensors");
  const std::string f32x2(8, '\0');
  const auto expect = [&](const std::string& header, const std::string& data,
                          const std::string& phrase) {
    SCOPED_TRACE(header);
    write_bytes(path, make_file(header, data));
    EXPECT_LOAD_ERROR(path, phrase);
  };
  expect("this is not json", "", "not valid JSON");
  expect(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8])", f32x2, "not valid JSON");
  expect("[1, 2]", "", "the header is a JSON array, not an object");
  expect(R"({"x": [1, 2]})", "", "not an object with dtype, shape and data_offsets");
  expect(R"({"x": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}})", f32x2,
         "dtype F8_E4M3, which pipetrain does not read");
  expect(R"({"x": {"shape": [2], "data_offsets": [0, 8]}})", f32x2, "no dtype");
  expect(R"({"x": {"dtype": "F32", "data_offsets": [0, 8]}})", f32x2, "no \"shape\"");
  expect(R"({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", f32x2,
         "list of non-negative integers");
  expect(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", f32x2,
         "must be [begin, end]");
  expect(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", f32x2,
         "needs 12 bytes but its data_offsets [0, 8] span 8");
  expect(R"({"x": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", f32x2,
         "end before they begin");
  expect(R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
         f32x2, "is too large");
  expect(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "__metadata__": {"epoch": 3}})",
         f32x2, "strings to strings");
  expect(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
         f32x2, "names \"x\" twice");
  expect(R"({"x": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", std::string("\1\2"),
         "other than 0 and 1");
}

TEST_F(Safetensors, BadOffsetsAreRefused) {
  const std::string path = file("offsets.safetensors");
  const auto expect = [&](const std::string& header, size_t data_size, const std::string& phrase) {
    SCOPED_TRACE(header);
    write_bytes(path, make_file(header, std::string(data_size, '\0')));
    EXPECT_LOAD_ERROR(path, phrase);
  };
  expect(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
         12, R"(tensors "a" [0, 8] and "b" [4, 12] overlap)");
  expect(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
         8, "overlap");
  expect(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
         20, "not contiguous");
  expect(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12, "not contiguous");
  expect(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [1000, 1008]}})", 8,
         "run past the end of the data buffer");
  expect(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 12,
         "buffer size mismatch");
}

TEST_F(Safetensors, UnsupportedTensorsAreRefusedOnSave) {
  const std::string path = file("c.safetensors");
  try {
    save_safetensors(path, {{"z", torch::ones({2}, torch::kComplexFloat)}});
    FAIL() << "complex tensors have no safetensors dtype here";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor \"z\" has dtype ComplexFloat"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(save_safetensors(path, {{"__metadata__", torch::ones({2})}}), std::invalid_argument);
  EXPECT_THROW(save_safetensors(path, {{"u", at::Tensor()}}), std::invalid_argument);
  EXPECT_THROW(save_safetensors(path, {}, {{"bad", "\xff\xfe"}}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(Safetensors, FailedSaveLeavesTheOldFileAndNoTemporary) {
  // Into a directory that does not exist.
  const std::string missing = file("no/such/dir/w.safetensors");
  try {
    save_safetensors(missing, {{"x", torch::ones({2})}});
    FAIL() << "saving into a missing directory must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("check that the directory exists"), std::string::npos)
        << e.what();
  }

  // Failing midway, after the temporary file was created: the old file stays as it was.
  const std::string path = file("w.safetensors");
  save_safetensors(path, {{"x", torch::ones({2})}});
  const auto before = read_bytes(path);
  EXPECT_ANY_THROW(save_safetensors(
      path, {{"a", torch::ones({2})}, {"b", torch::empty({3}, torch::TensorOptions(at::kMeta))}}));
  EXPECT_EQ(read_bytes(path), before);

  // Onto a directory: the final rename fails.
  fs::create_directory(file("taken.safetensors"));
  fs::create_directory(file("taken.safetensors/inside"));
  EXPECT_THROW(save_safetensors(file("taken.safetensors"), {{"x", torch::ones({2})}}),
               std::runtime_error);

  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_)) left.push_back(entry.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"taken.safetensors", "w.safetensors"}));
}

TEST_F(Safetensors, SavesTensorsFromTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto cpu = torch::randn({64, 32});
  save_safetensors(file("gpu.safetensors"),
                   {{"w", cpu.to(torch::kCUDA).t()}, {"h", cpu.to(torch::kCUDA, torch::kHalf)}});
  const auto loaded = load_safetensors(file("gpu.safetensors"));
  EXPECT_TRUE(torch::equal(loaded.at("w"), cpu.t().contiguous()));
  EXPECT_TRUE(torch::equal(loaded.at("h"), cpu.to(torch::kHalf)));
}

}  // namespace
}  // namespace pipetrain::safetensors_test
