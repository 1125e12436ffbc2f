// Metrics as TensorBoard event files, as Lightning's TensorBoardLogger writes them, so `tensorboard
// --logdir <root>` shows pipetrain runs next to Lightning ones. The TFRecord framing and the few
// Event/Summary protobuf fields needed for scalars are written by hand: pulling in protobuf (or
// torch) for a handful of bytes per step would cost far more than it saves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "pipetrain/logger.h"

namespace pipetrain {

namespace tensorboard {
// CRC-32C (Castagnoli, reflected 0x82F63B78), the checksum TFRecord framing uses. Exposed so tests
// can check it against known answers.
uint32_t crc32c(const void* data, size_t size);
// The CRC rotated and offset as TFRecord stores it (a CRC of data that embeds CRCs is otherwise
// weak): ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);
}  // namespace tensorboard

class TensorBoardLogger : public Logger {
 public:
  // Writes into version_<version> under <root_dir>/<name>; the next free one when unset. Creates
  // the events file at once (with its file_version record), as TensorBoard's writer does.
  explicit TensorBoardLogger(const std::string& root_dir,
                             const std::string& name = "lightning_logs",
                             std::optional<int64_t> version = std::nullopt);
  ~TensorBoardLogger() override;

  std::string name() const override { return "tensorboard"; }
  std::string log_dir() const override { return log_dir_; }
  // events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter> inside log_dir().
  std::string event_file() const { return event_file_; }

  // hparams.yaml beside the events, "key: value" lines sorted by key (the CSV logger writes the
  // same bytes, so both may share a directory).
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  // One Event at `step` with one scalar per metric (epoch included, as Lightning logs it).
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  // One Event at `step` holding `text` as TensorBoard's add_text writes it (a string tensor of the
  // text plugin), shown in TensorBoard's Text tab.
  void log_text(const std::string& tag, const std::string& text, int64_t step) override;
  // Flushes the buffered records to disk.
  void save() override;

 private:
  void write_record(const std::string& data);

  std::string log_dir_;
  std::string event_file_;
  std::string pending_;  // records not yet written (save() appends them to the event file)
};

}  // namespace pipetrain
