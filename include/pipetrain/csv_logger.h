// Metrics in Lightning's CSV layout, so existing tools read them:
// <root>/lightning_logs/version_<N>/metrics.csv with one row per logging step, columns in the order
// they first appeared (new ones sorted), and hparams.yaml beside it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/logger.h"

namespace pipetrain {

class CSVLogger : public Logger {
 public:
  // Writes into version_<version> under <root_dir>/<name>; the next free one when unset.
  // Rows are written every `flush_logs_every_n_steps` logging calls and at save().
  explicit CSVLogger(const std::string& root_dir, const std::string& name = "lightning_logs",
                     std::optional<int64_t> version = std::nullopt,
                     int64_t flush_logs_every_n_steps = 100);

  std::string name() const override { return "csv"; }
  std::string log_dir() const override { return log_dir_; }
  std::string metrics_path() const { return log_dir_ + "/metrics.csv"; }

  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  // Adds a row; `step` becomes the "step" column.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  // Writes metrics.csv (rewritten whole, as Lightning does, when new columns appear).
  void save() override;

 private:
  std::string log_dir_;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, double>> pending_;  // logged, not yet in the file
  size_t saved_columns_ = 0;
  int64_t flush_every_ = 100;
};

}  // namespace pipetrain
