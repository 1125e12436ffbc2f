// Metrics in Lightning's CSV layout, so existing tools read them:
// <root>/lightning_logs/version_<N>/metrics.csv with one row per logging step, columns in the order
// they first appeared (new ones sorted), and hparams.yaml beside it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pipetrain {

class CSVLogger {
 public:
  // Picks the next free version_<N> under <root_dir>/<name>.
  explicit CSVLogger(std::string root_dir, std::string name = "lightning_logs");

  const std::string& log_dir() const { return log_dir_; }
  std::string metrics_path() const { return log_dir_ + "/metrics.csv"; }

  void log_hyperparams(const std::map<std::string, std::string>& params);
  // Adds a row; `step` becomes the "step" column.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step);
  // Writes metrics.csv (rewritten whole, as Lightning does, when new columns appear).
  void save();

 private:
  std::string log_dir_;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, double>> rows_;
  size_t saved_rows_ = 0;
  size_t saved_columns_ = 0;
};

}  // namespace pipetrain
