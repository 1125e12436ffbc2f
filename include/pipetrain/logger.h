// Where metrics go, as Lightning's Logger: several may be active at once, each writing into the
// run's version_<N> directory in its own format. Only rank 0 has loggers.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace pipetrain {

class Logger {
 public:
  virtual ~Logger() = default;
  virtual std::string name() const = 0;
  // <root>/lightning_logs/version_<N>.
  virtual std::string log_dir() const = 0;
  virtual void log_hyperparams(const std::map<std::string, std::string>& params) = 0;
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step) = 0;
  // `text` under `tag` at `step` (a generated sample, say), where the format keeps text
  // (TensorBoard's text plugin); others pass it over, as Lightning's loggers without log_text.
  virtual void log_text(const std::string& /*tag*/, const std::string& /*text*/, int64_t /*step*/) {
  }
  // Makes what was logged durable (called at each logging step and at the end).
  virtual void save() = 0;
};

// Claims the lowest free version under <root_dir>/<name> by creating its version_<N> directory,
// and returns N. Creating a directory is atomic, so of several runs starting at once on one root
// each gets a version of its own.
int64_t claim_log_version(const std::string& root_dir, const std::string& name = "lightning_logs");
// <root_dir>/<name>/version_<version>, created.
std::string make_log_dir(const std::string& root_dir, const std::string& name, int64_t version);

}  // namespace pipetrain
