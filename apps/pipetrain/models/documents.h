// The documents `pipetrain prepare-data --tokenizer` tokenizes, read one at a time in input order
// from text files (one document each), JSONL files (one document a line, a string field of each
// line's object) and folders of them (their files in sorted order), or standard input. Read as a
// stream, so that an input larger than memory can be tokenized.
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain::cli {

class DocumentReader {
 public:
  // `inputs`: files, folders (their regular files not starting with '.', sorted; not their
  // subfolders) or "-" (standard input). `format`: "text", "jsonl", or "" to tell by the file's
  // extension (.jsonl is JSONL, anything else text; standard input is text). `text_field`: the
  // field of a JSONL line's object that holds the document; empty: the line itself is the
  // document, for the caller to parse. Throws std::invalid_argument naming an
  // input that does not exist, an empty folder, or an unknown format.
  DocumentReader(const std::vector<std::string>& inputs, const std::string& format,
                 std::string text_field);

  // The next document into `document`; false after the last. Throws std::invalid_argument naming
  // the file and line of a JSONL line that is not a JSON object with a string `text_field` (blank
  // lines are skipped), and of a file that cannot be read.
  bool next(std::string& document);

  // Where the last document came from, for messages: its file, and for JSONL its line
  // ("docs.jsonl:12").
  std::string where() const;
  // Bytes of the inputs read so far.
  uint64_t bytes_read() const { return bytes_read_; }
  // Bytes of all inputs; unset when one is standard input.
  std::optional<uint64_t> total_bytes() const { return total_bytes_; }

 private:
  struct Source {
    std::string path;  // "-": standard input
    bool jsonl = false;
  };
  // Opens the next source; false when there is none.
  bool open_next();
  std::string name() const;  // of the open source, for messages

  std::vector<Source> sources_;
  size_t next_source_ = 0;
  std::string text_field_;
  std::unique_ptr<std::ifstream> file_;
  std::istream* in_ = nullptr;  // the open source, or nullptr
  bool jsonl_ = false;
  int64_t line_ = 0;
  uint64_t bytes_read_ = 0;
  std::optional<uint64_t> total_bytes_ = 0;
};

}  // namespace pipetrain::cli
