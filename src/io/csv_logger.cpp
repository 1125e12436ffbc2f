#include "pipetrain/csv_logger.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include "io/file_writer.h"

namespace pipetrain {
namespace fs = std::filesystem;

CSVLogger::CSVLogger(const std::string& root_dir, const std::string& name,
                     std::optional<int64_t> version, int64_t flush_logs_every_n_steps)
    : log_dir_(
          make_log_dir(root_dir, name, version ? *version : claim_log_version(root_dir, name))),
      flush_every_(std::max<int64_t>(1, flush_logs_every_n_steps)) {}

void CSVLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  std::string text;
  for (const auto& [key, value] : params) text += key + ": " + value + "\n";
  write_file(log_dir_ + "/hparams.yaml", text);
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  auto row = metrics;
  row["step"] = static_cast<double>(step);
  std::vector<std::string> fresh;
  for (const auto& [key, value] : row) {
    if (std::find(columns_.begin(), columns_.end(), key) == columns_.end()) fresh.push_back(key);
  }
  columns_.insert(columns_.end(), fresh.begin(), fresh.end());  // std::map keeps them sorted
  pending_.push_back(std::move(row));
  if (static_cast<int64_t>(pending_.size()) >= flush_every_) save();
}

// Saved rows live only in the file (a long run keeps no history in memory); new columns are
// appended, so widening the file only means extending its header and padding the old lines.
void CSVLogger::save() {
  const std::string path = metrics_path();
  std::vector<std::string> old_lines;
  const bool widen = columns_.size() != saved_columns_;
  if (widen && saved_columns_ > 0) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // the old header
    while (std::getline(in, line)) old_lines.push_back(line);
  }
  std::ostringstream out;
  if (widen) {
    for (size_t c = 0; c < columns_.size(); ++c) out << (c ? "," : "") << columns_[c];
    out << '\n';
    const std::string padding(columns_.size() - saved_columns_, ',');
    for (const auto& line : old_lines) out << line << padding << '\n';
  }
  for (const auto& row : pending_) {
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (c) out << ',';
      const auto it = row.find(columns_[c]);
      if (it == row.end()) continue;
      const double v = it->second;
      if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 1e15) {
        out << static_cast<int64_t>(v);
      } else {
        out << std::setprecision(std::numeric_limits<float>::max_digits10) << v;
      }
    }
    out << '\n';
  }
  // A new column rewrites the file whole (the old one stays until the new one is complete);
  // otherwise the rows are appended. Either way a failed write keeps the rows for the next try.
  if (widen) {
    write_file(path, out.str());
  } else {
    append_file(path, out.str());
  }
  pending_.clear();
  saved_columns_ = columns_.size();
}

}  // namespace pipetrain
