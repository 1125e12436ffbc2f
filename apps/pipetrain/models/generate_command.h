// `pipetrain generate`: text from a GPT-2, Llama or Qwen3 Hugging Face folder (one pipetrain
// exported, or the Hub's) or a checkpoint of fit's, its prompts through the folder's tokenizer and,
// with --chat, its chat template as a user turn; tokens made with nn::generate's key/value cache,
// greedy or sampled, until the EOS of generation_config.json or --max-new-tokens.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace pipetrain {
class Tokenizer;
}

namespace pipetrain::cli {

struct GenerateRequest {
  // The model: a Hugging Face folder (config.json, weights, tokenizer), or a checkpoint of fit's
  // (a .ckpt folder, last or best under default_root_dir), its shape the config.json fit keeps in
  // its run's folder.
  std::string init_from;
  std::string ckpt_path;
  std::string default_root_dir;
  std::string tokenizer;  // a tokenizer.json or its folder; empty: init_from's
  std::vector<std::string> prompts;
  // A file of prompts: one a line, or JSONL lines {"prompt": ...}; "-": standard input.
  std::string prompts_file;
  // Prompts as token ids ("128000,791,4062"), no tokenizer read: each prompt's new ids are
  // printed, comma-separated, a line each (for comparing with another implementation's ids).
  std::vector<std::string> prompt_ids;
  bool chat = false;  // each prompt a user turn of the chat template, the assistant's to come
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string accelerator = "auto";  // cpu, cuda, auto
  // "pipe": the model's layers spread over `devices` processes (launched here, or by torchrun or
  // SLURM), each building and reading only its own, so that a model too big for one device
  // generates.
  std::string strategy = "single";
  int64_t devices = 1;
  // pipe: layers per process ({} : the blocks spread evenly, the embedding with the first, the
  // final norm and head with the last).
  std::vector<int64_t> balance;
  std::string dtype;  // bf16 or fp32; empty: bf16 on a GPU, fp32 on the CPU
};

// The prompts of a file (`flag`'s, for messages): a JSONL line's "prompt", any other non-empty
// line as it is; "-" reads standard input. Throws std::invalid_argument naming the file (and
// line) that cannot be read or has a JSON line without a string "prompt".
std::vector<std::string> read_prompts_file(const std::string& path, const std::string& flag);

// The text of generated `ids` (special tokens skipped). A model's vocabulary may have more rows
// than its tokenizer has ids (Qwen3: 151936 and 151669) and a young model may choose one: ids
// the tokenizer lacks are left out, as Hugging Face's decode leaves them out.
std::string decode_generated(const Tokenizer& tokenizer, const std::vector<int64_t>& ids);

// nn::GenerationOptions::vocab_limit for `model` (nn::generate's) and `tokenizer`: the tokenizer's
// ids alone, where the model's head has more rows (GPT-2's 50304 for 50257 tokens, Qwen3's 151936
// for 151669), so a young model never makes an id that decodes to nothing; else 0 (every id).
int64_t tokenizer_vocab_limit(const torch::nn::Sequential& model, const Tokenizer& tokenizer);

// Writes to `out` each prompt's text and what the model makes after it (one prompt's as it is
// made; several, each when the batch ends, separated by lines of dashes; under --strategy pipe
// rank 0 writes). Throws
// std::invalid_argument for a folder of another model, no prompts, an empty prompt (naming it) or
// options nn::generate refuses.
// Returns the exit status: 0, or under --strategy pipe in the process that launched the others,
// theirs.
int generate_text(const GenerateRequest& request, std::ostream& out);

}  // namespace pipetrain::cli
