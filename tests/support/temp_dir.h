// A test with a folder of its own.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/multiprocess.h"

namespace pipetrain::testing {

// A test with a fresh folder, `dir`, removed after the test. The folder is named after the test
// suite, so that one left behind (by a test that crashed) says whose it is.
class TempDirTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir); }
  // File `name` in dir.
  std::string path(const std::string& name) const { return dir + "/" + name; }
  // Writes `text` to file `name` in dir, making its folders; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories(std::filesystem::path(path(name)).parent_path());
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  const std::string dir = make_temp_dir(suite_name());

 private:
  static std::string suite_name() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
    std::replace(name.begin(), name.end(), '/', '-');  // a parameterized suite's "Prefix/Suite"
    return name;
  }
};

}  // namespace pipetrain::testing
