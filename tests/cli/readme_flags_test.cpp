// README's table of flags and `pipetrain fit --help` name the same flags with the same defaults,
// in both directions, so neither drifts from the code. A README row may list several flags: its
// defaults are then one per flag (", "-separated) or one for all; an empty cell means "no
// default". Values compare after the README's backticks and --help's spelling of booleans (1, 0)
// and lists ("csv tensorboard ...") are normalised.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/command.h"

namespace pipetrain::testing::readme_flags_test {
namespace {

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(' ');
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(' ') - begin + 1);
}

std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const auto end = text.find(separator, begin);
    parts.push_back(trim(text.substr(begin, end - begin)));
    if (end == std::string::npos) return parts;
    begin = end + separator.size();
  }
}

// The cells of a Markdown table row, `\|` kept inside a cell.
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> result;
  std::string cell;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      result.push_back(trim(cell));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return result;
}

// The flags a README cell names; "--limit-{train,val}-batches" stands for both.
std::vector<std::string> flags_in(const std::string& cell) {
  std::vector<std::string> flags;
  const std::regex flag(R"(--([a-z0-9-]*)(\{([a-z,]+)\})?([a-z0-9-]*))");
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), flag); it != std::sregex_iterator();
       ++it) {
    const auto& match = *it;
    if (!match[2].matched) {
      flags.push_back("--" + match[1].str() + match[4].str());
      continue;
    }
    for (const auto& part : split(match[3].str(), ",")) {
      flags.push_back("--" + match[1].str() + part + match[4].str());
    }
  }
  return flags;
}

std::string without_backticks(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '`'), text.end());
  return trim(text);
}

// flag -> default, from README's table.
std::map<std::string, std::string> readme_flags() {
  std::ifstream readme(std::string(PIPETRAIN_SOURCE_DIR) + "/README.md");
  std::map<std::string, std::string> flags;
  std::string line;
  bool in_table = false;
  while (std::getline(readme, line)) {
    if (line.rfind("| flag | default |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|", 0) != 0) break;
    if (line.rfind("|---", 0) == 0) continue;
    const auto row = cells(line);
    if (row.size() < 3) {
      ADD_FAILURE() << "README row without three cells: " << line;
      continue;
    }
    const auto names = flags_in(row[0]);
    const auto defaults = split(without_backticks(row[1]), ", ");
    if (defaults.size() != 1 && defaults.size() != names.size()) {
      ADD_FAILURE() << "README row gives " << defaults.size() << " defaults for " << names.size()
                    << " flags: " << line;
      continue;
    }
    for (size_t i = 0; i < names.size(); ++i) {
      flags[names[i]] = without_backticks(defaults.size() == 1 ? defaults[0] : defaults[i]);
    }
  }
  return flags;
}

// flag -> default, from `pipetrain fit --help`.
std::map<std::string, std::string> help_flags() {
  const auto help = run_command({PIPETRAIN_CLI, "fit", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.output;
  std::map<std::string, std::string> flags;
  const std::regex option(R"(^  (--[a-z0-9-]+)( ([A-Z]+)(=(.*?))?( \.\.\.)?)? *(\(Env:.*)?$)");
  std::istringstream lines(help.output);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (!std::regex_match(line, match, option) || match[1] == "--help") continue;
    std::string value = match[4].matched ? trim(match[5].str()) : "";
    if (match[3] == "BOOLEAN") value = value == "1" ? "true" : value == "0" ? "false" : value;
    // A list's default is printed space-separated, with " ..." after it.
    const auto dots = value.rfind(" ...");
    if (dots != std::string::npos) value = value.substr(0, dots);
    std::replace(value.begin(), value.end(), ' ', ',');
    flags[match[1]] = value;
  }
  return flags;
}

TEST(ReadmeFlags, TheTableAndHelpNameTheSameFlagsWithTheSameDefaults) {
  const auto readme = readme_flags();
  const auto help = help_flags();
  ASSERT_GT(help.size(), 40u) << "could not read `pipetrain fit --help`";
  for (const auto& [flag, value] : help) {
    const auto found = readme.find(flag);
    if (found == readme.end()) {
      ADD_FAILURE() << flag << " (default '" << value
                    << "') is in --help but not in README's table";
    } else {
      EXPECT_EQ(found->second, value) << flag << ": README's default against --help's";
    }
  }
  for (const auto& [flag, value] : readme) {
    EXPECT_TRUE(help.count(flag)) << flag << " is in README's table but not in --help";
  }
}

}  // namespace
}  // namespace pipetrain::testing::readme_flags_test
