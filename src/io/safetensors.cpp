// safetensors reading and writing (format: https://huggingface.co/docs/safetensors). The writer
// lays the file out as the reference Rust implementation does (tensors by descending dtype
// alignment, then name; header padded with spaces to 8 bytes), so every tensor is aligned and the
// same tensors always give the same bytes. The reader applies the reference's validation rules and
// turns each violation into a message that says what is wrong and what to do, since these files
// come from other programs and other people.
#include "pipetrain/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "io/file_writer.h"

// safetensors stores the header length and every tensor little-endian; we copy raw bytes between
// tensors and the file, which is only right on a little-endian host (x86-64, ARM64 as run).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "pipetrain's safetensors I/O assumes a little-endian host");

namespace pipetrain {
namespace {

using Json = nlohmann::json;

// The reference reader refuses larger headers (MAX_HEADER_SIZE in safetensors/src/tensor.rs).
constexpr uint64_t kMaxHeaderSize = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct Dtype {
  const char* name;
  at::ScalarType type;
  uint64_t size;  // bytes per element
  int rank;       // the reference writer puts higher ranks (wider alignment) first
};

// Ranks follow the order of the reference's `Dtype` enum, whose writer sorts by it.
constexpr Dtype kDtypes[] = {
    {"F64", at::kDouble, 8, 8},    {"F32", at::kFloat, 4, 7}, {"F16", at::kHalf, 2, 4},
    {"BF16", at::kBFloat16, 2, 5}, {"I64", at::kLong, 8, 9},  {"I32", at::kInt, 4, 6},
    {"I16", at::kShort, 2, 3},     {"I8", at::kChar, 1, 2},   {"U8", at::kByte, 1, 1},
    {"BOOL", at::kBool, 1, 0},
};

const Dtype* find_dtype(const std::string& name) {
  for (const auto& dtype : kDtypes) {
    if (name == dtype.name) return &dtype;
  }
  return nullptr;
}

const Dtype* find_dtype(at::ScalarType type) {
  for (const auto& dtype : kDtypes) {
    if (type == dtype.type) return &dtype;
  }
  return nullptr;
}

std::string dtype_names() {
  std::string names;
  for (const auto& dtype : kDtypes) names += (names.empty() ? "" : ", ") + std::string(dtype.name);
  return names;
}

std::string errno_text(int error) { return std::strerror(error); }

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string range_text(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  void reset(int fd) {
    close();
    fd_ = fd;
  }
  // Closes now and reports close()'s errno (0 on success): a failed close can mean lost writes.
  int close() {
    const int fd = fd_;
    fd_ = -1;
    return fd >= 0 && ::close(fd) != 0 ? errno : 0;
  }

 private:
  int fd_;
};

// ---------------------------------------------------------------------------------------------
// Writing

struct SaveEntry {
  const std::string* name;
  const at::Tensor* tensor;
  const Dtype* dtype;
  uint64_t nbytes;
};

// ---------------------------------------------------------------------------------------------
// Reading

[[noreturn]] void fail_load(const std::string& path, const std::string& what,
                            const std::string& advice) {
  throw std::runtime_error("load_safetensors: " + path + ": " + what + "; " + advice);
}

constexpr const char* kResave =
    "the file is corrupt or was not fully written: save or download it again";

struct LoadEntry {
  std::string name;
  const Dtype* dtype;
  std::vector<uint64_t> shape;
  uint64_t begin;
  uint64_t end;
};

void read_at(int fd, void* data, uint64_t size, uint64_t offset, const std::string& path) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t got =
        ::pread(fd, bytes, std::min<uint64_t>(size, 1ULL << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      fail_load(path, "reading failed (" + errno_text(error) + ")",
                "check that the file is readable and the disk healthy");
    }
    if (got == 0) {
      fail_load(path, "the file ended early while reading it",
                "it shrank while being read; make sure nothing else writes it, then retry");
    }
    bytes += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

std::vector<uint64_t> read_unsigned_list(const std::string& path, const std::string& tensor,
                                         const Json& entry, const char* key) {
  const auto found = entry.find(key);
  if (found == entry.end()) {
    fail_load(path, "tensor \"" + tensor + "\" has no \"" + key + "\" in the header", kResave);
  }
  std::vector<uint64_t> values;
  bool valid = found->is_array();
  if (valid) {
    for (const auto& value : *found) {
      if (!value.is_number_unsigned()) {
        valid = false;
        break;
      }
      values.push_back(value.get<uint64_t>());
    }
  }
  if (!valid) {
    fail_load(path,
              "tensor \"" + tensor + "\": \"" + key + "\" must be a list of non-negative " +
                  "integers, not " + found->dump(),
              kResave);
  }
  return values;
}

LoadEntry parse_entry(const std::string& path, const std::string& name, const Json& entry) {
  if (!entry.is_object()) {
    fail_load(path,
              "the header entry of tensor \"" + name + "\" is " + entry.dump() +
                  ", not an object with dtype, shape and data_offsets",
              kResave);
  }
  LoadEntry parsed{name, nullptr, {}, 0, 0};
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    fail_load(path, "tensor \"" + name + "\" has no dtype string in the header", kResave);
  }
  parsed.dtype = find_dtype(dtype->get<std::string>());
  if (parsed.dtype == nullptr) {
    fail_load(path,
              "tensor \"" + name + "\" has dtype " + dtype->get<std::string>() +
                  ", which pipetrain does not read (it reads " + dtype_names() + ")",
              "convert that tensor to one of these dtypes before saving the file");
  }
  parsed.shape = read_unsigned_list(path, name, entry, "shape");
  const auto offsets = read_unsigned_list(path, name, entry, "data_offsets");
  if (offsets.size() != 2) {
    fail_load(path,
              "tensor \"" + name + "\": data_offsets must be [begin, end], not " +
                  entry["data_offsets"].dump(),
              kResave);
  }
  parsed.begin = offsets[0];
  parsed.end = offsets[1];
  if (parsed.end < parsed.begin) {
    fail_load(path,
              "tensor \"" + name + "\": data_offsets " + range_text(parsed.begin, parsed.end) +
                  " end before they begin",
              kResave);
  }
  // Element count and byte size, refusing any overflow (the reference's ValidationOverflow).
  uint64_t nbytes = parsed.dtype->size;
  bool overflow = false;
  for (const uint64_t dim : parsed.shape) {
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    if (dim != 0 && nbytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
    nbytes *= dim;
  }
  if (overflow) {
    fail_load(path, "tensor \"" + name + "\": shape " + shape_text(parsed.shape) + " is too large",
              kResave);
  }
  if (nbytes != parsed.end - parsed.begin) {
    fail_load(path,
              "tensor \"" + name + "\": shape " + shape_text(parsed.shape) + " of dtype " +
                  parsed.dtype->name + " needs " + std::to_string(nbytes) +
                  " bytes but its data_offsets " + range_text(parsed.begin, parsed.end) + " span " +
                  std::to_string(parsed.end - parsed.begin),
              kResave);
  }
  return parsed;
}

// Parses the header, refusing a name that appears twice (a JSON object would keep only one).
Json parse_header(const std::string& path, const std::string& text) {
  std::string duplicate;
  std::set<std::string> seen;
  Json header;
  try {
    header = Json::parse(
        text,
        [&](int depth, Json::parse_event_t event, Json& parsed) {
          if (depth == 1 && event == Json::parse_event_t::key && duplicate.empty() &&
              !seen.insert(parsed.get<std::string>()).second) {
            duplicate = parsed.get<std::string>();
          }
          return true;
        },
        /*allow_exceptions=*/true);
  } catch (const Json::exception& e) {
    std::string reason = e.what();
    const auto bracket = reason.find("] ");
    if (reason.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) {
      reason = reason.substr(bracket + 2);
    }
    fail_load(path, "the header is not valid JSON (" + reason + ")",
              "the file is corrupt or not a safetensors file: save or download it again");
  }
  if (!header.is_object()) {
    fail_load(path, std::string("the header is a JSON ") + header.type_name() + ", not an object",
              "the file is corrupt or not a safetensors file: save or download it again");
  }
  if (!duplicate.empty()) {
    fail_load(path, "the header names \"" + duplicate + "\" twice", kResave);
  }
  return header;
}

}  // namespace

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SaveEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& item : tensors) {
    const std::string& name = item.first;  // a plain name: lambdas capture no structured bindings
    const at::Tensor& tensor = item.second;
    const auto problem = [&](const std::string& what) {
      return std::invalid_argument("save_safetensors: " + path + ": tensor \"" + name + "\" " +
                                   what);
    };
    if (name == kMetadataKey) throw problem("has the name reserved for the metadata; rename it");
    if (!tensor.defined()) throw problem("is undefined; give it a value or leave it out");
    if (tensor.layout() != at::kStrided) throw problem("is not dense; call to_dense() first");
    const Dtype* dtype = find_dtype(tensor.scalar_type());
    if (dtype == nullptr) {
      throw problem(std::string("has dtype ") + c10::toString(tensor.scalar_type()) +
                    ", which safetensors files from pipetrain cannot hold (supported: " +
                    dtype_names() + "); convert it first");
    }
    entries.push_back({&name, &tensor, dtype, static_cast<uint64_t>(tensor.numel()) * dtype->size});
  }
  // Widest alignment first, then by name (already sorted: the sort is stable).
  std::stable_sort(entries.begin(), entries.end(), [](const SaveEntry& a, const SaveEntry& b) {
    return a.dtype->rank > b.dtype->rank;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& entry : entries) {
    std::vector<uint64_t> shape(entry.tensor->sizes().begin(), entry.tensor->sizes().end());
    header[*entry.name] = {{"dtype", entry.dtype->name},
                           {"shape", shape},
                           {"data_offsets", {offset, offset + entry.nbytes}}};
    offset += entry.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument("save_safetensors: " + path +
                                ": a tensor name or metadata string is not valid UTF-8; "
                                "safetensors headers are JSON, which needs UTF-8 text");
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t header_size = text.size();

  AtomicFile file(path);
  file.write(&header_size, sizeof(header_size));
  file.write(text);
  for (const auto& entry : entries) {
    if (entry.nbytes == 0) continue;
    // One tensor at a time: a model on the GPU never needs a second full copy in host memory.
    const at::Tensor cpu = entry.tensor->detach().to(at::kCPU).contiguous();
    file.write(cpu.data_ptr(), entry.nbytes);
  }
  file.commit();
}

namespace {

// A file whose header has been read and checked as the reference reader checks it, open for reading
// the tensors it lists.
struct ValidatedFile {
  Fd file;
  std::map<std::string, std::string> metadata;
  std::vector<LoadEntry> entries;  // in offset order
  uint64_t data_start = 0;
};

void open_validated(const std::string& path, ValidatedFile& opened) {
  Fd& file = opened.file;
  file.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) {
    const int error = errno;
    fail_load(path, "cannot open it (" + errno_text(error) + ")",
              error == ENOENT ? "check the path (relative paths start at the working directory)"
                              : "check the path and its permissions");
  }
  struct stat info {};
  if (::fstat(file.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
    fail_load(path, "it is not a regular file", "pass the path of a .safetensors file");
  }
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);
  if (file_size < 8) {
    fail_load(path,
              "the file is " + std::to_string(file_size) +
                  " bytes, shorter than the 8-byte header length every safetensors file starts "
                  "with",
              "it is empty or truncated: save or download it again");
  }
  uint64_t header_size = 0;
  read_at(file.get(), &header_size, sizeof(header_size), 0, path);
  if (header_size > file_size - 8) {
    fail_load(path,
              "the header length " + std::to_string(header_size) +
                  " (first 8 bytes) is larger than the rest of the file (" +
                  std::to_string(file_size - 8) + " bytes)",
              "the file is truncated or not a safetensors file: save or download it again");
  }
  if (header_size > kMaxHeaderSize) {
    fail_load(path,
              "the header length " + std::to_string(header_size) + " exceeds the limit of " +
                  std::to_string(kMaxHeaderSize) + " bytes that safetensors readers accept",
              "the file is corrupt or not a safetensors file: save or download it again");
  }
  std::string text(header_size, '\0');
  read_at(file.get(), text.data(), header_size, 8, path);
  const Json header = parse_header(path, text);

  std::map<std::string, std::string>& found_metadata = opened.metadata;
  std::vector<LoadEntry>& entries = opened.entries;
  for (const auto& [key, value] : header.items()) {
    if (key != kMetadataKey) {
      entries.push_back(parse_entry(path, key, value));
      continue;
    }
    if (!value.is_object()) {
      fail_load(path, "__metadata__ is " + value.dump() + ", not an object of strings", kResave);
    }
    for (const auto& [name, text_value] : value.items()) {
      if (!text_value.is_string()) {
        fail_load(path,
                  "__metadata__ maps strings to strings only, but \"" + name + "\" holds " +
                      text_value.dump(),
                  "store the value as a string (e.g. JSON-encode it) and save again");
      }
      found_metadata[name] = text_value.get<std::string>();
    }
  }

  // Tensors must tile the data buffer exactly: in offset order, each starts where the last ended.
  const uint64_t data_start = opened.data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  std::sort(entries.begin(), entries.end(), [](const LoadEntry& a, const LoadEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const LoadEntry* previous = nullptr;
  for (const auto& entry : entries) {
    if (entry.end > data_size) {
      fail_load(path,
                "tensor \"" + entry.name + "\": data_offsets " +
                    range_text(entry.begin, entry.end) +
                    " run past the end of the data buffer, which holds " +
                    std::to_string(data_size) + " bytes",
                "the file is truncated (or its header is wrong): save or download it again");
    }
    if (entry.begin < covered) {
      fail_load(path,
                "the data of tensors \"" + previous->name + "\" " +
                    range_text(previous->begin, previous->end) + " and \"" + entry.name + "\" " +
                    range_text(entry.begin, entry.end) + " overlap",
                kResave);
    }
    if (entry.begin > covered) {
      fail_load(path,
                "bytes " + range_text(covered, entry.begin) +
                    " of the data buffer before tensor \"" + entry.name +
                    "\" belong to no tensor: the data is not contiguous",
                kResave);
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_size) {
    fail_load(path,
              "the tensors cover " + std::to_string(covered) + " bytes but the data buffer holds " +
                  std::to_string(data_size) + " (buffer size mismatch)",
              "the file has trailing bytes or its header is wrong: save or download it again");
  }
}

at::Tensor read_entry(const ValidatedFile& opened, const LoadEntry& entry,
                      const std::string& path) {
  std::vector<int64_t> shape(entry.shape.begin(), entry.shape.end());
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(entry.dtype->type));
  const uint64_t nbytes = entry.end - entry.begin;
  if (nbytes > 0) {
    read_at(opened.file.get(), tensor.data_ptr(), nbytes, opened.data_start + entry.begin, path);
  }
  if (entry.dtype->type == at::kBool) {
    const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
    if (std::any_of(bytes, bytes + nbytes, [](uint8_t b) { return b > 1; })) {
      fail_load(path, "BOOL tensor \"" + entry.name + "\" holds bytes other than 0 and 1", kResave);
    }
  }
  return tensor;
}

}  // namespace

TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  ValidatedFile opened;
  open_validated(path, opened);
  TensorMap tensors;
  for (const auto& entry : opened.entries)
    tensors.emplace(entry.name, read_entry(opened, entry, path));
  if (metadata != nullptr) *metadata = std::move(opened.metadata);
  return tensors;
}

TensorMap load_safetensors(const std::string& path, const std::set<std::string>& names) {
  ValidatedFile opened;
  open_validated(path, opened);
  TensorMap tensors;
  for (const auto& entry : opened.entries) {
    if (names.count(entry.name)) tensors.emplace(entry.name, read_entry(opened, entry, path));
  }
  for (const auto& name : names) {
    if (tensors.count(name) == 0) {
      fail_load(path, "it holds no tensor \"" + name + "\"",
                "the file is not the one its index or checkpoint names: save it again");
    }
  }
  return tensors;
}

std::map<std::string, SafetensorsEntry> read_safetensors_header(const std::string& path) {
  ValidatedFile opened;
  open_validated(path, opened);
  std::map<std::string, SafetensorsEntry> listed;
  for (const auto& entry : opened.entries) {
    listed[entry.name] = SafetensorsEntry{
        entry.dtype->type, std::vector<int64_t>(entry.shape.begin(), entry.shape.end()),
        static_cast<int64_t>(entry.end - entry.begin)};
  }
  return listed;
}

}  // namespace pipetrain
