// `pipetrain prepare-data`: any text as token files the language models train from, with byte-level
// tokens (every byte its own id, vocabulary 256), as nanoGPT's shakespeare_char prepare.py does
// with characters: the first part of the text becomes train.bin, the rest val.bin.
#pragma once

#include <string>

namespace pipetrain::cli {

struct PrepareDataOptions {
  std::string input;               // a file of any bytes
  std::string output;              // a directory, created if missing
  double val_fraction = 0.1;       // share of the text, from its end, that goes to val.bin
  std::string format = "nanogpt";  // nanogpt (raw tokens) or llmc (llm.c's 1024-byte header)
  // uint16, or uint32 in llm.c's Llama 3 shard (format llmc), as the reader tells them apart: a
  // raw file cannot say its width, and nanoGPT's are uint16.
  std::string token_dtype = "uint16";
};

// Writes `output`/train.bin and `output`/val.bin; returns a line saying what it wrote. Throws
// std::invalid_argument for an unreadable or empty input, a val_fraction outside [0, 1), an
// unknown format or token_dtype, or uint32 without format llmc, and std::runtime_error when a
// file cannot be written.
std::string prepare_data(const PrepareDataOptions& options);

}  // namespace pipetrain::cli
