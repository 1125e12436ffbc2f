#include "pipetrain/token_shards.h"

#include <glob.h>

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <utility>

#include "pipetrain/loss_mask.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

bool is_pattern(const std::string& source) {
  return source.find_first_of("*?[") != std::string::npos;
}

// The paths `pattern` matches, sorted byte by byte (glob's own order follows the locale).
std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t found{};
  const int status = glob(pattern.c_str(), GLOB_NOSORT, nullptr, &found);
  std::vector<std::string> paths(found.gl_pathv,
                                 found.gl_pathv + (status == 0 ? found.gl_pathc : 0));
  globfree(&found);
  if (status != 0 && status != GLOB_NOMATCH) {
    throw std::invalid_argument("token files " + pattern + ": the pattern cannot be read (glob " +
                                "error " + std::to_string(status) + ")");
  }
  paths.erase(std::remove_if(paths.begin(), paths.end(),
                             [](const std::string& path) { return fs::is_directory(path); }),
              paths.end());
  std::sort(paths.begin(), paths.end());
  return paths;
}

// llm.c's shard names: `<dataset>_<split>_<number>.bin`.
bool is_shard_of(const std::string& name, const std::string& split) {
  const std::string extension = ".bin";
  return name.size() > extension.size() &&
         name.compare(name.size() - extension.size(), extension.size(), extension) == 0 &&
         name.find("_" + split + "_") != std::string::npos;
}

}  // namespace

std::vector<std::string> find_token_files(const std::string& source, const std::string& split) {
  if (!fs::exists(source) && is_pattern(source)) {
    auto paths = glob_paths(source);
    if (paths.empty()) {
      throw std::invalid_argument("token files " + source +
                                  ": no file matches the pattern (quote it, so that the shell "
                                  "leaves it to pipetrain)");
    }
    return paths;
  }
  if (!fs::is_directory(source)) return {source};
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(source)) {
    if (entry.is_regular_file() && is_shard_of(entry.path().filename().string(), split)) {
      paths.push_back(entry.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty() && fs::is_regular_file(fs::path(source) / (split + ".bin"))) {
    paths.push_back((fs::path(source) / (split + ".bin")).string());
  }
  if (paths.empty()) {
    throw std::invalid_argument(
        "token folder " + source + " holds no " + split + " shards (*_" + split +
        "_*.bin, as prepare-data --tokenizer and llm.c name them) and no " + split + ".bin");
  }
  return paths;
}

TokenShards::TokenShards(const std::vector<std::string>& paths, int64_t block_size,
                         int64_t vocab_size, std::optional<TokenDtype> dtype) {
  if (paths.empty()) throw std::invalid_argument("TokenShards needs at least one token file");
  first_window_.push_back(0);
  for (const auto& path : paths) {
    auto file = std::make_shared<const TokenDataset>(path, block_size, vocab_size, dtype);
    if (!files_.empty() && file->dtype() != files_.front()->dtype()) {
      const auto width = [](TokenDtype d) { return d == TokenDtype::kUint32 ? "32" : "16"; };
      throw std::invalid_argument(
          "token file " + path + " holds " + width(file->dtype()) + "-bit tokens and " + paths[0] +
          " " + width(files_.front()->dtype()) +
          "-bit ones: the files of one dataset come from one tokenizer, written at one width");
    }
    if (!files_.empty() && file->masked() != files_.front()->masked()) {
      const auto& masked = file->masked() ? path : paths[0];
      const auto& unmasked = file->masked() ? paths[0] : path;
      throw std::invalid_argument("token file " + masked + " has a loss mask beside it (" +
                                  loss_mask_path(masked) + ") and " + unmasked +
                                  " has none: the files of one dataset are all masked or none is");
    }
    first_window_.push_back(first_window_.back() + file->size());
    files_.push_back(std::move(file));
  }
}

int64_t TokenShards::size() const { return first_window_.back(); }

int64_t TokenShards::num_tokens() const {
  int64_t tokens = 0;
  for (const auto& file : files_) tokens += file->num_tokens();
  return tokens;
}

Batch TokenShards::get_batch(const std::vector<int64_t>& indices,
                             const FieldsWanted& wanted) const {
  // The rows each file holds, and where in the batch they go: one read per file.
  struct Rows {
    std::vector<int64_t> windows;  // in the file
    std::vector<int64_t> rows;     // in the batch
  };
  std::map<size_t, Rows> by_file;
  for (size_t row = 0; row < indices.size(); ++row) {
    const int64_t index = indices[row];
    if (index < 0 || index >= size()) {
      throw std::out_of_range("window " + std::to_string(index) + " is outside the " +
                              std::to_string(files_.size()) + " token files (" +
                              std::to_string(size()) + " windows)");
    }
    const auto file =
        static_cast<size_t>(std::upper_bound(first_window_.begin(), first_window_.end(), index) -
                            first_window_.begin() - 1);
    by_file[file].windows.push_back(index - first_window_[file]);
    by_file[file].rows.push_back(static_cast<int64_t>(row));
  }
  if (by_file.size() == 1)
    return files_[by_file.begin()->first]->get_batch(
        by_file.begin()->second.windows, wanted);  // rows in order: the file's batch is the batch
  const auto rows = static_cast<int64_t>(indices.size());
  const int64_t block_size = files_.front()->block_size();
  Batch batch;
  if (wanted.data) batch.data = torch::empty({rows, block_size}, torch::kInt64);
  if (wanted.target) batch.target = torch::empty({rows, block_size}, torch::kInt64);
  for (const auto& [file, part] : by_file) {
    const Batch read = files_[file]->get_batch(part.windows, wanted);
    const auto at = torch::tensor(part.rows, torch::kInt64);
    if (wanted.data) batch.data.index_copy_(0, at, read.data);
    if (wanted.target) batch.target.index_copy_(0, at, read.target);
  }
  return batch;
}

}  // namespace pipetrain
