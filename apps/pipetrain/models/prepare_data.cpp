#include "models/prepare_data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <pipetrain/token_dataset.h>
#include <pipetrain/tokenizer.h>

#include "models/documents.h"
#include "models/loss_masked_examples.h"
#include "models/prepare_progress.h"
#include "models/shard_writer.h"
#include "models/tokenizer_info.h"

namespace pipetrain::cli {

namespace {

namespace fs = std::filesystem;

void create_folder(const std::string& output) {
  std::error_code error;
  fs::create_directories(output, error);
  if (error) {
    throw std::runtime_error("--output " + output +
                             ": cannot create the directory: " + error.message());
  }
}

// Byte tokens of one file: train.bin and val.bin.
std::string prepare_bytes(const PrepareDataOptions& options) {
  if (options.file_format != "nanogpt" && options.file_format != "llmc") {
    throw std::invalid_argument("--file-format " + options.file_format + ": use nanogpt or llmc");
  }
  if (options.token_dtype != "uint16" && options.token_dtype != "uint32") {
    throw std::invalid_argument("--token-dtype " + options.token_dtype + ": use uint16 or uint32");
  }
  const bool wide = options.token_dtype == "uint32";
  if (wide && options.file_format != "llmc") {
    throw std::invalid_argument(
        "--token-dtype uint32 needs --file-format llmc: llm.c's Llama 3 header says the tokens "
        "are 32-bit, which a raw file (nanoGPT's, uint16) cannot");
  }
  if (options.inputs.size() != 1 || fs::is_directory(options.inputs[0])) {
    throw std::invalid_argument(
        "byte tokens are made from one text file (--input FILE): for several inputs, a folder or "
        "standard input, tokenize with --tokenizer");
  }
  const std::string& input = options.inputs[0];
  std::ifstream in(input, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("--input " + input +
                                ": cannot read the file: " + std::strerror(errno));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty()) throw std::invalid_argument("--input " + input + " is empty");

  const size_t train_tokens =
      text.size() - static_cast<size_t>(static_cast<double>(text.size()) * options.val_fraction);
  std::vector<uint32_t> train, val;
  for (size_t i = 0; i < text.size(); ++i) {
    (i < train_tokens ? train : val).push_back(static_cast<unsigned char>(text[i]));
  }
  create_folder(options.output);
  const auto format =
      options.file_format == "llmc" ? TokenFileFormat::kLlmc : TokenFileFormat::kNanoGpt;
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
    std::error_code error;
    std::filesystem::remove(val_path, error);
    return "wrote " + std::to_string(train.size()) + " tokens to " + train_path +
           " and no val.bin (--val-fraction " + std::to_string(options.val_fraction) + ")" + usage;
  }
  write(val_path, val);
  return "wrote " + std::to_string(train.size()) + " tokens to " + train_path + " and " +
         std::to_string(val.size()) + " to " + val_path + usage;
}

// Documents are encoded a batch at a time, spread over the threads; a batch ends at whichever of
// these comes first, so that it has work for every core and still fits in memory.
constexpr size_t kBatchDocuments = 4096;
constexpr size_t kBatchBytes = size_t{16} << 20;

// Whether document `index` is a validation one: every 1/f-th, as the documents stream by.
bool is_validation(int64_t index, double fraction) {
  const auto i = static_cast<double>(index);
  return std::floor((i + 1) * fraction) > std::floor(i * fraction);
}

// The output folder's own name ("data/tinystories/" -> "tinystories").
std::string folder_name(const std::string& output) {
  fs::path path = fs::absolute(output).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

// "1 document", "2 documents".
std::string count_of(size_t count, const std::string& what) {
  return std::to_string(count) + " " + what + (count == 1 ? "" : "s");
}

std::string shard_count(const ShardWriter& shards, const std::string& split) {
  return count_of(shards.shards().size(), split + " shard") + " (" +
         count_of(static_cast<size_t>(shards.tokens()), "token") + ")";
}

// Documents through `tokenizer` into llm.c shards.
std::string prepare_tokens(const PrepareDataOptions& options) {
  if (options.threads < 0) {
    throw std::invalid_argument("--threads " + std::to_string(options.threads) +
                                ": give a number of threads, or 0 for every core");
  }
  const Tokenizer tokenizer = Tokenizer::from_file(options.tokenizer);
  const std::optional<int64_t> eos = tokenizer.eos_token_id();
  if (!eos) {
    throw std::invalid_argument(
        "--tokenizer " + options.tokenizer + ": " + tokenizer.path() +
        " names no EOS token (tokenizer_config.json's eos_token), which ends every document: "
        "give a tokenizer folder with its tokenizer_config.json");
  }
  // Examples of fine-tuning, a JSONL line each, whose tokens carry loss only in part.
  const bool masked = is_loss_masked_format(options.format);
  if (options.format == "chat" && tokenizer.chat_template().empty()) {
    throw std::invalid_argument(
        "--tokenizer " + options.tokenizer + ": " + tokenizer.path() +
        " has no chat template (tokenizer_config.json's chat_template), which --format chat "
        "renders conversations with: give a chat model's tokenizer folder, or write the examples "
        "as --format prompt-completion");
  }
  DocumentReader reader(options.inputs, masked ? "jsonl" : options.format,
                        masked ? "" : options.text_field);
  create_folder(options.output);
  const std::string name = options.name.empty() ? folder_name(options.output) : options.name;
  const bool wide = tokenizer.vocab_size() > 65536;
  ShardWriter train(options.output, name, "train", options.shard_size, wide, masked);
  ShardWriter val(options.output, name, "val", options.shard_size, wide, masked);
  TokenizerInfo info;

  PrepareProgress progress(reader.total_bytes());
  // A batch of documents, and where each came from.
  struct Documents {
    std::vector<std::string> texts, sources;
  };
  const auto read_batch = [&reader] {
    Documents batch;
    size_t bytes = 0;
    std::string text;
    while (batch.texts.size() < kBatchDocuments && bytes < kBatchBytes && reader.next(text)) {
      bytes += text.size();
      batch.texts.push_back(std::move(text));
      batch.sources.push_back(reader.where());
    }
    return batch;
  };
  const auto threads = static_cast<int>(options.threads);
  // Each example's ids and mask, its lines spread over the threads as encode_batch spreads texts.
  const auto encode_examples = [&](const Documents& batch) {
    const size_t parts = std::max<size_t>(
        1, threads > 0 ? static_cast<size_t>(threads) : std::thread::hardware_concurrency());
    std::vector<LossMaskedIds> examples(batch.texts.size());
    std::vector<std::future<void>> running;
    for (size_t part = 0; part < parts; ++part) {
      running.push_back(std::async(std::launch::async, [&, part] {
        for (size_t i = part; i < examples.size(); i += parts) {
          examples[i] =
              encode_loss_masked(tokenizer, options.format, batch.texts[i], batch.sources[i], *eos);
        }
      }));
    }
    for (auto& part : running) part.get();  // the first part's error, if any
    return examples;
  };
  const auto encode_documents = [&tokenizer, threads](const Documents& batch) {
    try {
      return tokenizer.encode_batch(batch.texts, /*add_special_tokens=*/true, threads);
    } catch (const std::invalid_argument& e) {
      // Invalid UTF-8 (the tokenizer names the byte offset): name the document too.
      for (size_t i = 0; i < batch.texts.size(); ++i) {
        try {
          tokenizer.encode(batch.texts[i]);
        } catch (const std::invalid_argument& in_document) {
          throw std::invalid_argument(batch.sources[i] + ": " + in_document.what());
        }
      }
      throw;
    }
  };
  // Text documents end with the EOS; examples say their own ends.
  const auto encode = [&](const Documents& batch) {
    if (masked) return encode_examples(batch);
    std::vector<LossMaskedIds> documents;
    for (auto& ids : encode_documents(batch)) {
      ids.push_back(*eos);
      documents.push_back({std::move(ids), {}});
    }
    return documents;
  };
  int64_t documents = 0;
  for (Documents batch = read_batch(); !batch.texts.empty();) {
    auto encoding = std::async(std::launch::async,
                               [&encode, batch = std::move(batch)] { return encode(batch); });
    batch = read_batch();  // the next batch is read while this one is encoded
    for (const auto& document : encoding.get()) {
      const bool validation = is_validation(documents++, options.val_fraction);
      (validation ? val : train).append(document.ids, document.mask);
      SplitCounts& counts = validation ? info.val : info.train;
      ++counts.documents;
      // Document masking finds a document's end by its EOS: one that does not end with it (a
      // conversation whose template ends its turns otherwise), or holds it before (a template's end
      // of turn), would be read as part of its neighbour, or as several.
      const auto& ids = document.ids;
      if (ids.empty() || ids.back() != *eos ||
          std::find(ids.begin(), ids.end() - 1, *eos) != ids.end() - 1) {
        ++counts.documents_not_delimited_by_eos;
      }
    }
    progress.update(documents, reader.bytes_read(), train.tokens() + val.tokens());
  }
  progress.finish(documents, reader.bytes_read(), train.tokens() + val.tokens());
  if (documents == 0) throw std::invalid_argument("--input: the input holds no documents");
  train.finish();
  val.finish();

  info.tokenizer = fs::absolute(tokenizer.path()).string();
  info.vocab_size = tokenizer.vocab_size();
  info.bos_token_id = tokenizer.bos_token_id();
  info.eos_token_id = eos;
  info.dtype = wide ? "uint32" : "uint16";
  info.shard_size = options.shard_size;
  for (auto [split, shards] : {std::pair{&info.train, &train}, std::pair{&info.val, &val}}) {
    split->tokens = shards->tokens();
    split->shards = shards->shards();
  }
  write_tokenizer_info(options.output, info);
  return "wrote " + count_of(static_cast<size_t>(documents), "document") + " as " +
         shard_count(train, "train") + " and " + shard_count(val, "val") + " of " + info.dtype +
         " tokens to " + options.output + ", named " + name + "_<split>_<number>.bin" +
         (masked ? " with a loss mask each (.mask: 1 for the tokens that carry loss)" : "") +
         ", and " + kTokenizerInfoFile + " (train with --train-data " + options.output +
         " and a model of vocabulary " + std::to_string(info.vocab_size) + " or more)";
}

}  // namespace

std::string prepare_data(const PrepareDataOptions& options) {
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    throw std::invalid_argument("--val-fraction " + std::to_string(options.val_fraction) +
                                " must be in [0, 1)");
  }
  if (options.format == "nanogpt" || options.format == "llmc") {
    throw std::invalid_argument("--format " + options.format + " is now --file-format " +
                                options.format +
                                " (--format names the input's format: text, jsonl, chat or "
                                "prompt-completion)");
  }
  if (options.tokenizer.empty()) {
    if (!options.format.empty()) {
      throw std::invalid_argument("--format " + options.format +
                                  " reads documents for a tokenizer: pass --tokenizer");
    }
    return prepare_bytes(options);
  }
  return prepare_tokens(options);
}

}  // namespace pipetrain::cli
