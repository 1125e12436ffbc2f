#include "models/prepare_data.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include <pipetrain/token_dataset.h>

namespace pipetrain::cli {

std::string prepare_data(const PrepareDataOptions& options) {
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    throw std::invalid_argument("--val-fraction " + std::to_string(options.val_fraction) +
                                " must be in [0, 1)");
  }
  if (options.format != "nanogpt" && options.format != "llmc") {
    throw std::invalid_argument("--format " + options.format + ": use nanogpt or llmc");
  }
  if (options.token_dtype != "uint16" && options.token_dtype != "uint32") {
    throw std::invalid_argument("--token-dtype " + options.token_dtype + ": use uint16 or uint32");
  }
  const bool wide = options.token_dtype == "uint32";
  if (wide && options.format != "llmc") {
    throw std::invalid_argument(
        "--token-dtype uint32 needs --format llmc: llm.c's Llama 3 header says the tokens are "
        "32-bit, which a raw file (nanoGPT's, uint16) cannot");
  }
  std::ifstream in(options.input, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("--input " + options.input +
                                ": cannot read the file: " + std::strerror(errno));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty()) throw std::invalid_argument("--input " + options.input + " is empty");

  const size_t train_tokens =
      text.size() - static_cast<size_t>(static_cast<double>(text.size()) * options.val_fraction);
  std::vector<uint32_t> train, val;
  for (size_t i = 0; i < text.size(); ++i) {
    (i < train_tokens ? train : val).push_back(static_cast<unsigned char>(text[i]));
  }
  std::error_code error;
  std::filesystem::create_directories(options.output, error);
  if (error) {
    throw std::runtime_error("--output " + options.output +
                             ": cannot create the directory: " + error.message());
  }
  const auto format = options.format == "llmc" ? TokenFileFormat::kLlmc : TokenFileFormat::kNanoGpt;
  const auto train_path = (std::filesystem::path(options.output) / "train.bin").string();
  const auto val_path = (std::filesystem::path(options.output) / "val.bin").string();
  // Byte tokens fit either width.
  const auto write = [&](const std::string& path, const std::vector<uint32_t>& tokens) {
    if (wide) {
      write_token_file(path, tokens, format);
    } else {
      write_token_file(path, std::vector<uint16_t>(tokens.begin(), tokens.end()), format);
    }
  };
  write(train_path, train);
  const std::string usage =
      " (byte tokens: train with --model gpt --train-data " + train_path + ")";
  if (val.empty()) {
    // fit reads a val.bin beside train.bin: an empty one would stop it, an earlier one would
    // validate on another text.
    std::filesystem::remove(val_path, error);
    return "wrote " + std::to_string(train.size()) + " tokens to " + train_path +
           " and no val.bin (--val-fraction " + std::to_string(options.val_fraction) + ")" + usage;
  }
  write(val_path, val);
  return "wrote " + std::to_string(train.size()) + " tokens to " + train_path + " and " +
         std::to_string(val.size()) + " to " + val_path + usage;
}

}  // namespace pipetrain::cli
