#include "models/documents.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <utility>

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;

bool has_jsonl_extension(const std::string& path) { return fs::path(path).extension() == ".jsonl"; }

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

DocumentReader::DocumentReader(const std::vector<std::string>& inputs, const std::string& format,
                               std::string text_field)
    : text_field_(std::move(text_field)) {
  if (!format.empty() && format != "text" && format != "jsonl") {
    throw std::invalid_argument("--format " + format +
                                ": use text (a file is a document), jsonl (a line is one), chat "
                                "(a line is a conversation) or prompt-completion");
  }
  const auto add = [&](const std::string& path) {
    const bool jsonl = format.empty() ? has_jsonl_extension(path) : format == "jsonl";
    sources_.push_back({path, jsonl});
  };
  for (const auto& input : inputs) {
    if (input == "-") {
      sources_.push_back({input, format == "jsonl"});
      total_bytes_.reset();  // a pipe's length is not known ahead
    } else if (fs::is_directory(input)) {
      std::vector<std::string> files;
      for (const auto& entry : fs::directory_iterator(input)) {
        const std::string name = entry.path().filename().string();
        if (entry.is_regular_file() && name.front() != '.') files.push_back(entry.path().string());
      }
      if (files.empty())
        throw std::invalid_argument("--input " + input + ": the folder has no files");
      std::sort(files.begin(), files.end());
      for (const auto& file : files) add(file);
    } else if (fs::is_regular_file(input)) {
      add(input);
    } else {
      throw std::invalid_argument("--input " + input + ": no such file or folder");
    }
  }
  for (const auto& source : sources_) {
    if (total_bytes_ && source.path != "-") *total_bytes_ += fs::file_size(source.path);
  }
}

std::string DocumentReader::name() const {
  const auto& path = sources_[next_source_ - 1].path;
  return path == "-" ? std::string("standard input") : path;
}

std::string DocumentReader::where() const {
  return jsonl_ ? name() + ":" + std::to_string(line_) : name();
}

bool DocumentReader::open_next() {
  file_.reset();
  in_ = nullptr;
  if (next_source_ == sources_.size()) return false;
  const Source& source = sources_[next_source_++];
  jsonl_ = source.jsonl;
  line_ = 0;
  if (source.path == "-") {
    in_ = &std::cin;
    return true;
  }
  file_ = std::make_unique<std::ifstream>(source.path, std::ios::binary);
  if (!*file_) {
    throw std::invalid_argument("--input " + source.path +
                                ": cannot read the file: " + std::strerror(errno));
  }
  in_ = file_.get();
  return true;
}

bool DocumentReader::next(std::string& document) {
  while (in_ != nullptr || open_next()) {
    if (!jsonl_) {
      // A text file is one document, read whole.
      document.clear();
      char chunk[1 << 16];
      while (in_->read(chunk, sizeof(chunk)) || in_->gcount() > 0) {
        document.append(chunk, static_cast<size_t>(in_->gcount()));
      }
      if (in_->bad())
        throw std::invalid_argument(name() + ": cannot read: " + std::strerror(errno));
      bytes_read_ += document.size();
      in_ = nullptr;
      return true;
    }
    std::string line;
    while (std::getline(*in_, line)) {
      ++line_;
      bytes_read_ += line.size() + 1;
      if (is_blank(line)) continue;
      if (text_field_.empty()) {
        document = std::move(line);
        return true;
      }
      const std::string where = this->where() + ": ";
      nlohmann::json object;
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        throw std::invalid_argument(where + "not a line of JSON (" + e.what() + ")");
      }
      const auto field = object.is_object() ? object.find(text_field_) : object.end();
      if (!object.is_object() || field == object.end() || !field->is_string()) {
        throw std::invalid_argument(
            where + "no string field \"" + text_field_ + "\" in " +
            (object.is_object() ? "the line's object" : "the line, which is not a JSON object") +
            " (--text-field names the field that holds the text)");
      }
      document = field->get<std::string>();
      return true;
    }
    if (in_->bad()) throw std::invalid_argument(name() + ": cannot read: " + std::strerror(errno));
    in_ = nullptr;
  }
  return false;
}

}  // namespace pipetrain::cli
