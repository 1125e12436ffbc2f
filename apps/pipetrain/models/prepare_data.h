// `pipetrain prepare-data`: text as token files the language models train from.
// - With --tokenizer (a Hugging Face tokenizer.json, or a Hub folder holding one): documents from
//   text files, JSONL files, folders of them or standard input, each encoded as the tokenizer's
//   post-processor says (a BOS where it adds one) and followed by the tokenizer's EOS, written in
//   input order as llm.c's shards (shard_writer.h) of a train and a val split, with
//   tokenizer_info.json beside them (tokenizer_info.h). Document i goes to val when
//   floor((i + 1) f) > floor(i f) for the val fraction f: every 1/f-th document, decided as the
//   documents stream by.
// - With --format chat or prompt-completion: examples of fine-tuning, a JSONL line each
//   (loss_masked_examples.h says how each becomes ids), written as above with a loss mask beside
//   each shard (pipetrain/loss_mask.h) saying which tokens carry loss; no EOS is added to a
//   conversation (its template ends every turn). Example i goes to val as document i does.
// - Without: byte-level tokens (every byte its own id, vocabulary 256), as nanoGPT's
//   shakespeare_char prepare.py does with characters: the first part of one text becomes
//   train.bin, the rest val.bin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::cli {

struct PrepareDataOptions {
  std::vector<std::string> inputs;  // files, folders or "-"; byte level: one file
  std::string output;               // a directory, created if missing
  double val_fraction = 0.1;  // share of the documents (byte level: of the text, from its end)
  // With a tokenizer:
  std::string tokenizer;  // tokenizer.json or a folder holding one; empty: byte tokens
  // Of the input: text, jsonl, chat, prompt-completion, or empty (text or jsonl by extension).
  std::string format;
  std::string text_field = "text";   // a JSONL line's field that holds the document
  int64_t shard_size = 100'000'000;  // tokens a shard, as llm.c's fineweb.py
  std::string name;                  // shard names' first part; empty: the output folder's name
  int64_t threads = 0;               // encoding threads; 0: every core
  // Byte level:
  std::string file_format = "nanogpt";  // nanogpt (raw tokens) or llmc (llm.c's 1024-byte header)
  // uint16, or uint32 in llm.c's Llama 3 shard (file_format llmc), as the reader tells them apart:
  // a raw file cannot say its width, and nanoGPT's are uint16.
  std::string token_dtype = "uint16";
};

// Writes the token files; returns a line saying what it wrote. Throws std::invalid_argument for
// an input that cannot be read, is empty or holds a bad JSONL line (naming file and line, as
// encode_loss_masked's errors do), a tokenizer without a chat template for --format chat, a
// val_fraction outside [0, 1), an unknown format, a tokenizer that cannot be read or names no EOS,
// and (byte level) more than one input, an unknown file_format or token_dtype, or uint32 without
// file_format llmc; std::runtime_error when a file cannot be written.
std::string prepare_data(const PrepareDataOptions& options);

}  // namespace pipetrain::cli
