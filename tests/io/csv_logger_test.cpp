#include "pipetrain/csv_logger.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "pipetrain/logger.h"
#include "support/multiprocess.h"

namespace pipetrain::csv_logger_test {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CSVLogger, WritesLightningsLayoutInTheNextFreeVersion) {
  const auto root = testing::make_temp_dir("csv-logger");
  CSVLogger first(root);
  EXPECT_EQ(first.log_dir(), root + "/lightning_logs/version_0");
  CSVLogger second(root);
  EXPECT_EQ(second.log_dir(), root + "/lightning_logs/version_1");

  first.log_metrics({{"train_loss", 0.5}, {"epoch", 0}}, 0);
  first.log_metrics({{"train_loss", 0.25}, {"epoch", 0}}, 1);
  first.save();
  EXPECT_EQ(read(first.metrics_path()), "epoch,step,train_loss\n0,0,0.5\n0,1,0.25\n");

  // A new column rewrites the file with the header extended and old rows left blank there.
  first.log_metrics({{"val_loss", 1.5}, {"epoch", 1}}, 2);
  first.save();
  EXPECT_EQ(read(first.metrics_path()),
            "epoch,step,train_loss,val_loss\n0,0,0.5,\n0,1,0.25,\n1,2,,1.5\n");
  std::filesystem::remove_all(root);
}

// Claims racing on one root (threads released at once) each get a version of their own.
TEST(LogVersion, ConcurrentClaimsGetDistinctVersions) {
  const auto root = testing::make_temp_dir("log-version");
  constexpr int kThreads = 16, kClaims = 5;
  std::vector<std::vector<int64_t>> claimed(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready < kThreads) std::this_thread::yield();
      for (int c = 0; c < kClaims; ++c) claimed[t].push_back(claim_log_version(root));
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<int64_t> versions;
  for (const auto& mine : claimed) versions.insert(mine.begin(), mine.end());
  EXPECT_EQ(versions.size(), static_cast<size_t>(kThreads * kClaims));
  EXPECT_EQ(*versions.rbegin(), kThreads * kClaims - 1);
  for (int64_t v : versions) {
    EXPECT_TRUE(
        std::filesystem::is_directory(root + "/lightning_logs/version_" + std::to_string(v)));
  }
  std::filesystem::remove_all(root);
}

TEST(CSVLogger, WritesHyperparameters) {
  const auto root = testing::make_temp_dir("csv-logger");
  CSVLogger logger(root);
  logger.log_hyperparams({{"lr", "0.001"}, {"strategy", "pipe"}});
  EXPECT_EQ(read(logger.log_dir() + "/hparams.yaml"), "lr: 0.001\nstrategy: pipe\n");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::csv_logger_test
