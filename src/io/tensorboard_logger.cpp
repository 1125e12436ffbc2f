// TensorBoard's on-disk format without protobuf or TensorFlow: a TFRecord file of serialized Event
// messages, encoded here field by field. Only the fields scalar logging needs are written; see
// tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto.
#include "pipetrain/tensorboard_logger.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "io/file_writer.h"

namespace pipetrain {

namespace tensorboard {
namespace {

// One lookup table for byte-at-a-time CRC; plenty fast for a few records per logging step.
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace tensorboard

namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Bytes are emitted by shifting rather than memcpy of the integer so the file is little-endian
// whatever the host is.
void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

void put_fixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80u) {
    out.push_back(static_cast<char>((v & 0x7Fu) | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_fixed64(out, bits);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  put_fixed32(out, bits);
}

// int64 is a plain (not zigzag) varint: negative steps take the full ten bytes, as protobuf does.
void put_int64(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event field numbers (event.proto).
constexpr uint32_t kEventWallTime = 1;
constexpr uint32_t kEventStep = 2;
constexpr uint32_t kEventFileVersion = 3;
constexpr uint32_t kEventSummary = 5;
// Summary (summary.proto): repeated Value value = 1; Value: tag = 1, simple_value = 2.
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1;
constexpr uint32_t kValueSimpleValue = 2;
// Value's tensor = 8 and metadata = 9; SummaryMetadata's plugin_data = 1 (PluginData: plugin_name
// = 1, content = 2); TensorProto (tensor.proto): dtype = 1 (DT_STRING = 7), tensor_shape = 2
// (TensorShapeProto: dim = 2, Dim: size = 1), string_val = 8.
constexpr uint32_t kValueTensor = 8;
constexpr uint32_t kValueMetadata = 9;
constexpr uint32_t kMetadataPluginData = 1;
constexpr uint32_t kPluginName = 1;
constexpr uint32_t kTensorDtype = 1;
constexpr uint32_t kTensorShape = 2;
constexpr uint32_t kTensorStringVal = 8;
constexpr uint32_t kShapeDim = 2;
constexpr uint32_t kDimSize = 1;
constexpr int64_t kDtString = 7;

double wall_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0) return "localhost";
  return buffer;
}

// Distinguishes files created by one process within the same second, as TensorBoard's global uid.
std::atomic<int64_t> event_file_counter{0};

}  // namespace

TensorBoardLogger::TensorBoardLogger(const std::string& root_dir, const std::string& name,
                                     std::optional<int64_t> version)
    : log_dir_(
          make_log_dir(root_dir, name, version ? *version : claim_log_version(root_dir, name))) {
  const double now = wall_time_now();
  event_file_ = log_dir_ + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) +
                "." + host_name() + "." + std::to_string(static_cast<int64_t>(getpid())) + "." +
                std::to_string(event_file_counter++);
  write_file(event_file_, "");
  // Readers identify the format by this first record.
  std::string event;
  put_double(event, kEventWallTime, now);
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  write_record(event);
  save();
}

TensorBoardLogger::~TensorBoardLogger() {
  // Best effort: a destructor must not throw, and save() already reported any earlier failure.
  try {
    save();
  } catch (const std::exception&) {
  }
}

void TensorBoardLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  const std::string path = log_dir_ + "/hparams.yaml";
  std::string text;
  for (const auto& [key, value] : params) text += key + ": " + value + "\n";
  write_file(path, text);
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  std::string summary;
  for (const auto& [tag, value] : metrics) {
    std::string entry;
    put_bytes(entry, kValueTag, tag);
    put_float(entry, kValueSimpleValue, static_cast<float>(value));
    put_bytes(summary, kSummaryValue, entry);
  }
  std::string event;
  put_double(event, kEventWallTime, wall_time_now());
  put_int64(event, kEventStep, step);
  put_bytes(event, kEventSummary, summary);
  write_record(event);
}

void TensorBoardLogger::log_text(const std::string& tag, const std::string& text, int64_t step) {
  std::string plugin, metadata, dim, shape, tensor, entry, summary, event;
  put_bytes(plugin, kPluginName, "text");
  put_bytes(metadata, kMetadataPluginData, plugin);
  put_int64(dim, kDimSize, 1);
  put_bytes(shape, kShapeDim, dim);
  put_int64(tensor, kTensorDtype, kDtString);
  put_bytes(tensor, kTensorShape, shape);
  put_bytes(tensor, kTensorStringVal, text);
  put_bytes(entry, kValueTag, tag);
  put_bytes(entry, kValueTensor, tensor);
  put_bytes(entry, kValueMetadata, metadata);
  put_bytes(summary, kSummaryValue, entry);
  put_double(event, kEventWallTime, wall_time_now());
  put_int64(event, kEventStep, step);
  put_bytes(event, kEventSummary, summary);
  write_record(event);
}

void TensorBoardLogger::save() {
  if (pending_.empty()) return;
  append_file(event_file_, pending_);  // keeps the records for the next try when it fails
  pending_.clear();
}

// TFRecord framing: length, masked CRC of the length bytes, data, masked CRC of the data.
void TensorBoardLogger::write_record(const std::string& data) {
  std::string header;
  put_fixed64(header, data.size());
  std::string record = header;
  put_fixed32(record, tensorboard::masked_crc32c(header.data(), header.size()));
  record += data;
  put_fixed32(record, tensorboard::masked_crc32c(data.data(), data.size()));
  pending_ += record;
}

}  // namespace pipetrain
