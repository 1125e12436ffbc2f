// The events file is checked by tests/io/read_tfevents.py, a reader written separately from the
// logger (its own CRC and protobuf decoding), so a shared misreading of the format cannot pass.
#include "pipetrain/tensorboard_logger.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

namespace pipetrain::tensorboard_logger_test {
namespace {
namespace fs = std::filesystem;

// Not the shared testing::make_temp_dir: that support library pulls in torch, and this test must
// build without it.
std::string make_temp_dir(const std::string& prefix) {
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path() /
                       (prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ReaderResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

ReaderResult run_reader(const std::string& events_file) {
  const std::string command =
      "python3 \"" PIPETRAIN_SOURCE_DIR "/tests/io/read_tfevents.py\" \"" + events_file + "\" 2>&1";
  ReaderResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

bool have_python3() { return std::system("python3 -c pass >/dev/null 2>&1") == 0; }

struct Scalar {
  std::string tag;
  int64_t step;
  double value;
  double wall_time;
};

// The reader prints json.dumps output, whose layout is fixed (", " and ": " separators, keys in
// insertion order), so a pattern is enough to pick the scalars out.
std::vector<Scalar> parse_scalars(const std::string& json) {
  static const std::regex pattern(
      R"re(\{"tag": "([^"]*)", "step": (-?\d+), "value": ([^,]+), "wall_time": ([^}]+)\})re");
  std::vector<Scalar> scalars;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    scalars.push_back({(*it)[1], std::stoll((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
  }
  return scalars;
}

std::string parse_file_version(const std::string& json) {
  static const std::regex pattern(R"re("file_version": "([^"]*)")re");
  std::smatch match;
  return std::regex_search(json, match, pattern) ? match[1].str() : "";
}

TEST(TensorBoardCrc32c, MatchesKnownAnswers) {
  const std::string check = "123456789";
  EXPECT_EQ(tensorboard::crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(tensorboard::crc32c(nullptr, 0), 0u);
  // RFC 3720 (iSCSI) B.4 vectors.
  const std::string zeros(32, '\0');
  const std::string ones(32, '\xff');
  EXPECT_EQ(tensorboard::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(tensorboard::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, worked by hand.
  EXPECT_EQ(tensorboard::masked_crc32c(check.data(), check.size()), 0xC78AB0E5u);
}

TEST(TensorBoardLogger, WritesScalarsAnIndependentReaderAccepts) {
  if (!have_python3()) GTEST_SKIP() << "python3 is needed to read the events back";
  const auto root = make_temp_dir("tb-logger");
  // A tag longer than 127 bytes makes the Value, Summary and Event lengths multi-byte varints.
  const std::string long_tag = "val/" + std::string(200, 'x');
  std::string events;
  {
    TensorBoardLogger logger(root);
    events = logger.event_file();
    logger.log_metrics({{"train_loss", 0.1}, {"epoch", 0}, {"lr", 1e-3}}, 0);
    logger.log_metrics({{"train_loss", -2.5}, {"epoch", 0}}, 1);
    logger.save();
    logger.log_metrics({{long_tag, 123456.789}, {"epoch", 1}}, 300);
    logger.log_metrics({{"neg_step", 7}}, -3);
    logger.save();
  }
  const auto result = run_reader(events);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(parse_file_version(result.output), "brain.Event:2");

  struct Expected {
    std::string tag;
    int64_t step;
    double value;
  };
  // Within one event the metrics come in std::map order.
  const std::vector<Expected> expected = {
      {"epoch", 0, 0},         {"lr", 0, 1e-3},   {"train_loss", 0, 0.1},      {"epoch", 1, 0},
      {"train_loss", 1, -2.5}, {"epoch", 300, 1}, {long_tag, 300, 123456.789}, {"neg_step", -3, 7},
  };
  const auto scalars = parse_scalars(result.output);
  ASSERT_EQ(scalars.size(), expected.size()) << result.output;
  const double now = static_cast<double>(time(nullptr));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(scalars[i].tag, expected[i].tag) << i;
    EXPECT_EQ(scalars[i].step, expected[i].step) << i;
    // simple_value is a float: the value read back is exactly the float nearest the one logged.
    EXPECT_EQ(static_cast<float>(scalars[i].value), static_cast<float>(expected[i].value)) << i;
    EXPECT_EQ(scalars[i].value, static_cast<double>(static_cast<float>(expected[i].value))) << i;
    EXPECT_NEAR(scalars[i].wall_time, now, 60.0) << i;
  }
  fs::remove_all(root);
}

TEST(TensorBoardLogger, ReaderRejectsACorruptedFile) {
  if (!have_python3()) GTEST_SKIP() << "python3 is needed to read the events back";
  const auto root = make_temp_dir("tb-logger");
  std::string events;
  {
    TensorBoardLogger logger(root);
    events = logger.event_file();
    logger.log_metrics({{"train_loss", 0.5}}, 1);
    logger.save();
  }
  ASSERT_EQ(run_reader(events).exit_code, 0);
  const std::string original = read_file(events);
  auto corrupt_at = [&](size_t offset) {
    std::string bytes = original;
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x01);
    const std::string path = root + "/corrupt.tfevents";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return run_reader(path);
  };
  // The last record's data ends 4 bytes before the file does: flip its last byte (the float).
  const auto data_flip = corrupt_at(original.size() - 5);
  EXPECT_NE(data_flip.exit_code, 0);
  EXPECT_NE(data_flip.output.find("data crc mismatch"), std::string::npos) << data_flip.output;
  // The first record's length field.
  const auto length_flip = corrupt_at(0);
  EXPECT_NE(length_flip.exit_code, 0);
  EXPECT_NE(length_flip.output.find("length crc mismatch"), std::string::npos)
      << length_flip.output;
  fs::remove_all(root);
}

TEST(TensorBoardLogger, UsesTheNextFreeVersionAndNamesTheFileAsTensorBoardDoes) {
  const auto root = make_temp_dir("tb-logger");
  TensorBoardLogger first(root);
  EXPECT_EQ(first.name(), "tensorboard");
  EXPECT_EQ(first.log_dir(), root + "/lightning_logs/version_0");
  TensorBoardLogger second(root);
  EXPECT_EQ(second.log_dir(), root + "/lightning_logs/version_1");
  TensorBoardLogger pinned(root, "runs", 7);
  EXPECT_EQ(pinned.log_dir(), root + "/runs/version_7");

  for (const auto* logger : {&first, &second, &pinned}) {
    EXPECT_TRUE(fs::is_regular_file(logger->event_file())) << logger->event_file();
    EXPECT_EQ(fs::path(logger->event_file()).parent_path().string(), logger->log_dir());
    const std::string file = fs::path(logger->event_file()).filename().string();
    EXPECT_TRUE(std::regex_match(file, std::regex(R"(events\.out\.tfevents\.\d+\..+\.\d+\.\d+)")))
        << file;
    EXPECT_NE(file.find("." + std::to_string(getpid()) + "."), std::string::npos) << file;
  }
  // Two files from one process in the same second still differ, by the trailing counter.
  EXPECT_NE(fs::path(first.event_file()).filename(), fs::path(second.event_file()).filename());
  fs::remove_all(root);
}

TEST(TensorBoardLogger, WritesHyperparametersBesideTheEvents) {
  const auto root = make_temp_dir("tb-logger");
  TensorBoardLogger logger(root);
  logger.log_hyperparams({{"strategy", "pipe"}, {"lr", "0.001"}, {"batch_size", "32"}});
  EXPECT_EQ(read_file(logger.log_dir() + "/hparams.yaml"),
            "batch_size: 32\nlr: 0.001\nstrategy: pipe\n");
  // Logging again (as a CSV logger sharing the directory would) rewrites, never appends.
  logger.log_hyperparams({{"lr", "0.01"}});
  EXPECT_EQ(read_file(logger.log_dir() + "/hparams.yaml"), "lr: 0.01\n");
  fs::remove_all(root);
}

TEST(TensorBoardLogger, NamesTheEventFileWhenItCannotBeCreated) {
  // A log directory just short of Linux's PATH_MAX (4096) exists, but no file name fits inside it:
  // unlike a read-only directory, this fails for root too.
  const auto root = make_temp_dir("tb-logger");
  const std::string suffix = "/version_0";
  std::string name = "lightning_logs";
  while (root.size() + name.size() + suffix.size() + 202 < 4060)
    name += "/" + std::string(200, 'd');
  name += "/" + std::string(4060 - root.size() - name.size() - suffix.size() - 2, 'd');
  const std::string dir = root + "/" + name + suffix;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) GTEST_SKIP() << "this system does not allow a " << dir.size() << "-byte directory";
  try {
    TensorBoardLogger logger(root, name, 0);
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(dir + "/events.out.tfevents."), std::string::npos)
        << error.what();
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::tensorboard_logger_test
