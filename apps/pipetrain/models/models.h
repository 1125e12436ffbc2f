// The built-in models the `pipetrain` command trains, each with the data it trains and validates
// on, so a newcomer sees a run work without writing code.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pipetrain/data.h>
#include <pipetrain/hub_model.h>
#include <pipetrain/language_model.h>
#include <pipetrain/module.h>
#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/gpt2.h>
#include <pipetrain/throughput_monitor.h>

#include "models/gpt.h"

namespace pipetrain::cli {

struct ModelOptions {
  std::string name = "mlp";
  double lr = 0.003;
  double dropout = 0.0;
  std::string corpus;  // gpt: a text file; empty: /usr/share/common-licenses
  // gpt: token files (nanoGPT's .bin or llm.c shards) instead of the corpus: a file, a folder of
  // shards or a glob (token_data.h). An empty val_data means the validation files beside
  // train_data where there are some, else no validation data.
  std::string train_data;
  std::string val_data;
  int64_t vocab_size = 0;  // 0: the model's (gpt on token files: 256, byte tokens)
  int64_t block_size = 0;  // 0: the model's default
  // A preset of the model's (empty: its smallest) and any shape of its own (0: the preset's):
  // gpt2 124M, 350M, 774M, 1558M; llama and qwen3 nn::decoder_preset_names() of their family.
  std::string model_size;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  // llama, qwen3: a preset (nn::decoder_preset_names()) and the shape flags beyond gpt2's (0 or
  // unset: the preset's).
  int64_t n_kv_head = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  double rope_theta = 0;
  double rms_norm_eps = 0;
  std::optional<bool> tie_word_embeddings;
  // llama, qwen3: several documents packed in one window train as if each were alone (attention
  // within a document, positions restarting, its first token not a target); their ends are the
  // EOS that tokenizer_info.json beside the token files names.
  bool document_masking = false;
  // gpt2, llama, qwen3: a Hugging Face folder (config.json, safetensors) to start from.
  std::string init_from;
  // gpt2, llama, qwen3: a folder whose config.json alone gives the shape (no weights read): the
  // run's folder of a checkpoint read back. The flags, and init_from's config.json, may only
  // repeat it.
  std::string shape_from;
  // The language models' optimizer and learning-rate schedule: AdamW's decoupled weight decay on
  // matrices (gpt2, llama, qwen3); the schedule "constant", "cosine" or "linear" (after
  // warmup_steps of linear warmup from 0, down to min_lr at decay_steps; decay_steps 0: the run's
  // max_steps, which the command fills in).
  double weight_decay = 0.1;
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  int64_t decay_steps = 0;
};

struct BuiltInModel {
  std::unique_ptr<Module> module;
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> val;        // null: no validation data
  std::optional<CharVocabulary> vocabulary;  // gpt only
};

std::vector<std::string> model_names();
// gpt2, llama and qwen3: the Hugging Face families of the library's registry (hub_model.h), whose
// model_type is the name; the command reads their folders and exports their checkpoints.
bool is_hub_model(const std::string& name);
// llama and qwen3: the families nn::decoder() builds.
bool is_decoder(const std::string& name);
// Builds the model (its initial weights come from the default generator) and its data (the same
// on every rank and every run).
BuiltInModel make_model(const ModelOptions& options);
// GPT-2's shape: from the preset and the flags that override it, or the config.json of the
// --init-from folder or of shape_from (a flag that contradicts it, or the two folders that
// disagree, are refused with std::invalid_argument naming the key and the flag).
nn::Gpt2Config gpt2_config(const ModelOptions& options);
// Llama's or Qwen3's shape, as gpt2_config's.
nn::DecoderConfig decoder_config(const ModelOptions& options);
// Whether `options` say which model they mean (--init-from, --model-size, a shape or size flag)
// rather than leaving it to the default preset.
bool names_a_shape(const ModelOptions& options);
// The language models' optimizer and schedule as the flags give them (lr, weight decay, the
// schedule).
LanguageModelOptions language_model_options(const ModelOptions& options);
// What a language model's ThroughputMonitor counts: tokens per sample (its block), and for gpt2,
// llama and qwen3 the model FLOPs.
ThroughputMonitorOptions throughput_options(const ModelOptions& options);

}  // namespace pipetrain::cli
