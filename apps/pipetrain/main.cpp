// `pipetrain`: trains, validates, tests and predicts with a built-in model under any strategy, so
// a first run needs no code.
//   pipetrain fit --model gpt --strategy pipe --devices 2 --chunks 4
//   pipetrain predict --model gpt --ckpt-path last --prompt "The "
// Every flag has an environment variable (PIPETRAIN_<FLAG>) and a key in --config FILE (JSON);
// the command line wins over the environment, which wins over the config file. A flag given twice
// takes its last value.
#include <CLI/CLI.hpp>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>

#include <pipetrain/balance.h>
#include <pipetrain/checkpoint_io.h>
#include <pipetrain/checkpoint_path.h>
#include <pipetrain/cluster_environment.h>
#include <pipetrain/early_stopping.h>
#include <pipetrain/error.h>
#include <pipetrain/hf_decoder.h>
#include <pipetrain/hf_gpt2.h>
#include <pipetrain/launcher.h>
#include <pipetrain/lr_monitor.h>
#include <pipetrain/lr_scheduler.h>
#include <pipetrain/model_checkpoint.h>
#include <pipetrain/module.h>
#include <pipetrain/pipe.h>
#include <pipetrain/strategy.h>
#include <pipetrain/trainer.h>

#include "models/byte_size.h"
#include "models/export_command.h"
#include "models/generate_command.h"
#include "models/models.h"
#include "models/perplexity_logger.h"
#include "models/plan_command.h"
#include "models/prepare_data.h"
#include "models/run_config.h"
#include "models/sample_callback.h"

namespace {

using pipetrain::BatchLimit;

// `text` as a count or fraction of batches; an error names `flag`.
BatchLimit parse_limit(const std::string& flag, const std::string& text) {
  try {
    return BatchLimit::parse(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(flag + " " + text + ": " + e.what());
  }
}

// The longest wait or run a flag may ask for, in seconds (about 31 years): beyond it, a deadline
// in nanoseconds from now would not fit in 64 bits.
constexpr int64_t kMaxSeconds = 1'000'000'000;

// Flags of seconds the flag reader passes (NaN, infinities, a timeout of 1e16 s) that no clock
// can count: refused before a rank starts, rather than met by Gloo or a comparison that never
// stops.
void check_seconds(const pipetrain::TrainerOptions& t) {
  std::ostringstream max_time;
  max_time << t.max_time();
  for (const auto& [flag, value, text, zero] :
       {std::tuple{"--timeout", static_cast<double>(t.timeout_seconds()),
                   std::to_string(t.timeout_seconds()), ""},
        std::tuple{"--max-time", t.max_time(), max_time.str(), "; 0: no limit"}}) {
    if (!(value <= static_cast<double>(kMaxSeconds))) {
      throw std::invalid_argument(std::string(flag) + " " + text + ": give at most " +
                                  std::to_string(kMaxSeconds) + " seconds (about 31 years)" + zero);
    }
  }
}

// Exit status of a run the command or its input got wrong (a flag, a value, a model that cannot
// be split as asked), as CLI11's parse errors; 1 is a run that failed.
constexpr int kUsageError = 2;

// What the command line fills: the library's own options structs, so each flag's default is the
// struct's (where the command wants another, it says so here, once), plus what only the command
// has.
struct Args {
  pipetrain::cli::ModelOptions model;
  pipetrain::TrainerOptions trainer;
  pipetrain::DataLoaderOptions data = pipetrain::DataLoaderOptions().batch_size(32);
  pipetrain::ModelCheckpointOptions checkpointing =
      pipetrain::ModelCheckpointOptions().save_last(true);
  int64_t early_stopping_patience = 0;  // 0: no EarlyStopping
  std::string ckpt_path;
  // predict, gpt: text generation.
  std::string prompt = "The ";
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  // llama, qwen3: prompts continued at every validation, and the tokens made for each.
  std::string sample_prompts;
  int64_t sample_new_tokens = 32;
  std::string config;
  // --plan's links (bytes per second); kept apart, as --plan may come after them.
  int64_t link_bandwidth = 450'000'000'000, network_bandwidth = 50'000'000'000;
  int64_t device_memory = 0;  // --plan's limit per device; 0: --max-memory's
  bool model_given = false;   // --model given, rather than a checkpoint's run's config.json's
};

template <typename T>
std::string join(const std::vector<T>& items, const char* sep) {
  std::ostringstream out;
  for (size_t i = 0; i < items.size(); ++i) out << (i ? sep : "") << items[i];
  return out.str();
}

// A list flag's value, "2,2" or "csv,tensorboard", element by element; an error names `flag`.
template <typename T>
std::vector<T> parse_list(const std::string& flag, const std::string& text) {
  std::vector<T> list;
  std::istringstream elements(text);
  std::string element;
  while (std::getline(elements, element, ',')) {
    if constexpr (std::is_same_v<T, std::string>) {
      list.push_back(element);
    } else {
      T value{};
      const char* end = element.data() + element.size();
      const auto parsed = std::from_chars(element.data(), end, value);
      if (element.empty() || parsed.ec != std::errc() || parsed.ptr != end) {
        throw std::invalid_argument(flag + " " + text + ": '" + element +
                                    "' is not a whole number");
      }
      list.push_back(value);
    }
  }
  return list;
}

// "--max-epochs" -> "PIPETRAIN_MAX_EPOCHS".
std::string env_name(const std::string& flag) {
  std::string name = "PIPETRAIN_";
  for (char c : flag.substr(2)) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

// The built-in models trained with the language models' optimizer recipe (AdamW with weight decay
// on matrices, the learning-rate schedule flags).
bool has_optimizer_recipe(const std::string& model) { return pipetrain::cli::is_hub_model(model); }

// A flag of `app` writing `value`, also read from its environment variable.
template <typename Value>
CLI::Option* add_flag(CLI::App& app, const std::string& flag, Value& value,
                      const std::string& help) {
  return app.add_option(flag, value, help)->envname(env_name(flag));
}

// The flags that say a language model's shape (or the Hugging Face folder that holds it), for
// the training subcommands and export alike.
void add_shape_flags(CLI::App& app, pipetrain::cli::ModelOptions& m) {
  auto add = [&](const std::string& flag, auto& value, const std::string& help) {
    return add_flag(app, flag, value, help);
  };
  // A true/false flag that may also be left unset, which keeps what the model would choose (a
  // preset's, a Hugging Face folder's).
  auto add_optional_bool = [&](const std::string& flag, std::optional<bool>& value,
                               const std::string& help) {
    return app
        .add_option_function<bool>(
            flag, [&value](const bool& given) { value = given; }, help)
        ->run_callback_for_default()  // so --config's value reaches `value`
        ->envname(env_name(flag));
  };
  add("--vocab-size", m.vocab_size,
      "token ids are below this (0: gpt 256, byte tokens; gpt2 50304; llama, qwen3 the preset's)");
  add("--block-size", m.block_size,
      "gpt, gpt2, llama, qwen3: context length in tokens (0: the model's)");
  add("--model-size", m.model_size,
      "gpt2: 124M, 350M, 774M or 1558M (GPT-2 small to xl); llama: llama-150m, llama3.2-1b, "
      "llama3.2-3b, llama3.1-8b; qwen3: qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b (empty: the "
      "smallest)");
  add("--n-layer", m.n_layer, "gpt2, llama, qwen3: transformer blocks (0: the preset's)");
  add("--n-head", m.n_head, "gpt2, llama, qwen3: attention heads (0: the preset's)");
  add("--n-embd", m.n_embd, "gpt2, llama, qwen3: embedding width (0: the preset's)");
  add("--n-kv-head", m.n_kv_head,
      "llama, qwen3: key/value heads, grouped-query attention (0: the preset's)");
  add("--head-dim", m.head_dim, "llama, qwen3: width of an attention head (0: the preset's)");
  add("--intermediate-size", m.intermediate_size,
      "llama, qwen3: the SwiGLU MLP's hidden width (0: the preset's)");
  add("--rope-theta", m.rope_theta, "llama, qwen3: RoPE's base (0: the preset's)");
  add("--rms-norm-eps", m.rms_norm_eps, "llama, qwen3: RMSNorm's epsilon (0: the preset's)");
  add_optional_bool("--tie-word-embeddings", m.tie_word_embeddings,
                    "llama, qwen3: true: the output head is the token embedding; false: a matrix "
                    "of its own (unset: the preset's)");
  add("--init-from", m.init_from,
      "gpt2, llama, qwen3: start from a Hugging Face folder (config.json, *.safetensors)");
  add("--document-masking", m.document_masking,
      "llama, qwen3: documents packed in a window attend only within themselves, their positions "
      "restarting (their ends: the EOS of the token files' tokenizer_info.json)");
}

// The flags of every subcommand, declared once: each writes the options field it names.
void add_flags(CLI::App& app, Args& a) {
  auto add = [&](const std::string& flag, auto& value, const std::string& help) {
    return add_flag(app, flag, value, help);
  };
  // A number of batches or a fraction of them ("10", "0.25"), read by BatchLimit::parse.
  auto add_limit = [&](const std::string& flag, pipetrain::BatchLimit& limit,
                       const std::string& help) {
    return app
        .add_option_function<std::string>(
            flag, [&limit, flag](const std::string& text) { limit = parse_limit(flag, text); },
            help)
        ->default_str(limit.to_string())
        ->run_callback_for_default()  // so --config's value reaches `limit`
        ->envname(env_name(flag));
  };
  // A comma-separated list ("2,2") read as one value, so that the flag given again replaces the
  // whole list, as it replaces any other flag's value (CLI11's own lists would append to it).
  auto add_list = [&](const std::string& flag, auto& list, const std::string& help) {
    using Element = typename std::decay_t<decltype(list)>::value_type;
    return app
        .add_option_function<std::string>(
            flag,
            [&list, flag](const std::string& text) { list = parse_list<Element>(flag, text); },
            help)
        ->type_name("LIST")
        ->default_str(join(list, ","))
        ->run_callback_for_default()  // so --config's value reaches `list`
        ->envname(env_name(flag));
  };
  pipetrain::TrainerOptions& t = a.trainer;
  pipetrain::PipeOptions& pipe = t.pipe();
  add("--config", a.config, "JSON file of flag values (keys as the flags, e.g. \"max_epochs\")");
  add("--model", a.model.name, "built-in model: " + join(pipetrain::cli::model_names(), ", "));
  add("--lr", a.model.lr, "learning rate (gpt2, llama, qwen3: the peak, after --warmup-steps)");
  add("--lr-schedule", a.model.lr_schedule,
      "gpt2, llama, qwen3: the learning rate after warmup: constant, cosine or linear (down to "
      "--min-lr at --decay-steps)");
  add("--warmup-steps", a.model.warmup_steps,
      "gpt2, llama, qwen3: steps of linear warmup to --lr (step s runs at lr x (s + 1) / N)");
  add("--min-lr", a.model.min_lr,
      "gpt2, llama, qwen3: the learning rate cosine and linear decay to, and keep after "
      "--decay-steps");
  add("--decay-steps", a.model.decay_steps,
      "gpt2, llama, qwen3: the step cosine and linear reach --min-lr (0: --max-steps)");
  add("--weight-decay", a.model.weight_decay, "the language models' AdamW decay on matrices");
  add("--dropout", a.model.dropout, "dropout probability inside the model");
  add("--corpus", a.model.corpus,
      "gpt: a text file to train on (default: /usr/share/common-licenses)");
  add("--train-data", a.model.train_data,
      "gpt, gpt2, llama, qwen3: tokens to train on: a file (nanoGPT's train.bin of uint16 "
      "tokens, or an llm.c shard: GPT-2's uint16 or Llama 3's uint32), a folder of shards "
      "(its *_train_*.bin) or a quoted glob ('data/*_train_*.bin'); see prepare-data");
  add("--val-data", a.model.val_data,
      "gpt, gpt2, llama, qwen3: tokens to validate on, as --train-data (default: the val shards "
      "or val.bin beside --train-data, if there)");
  add_shape_flags(app, a.model);
  add("--strategy", t.strategy(),
      "how to place the model: single, pipe, ddp, ddp_pipe, or a registered name");
  add("--accelerator", t.accelerator(), "cpu, cuda, or auto (cuda when a GPU is visible)");
  add("--devices", t.devices(), "processes per node; under pipe, the number of stages");
  add("--num-nodes", t.num_nodes(), "machines; start one launch per node with NODE_RANK set");
  add("--stages", t.stages(),
      "ddp_pipe: stages per pipeline (must divide devices x num-nodes); plan: weigh only this "
      "many (default: every count)");
  app.add_option_function<std::string>(
         "--max-memory",
         [&t](const std::string& text) {
           t.max_memory(pipetrain::cli::parse_byte_size("--max-memory", text));
         },
         "bytes of tensors a process may hold (e.g. 40GiB, 512MiB; 0: no limit): each rank's "
         "weights, gradients and optimizer state are held against it before the first step, and "
         "what the first step adds before its optimizer step")
      ->type_name("BYTES")
      ->default_str(std::to_string(t.max_memory()))
      ->run_callback_for_default()
      ->envname(env_name("--max-memory"));
  app.add_option_function<std::string>(
         "--plan",
         [&t](const std::string& text) {
           if (text.empty()) {
             t.plan(std::nullopt);
           } else if (text != "auto" && std::filesystem::is_directory(text)) {
             throw std::invalid_argument("--plan " + text +
                                         " is a folder: give the plan.json in it (--plan auto "
                                         "writes one in the run's folder), or auto");
           } else {
             t.plan(text == "auto" ? pipetrain::PlanOptions()
                                   : pipetrain::PlanOptions().file(text));
           }
         },
         "pipe, ddp_pipe: auto profiles the layers and trains the fastest balance, chunks, "
         "schedule and checkpoint mode that fit --max-memory (plan.json in the run's folder); a "
         "plan.json runs that plan again")
      ->type_name("PLAN")
      ->default_str("")
      ->envname(env_name("--plan"));
  for (const auto& [flag, value, shown, help] :
       {std::tuple{"--link-bandwidth", &a.link_bandwidth, "450GB",
                   "--plan, plan: bytes per second one way between two devices of a node, which "
                   "activations crossing a stage boundary take (NVLink 4's; 0: free)"},
        std::tuple{"--network-bandwidth", &a.network_bandwidth, "50GB",
                   "--plan, plan: the same between nodes (a 400 Gb/s InfiniBand NIC's; 0: free)"},
        std::tuple{"--device-memory", &a.device_memory, "0",
                   "--plan, plan: bytes of memory per device the plan must fit, e.g. 80GB (0: "
                   "--max-memory's)"}}) {
    app.add_option_function<std::string>(
           flag,
           [flag = std::string(flag), value = value](const std::string& text) {
             *value = pipetrain::cli::parse_byte_size(flag, text);
           },
           help)
        ->type_name("BYTES")
        ->default_str(shown)
        ->envname(env_name(flag));
  }
  add("--zero-stage", t.zero_stage(),
      "ddp, ddp_pipe: 1 shares the optimizer state out among the replicas (ZeRO stage 1), 0 not");
  add_list("--balance", pipe.balance(), "layers per stage, e.g. 2,2 (default: by parameter count)");
  add("--chunks", pipe.chunks(), "micro-batches per batch");
  add("--checkpoint", pipe.checkpoint(), "activation checkpointing: always, except_last, never");
  add("--schedule", pipe.schedule(),
      "pipeline schedule: gpipe, 1f1b, zbh1, zbh2, interleaved1f1b, zbv, or auto (the fastest of "
      "the first four, timed)");
  add("--virtual-stages", pipe.virtual_stages(),
      "stages per process (interleaved1f1b: rank r runs stages r, r + devices, ...; zbv: 2)");
  add("--max-in-flight", pipe.max_in_flight(),
      "the most micro-batches' activations a stage may hold (auto picks among the schedules "
      "that fit; 0: no limit)");
  add("--schedule-file", pipe.schedule_file(),
      "a schedule of one's own: torch.distributed.pipelining's compute-only CSV, one line per "
      "process");
  add("--cuda-graphs", pipe.cuda_graphs(),
      "replay forward and backward as CUDA graphs (cuda, checkpoint never)");
  add("--fuse-gradient-accumulation", pipe.fuse_gradient_accumulation(),
      "Linear layers add weight gradients inside their GEMM");
  add("--deferred-batch-norm", pipe.deferred_batch_norm(),
      "BatchNorm running statistics from the whole batch, not each micro-batch");
  add("--max-epochs", t.max_epochs(), "stop after this many epochs");
  add("--min-epochs", t.min_epochs(), "train at least this many epochs, even if asked to stop");
  add("--max-steps", t.max_steps(), "stop after this many optimizer steps (-1: no limit)");
  add("--max-time", t.max_time(), "stop after this many seconds of training (0: no limit)");
  add_limit("--limit-train-batches", t.limit_train_batches(),
            "batches per epoch: a count or a fraction");
  add_limit("--limit-val-batches", t.limit_val_batches(),
            "validation batches: a count or a fraction");
  add_limit("--limit-test-batches", t.limit_test_batches(), "test batches: a count or a fraction");
  add_limit("--limit-predict-batches", t.limit_predict_batches(),
            "predict batches: count or fraction");
  add_limit("--val-check-interval", t.val_check_interval(),
            "validate every this many batches, or this fraction of an epoch");
  add("--check-val-every-n-epoch", t.check_val_every_n_epoch(), "validate every N epochs");
  add("--num-sanity-val-steps", t.num_sanity_val_steps(), "validation batches run before training");
  add("--accumulate-grad-batches", t.accumulate_grad_batches(), "batches per optimizer step");
  add("--gradient-clip-val", t.gradient_clip_val(), "clip gradients at this value (0: off)");
  add("--stop-on-nonfinite-loss", t.stop_on_nonfinite_loss(),
      "stop with an error at the first NaN or infinite training loss");
  add("--gradient-clip-algorithm", t.gradient_clip_algorithm(),
      "norm (global norm over all stages) or value");
  add("--fast-dev-run", t.fast_dev_run(), "run N batches of each loop, no logs or checkpoints");
  add("--deterministic", t.deterministic(), "use deterministic algorithms only");
  add("--enable-progress-bar", t.enable_progress_bar(), "show progress (rank 0)");
  add("--enable-checkpointing", t.enable_checkpointing(), "save checkpoint files");
  add("--log-every-n-steps", t.log_every_n_steps(), "log metrics every K steps");
  add("--precision", t.precision(), "32-true, bf16-mixed or bf16-true");
  add_list("--logger", t.loggers(), "loggers: csv, tensorboard (comma-separated; none: no logs)");
  add("--batch-size", a.data.batch_size(), "samples per step and replica (split into --chunks)");
  add("--num-workers", a.data.num_workers(),
      "threads preparing batches ahead of the step (0: none)");
  add("--seed", t.seed(), "seed for initial weights and shuffling");
  add("--default-root-dir", t.default_root_dir(), "where lightning_logs/ goes");
  add("--trace", t.trace(), "fit: write a Chrome-trace JSON of every rank's spans to this file");
  add("--timeout", t.timeout_seconds(), "seconds to wait for another rank before failing");
  add("--ckpt-path", a.ckpt_path,
      "checkpoint to resume from or evaluate: a path, last (the newest last.ckpt under "
      "--default-root-dir) or best (the checkpoint callback's best, as last.ckpt records it)");
  add("--monitor", a.checkpointing.monitor(),
      "metric that picks the best checkpoints (default: by recency)");
  add("--mode", a.checkpointing.mode(), "min or max: which way --monitor improves");
  add("--save-top-k", a.checkpointing.save_top_k(), "best checkpoints to keep (-1: all)");
  add("--save-last", a.checkpointing.save_last(), "also keep last.ckpt");
  add("--every-n-train-steps", a.checkpointing.every_n_train_steps(),
      "checkpoint every N steps (0: per epoch)");
  add("--early-stopping-patience", a.early_stopping_patience,
      "stop when --monitor has not improved for N validations (0: off)");
  add("--prompt", a.prompt, "predict, gpt: text to continue");
  add("--max-new-tokens", a.max_new_tokens, "predict, gpt: characters to generate");
  add("--temperature", a.temperature, "predict, gpt: sampling temperature");
  add("--sample-prompts", a.sample_prompts,
      "llama, qwen3: a file of prompts (one a line, or JSONL {\"prompt\": ...}) continued "
      "greedily at every validation, printed and logged (TensorBoard's text)");
  add("--sample-new-tokens", a.sample_new_tokens, "tokens made for each of --sample-prompts");
}

// Values from --config become the defaults, so the environment and the command line override them.
void apply_config(CLI::App& app, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--config " + path + ": cannot read the file");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--config " + path + " is not valid JSON: " + e.what());
  }
  if (!json.is_object()) throw std::invalid_argument("--config " + path + " must hold an object");
  for (const auto& [key, value] : json.items()) {
    std::string flag = "--" + key;
    for (auto& c : flag) c = c == '_' ? '-' : c;
    CLI::Option* option = nullptr;
    try {
      option = app.get_option(flag);
    } catch (const CLI::OptionNotFound&) {
      throw std::invalid_argument("--config " + path + ": unknown key '" + key + "'");
    }
    std::string text;
    if (value.is_string()) {
      text = value.get<std::string>();
    } else if (value.is_array()) {
      for (size_t i = 0; i < value.size(); ++i) {
        text +=
            (i ? "," : "") + (value[i].is_string() ? value[i].get<std::string>() : value[i].dump());
      }
    } else {
      text = value.dump();
    }
    option->default_str(text);
    option->default_val(text);
  }
}

// The --config path, before the real parse (so its values can become defaults): the last one
// given, as for every flag.
std::string find_config(int argc, char** argv) {
  std::string config;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) config = argv[i + 1];
    if (arg.rfind("--config=", 0) == 0) config = arg.substr(9);
  }
  if (!config.empty()) return config;
  const char* env = std::getenv("PIPETRAIN_CONFIG");
  return env ? env : "";
}

// The Trainer's options as the flags left them, with what follows from them: no "none" among
// the loggers, and the callbacks the flags ask for.
pipetrain::TrainerOptions trainer_options(const Args& a) {
  pipetrain::TrainerOptions options = a.trainer;
  if (options.plan()) {
    options.plan(options.plan()
                     ->link_bandwidth(static_cast<double>(a.link_bandwidth))
                     .network_bandwidth(static_cast<double>(a.network_bandwidth))
                     .max_memory(a.device_memory));
  }
  std::vector<std::string> loggers;
  for (const auto& name : options.loggers()) {
    if (name != "none") loggers.push_back(name);
  }
  options.loggers(loggers);
  std::vector<std::shared_ptr<pipetrain::Callback>> callbacks;
  if (options.enable_checkpointing()) {
    callbacks.push_back(std::make_shared<pipetrain::ModelCheckpoint>(a.checkpointing));
  }
  if (a.early_stopping_patience > 0) {
    const std::string& monitor = a.checkpointing.monitor();
    callbacks.push_back(std::make_shared<pipetrain::EarlyStopping>(
        pipetrain::EarlyStoppingOptions()
            .monitor(monitor.empty() ? "val_loss" : monitor)
            .mode(a.checkpointing.mode())
            .patience(a.early_stopping_patience)));
  }
  if (!loggers.empty()) callbacks.push_back(std::make_shared<pipetrain::LearningRateMonitor>());
  // Every language model's validation perplexity and tokens (and FLOPs) per second. The learning
  // rate, and so any --lr-schedule, is logged by the LearningRateMonitor above.
  if (a.model.name == "gpt" || has_optimizer_recipe(a.model.name)) {
    callbacks.push_back(std::make_shared<pipetrain::cli::PerplexityLogger>());
    callbacks.push_back(std::make_shared<pipetrain::ThroughputMonitor>(
        pipetrain::cli::throughput_options(a.model)));
  }
  if (!a.sample_prompts.empty()) {
    callbacks.push_back(
        pipetrain::cli::sample_callback(a.model, a.sample_prompts, a.sample_new_tokens));
  }
  return options.callbacks(callbacks);
}

pipetrain::DataLoader loader(std::shared_ptr<const pipetrain::Dataset> data, const Args& a,
                             bool shuffle) {
  return pipetrain::DataLoader(
      std::move(data),
      pipetrain::DataLoaderOptions(a.data).shuffle(shuffle).seed(a.trainer.seed()));
}

void print_metrics(const pipetrain::Trainer& trainer, const std::string& title,
                   const std::map<std::string, double>& metrics) {
  std::ostringstream out;
  out << title << ":";
  for (const auto& [name, value] : metrics) out << " " << name << "=" << value;
  if (!trainer.options().loggers().empty()) out << " (metrics.csv in " << trainer.log_dir() << ")";
  trainer.print(out.str());
}

// The flags as a run uses them: a decaying --lr-schedule given its end, --max-steps, where
// --decay-steps leaves it to the run. Throws std::invalid_argument when fit has neither.
Args resolved(const std::string& command, Args a) {
  if (!has_optimizer_recipe(a.model.name)) return a;
  const auto shapes = pipetrain::WarmupDecayLR::shapes();
  if (std::find(shapes.begin(), shapes.end(), a.model.lr_schedule) == shapes.end()) {
    throw std::invalid_argument("--lr-schedule " + a.model.lr_schedule + ": use " +
                                join(shapes, ", "));
  }
  if (a.model.lr_schedule == "constant" || a.model.decay_steps > 0) return a;
  if (a.trainer.max_steps() > 0) {
    a.model.decay_steps = a.trainer.max_steps();
  } else if (command == "fit") {
    throw std::invalid_argument("--lr-schedule " + a.model.lr_schedule +
                                " decays to --min-lr over the run: pass --max-steps N (or "
                                "--decay-steps N), as the run has no last step to end it at");
  }
  return a;
}

// Under pipe and ddp_pipe every stage needs a layer, and the pipeline's options (its schedule,
// a schedule file, a plan file) must describe one. What cannot be built as asked is refused by
// the launcher, before any rank starts, rather than by every rank once all have started (a
// thousand of them for --devices 1000), each saying it.
void check_pipeline(const pipetrain::TrainerOptions& options,
                    const pipetrain::cli::ModelOptions& m) {
  const bool pipe = options.strategy() == "pipe";
  if (!pipe && options.strategy() != "ddp_pipe") return;
  // A rank (launched, or started by torchrun or SLURM): its strategy checks the pipeline.
  if (pipetrain::select_cluster_environment()->world_size() > 1) return;
  const int64_t ranks = pipe ? options.devices() * options.num_nodes() : options.stages();
  const int64_t virtual_stages = options.pipe().virtual_stages();
  const int64_t stages = ranks * virtual_stages;
  if (stages <= 1) return;
  // The strategy's own checks of the options first, as the launch makes them.
  pipetrain::create_strategy(options.strategy(), options);
  const auto layers = static_cast<int64_t>(pipetrain::cli::make_model(m).module->layers()->size());
  if (layers < stages) {
    throw std::invalid_argument(
        "--model " + m.name + " has " + std::to_string(layers) + " layers, and " +
        std::to_string(stages) + " stages were asked for (" +
        (pipe ? "--devices x --num-nodes" : "--stages") +
        (virtual_stages > 1 ? " x --virtual-stages" : "") +
        "): every stage needs a layer; ask for at most " + std::to_string(layers) + " stages");
  }
  if (options.plan()) {
    // The plan's balance, chunks and schedule replace the flags'.
    if (!options.plan()->file().empty()) pipetrain::cli::check_plan_file(options.plan()->file());
    return;
  }
  if (!options.pipe().balance().empty()) {
    pipetrain::validate_balance(options.pipe().balance(), layers);
  }
  pipetrain::stage_ranks(options.pipe(), ranks);  // reads a schedule file
}

// `pipetrain plan`: one process profiles the layers on the first training batch.
int plan(const Args& a) {
  // As fit checks them (the Trainer's options), before the devices divide the threads.
  for (const auto& [flag, value, minimum] :
       {std::tuple{"devices (--devices)", a.trainer.devices(), 1},
        std::tuple{"num_nodes (--num-nodes)", a.trainer.num_nodes(), 1},
        std::tuple{"stages (--stages)", a.trainer.stages(), 0}}) {
    if (value < minimum) {
      throw std::invalid_argument(std::string(flag) + " must be at least " +
                                  std::to_string(minimum) + " (got " + std::to_string(value) + ")");
    }
  }
  auto model = pipetrain::cli::make_model(a.model);
  pipetrain::cli::PlanRequest request;
  request.devices = a.trainer.devices();
  request.nodes = a.trainer.num_nodes();
  request.stages = a.trainer.stages();
  request.link_bandwidth = static_cast<double>(a.link_bandwidth);
  request.network_bandwidth = static_cast<double>(a.network_bandwidth);
  request.max_memory = a.device_memory > 0 ? a.device_memory : a.trainer.max_memory();
  request.accelerator = a.trainer.accelerator();
  request.precision = a.trainer.precision();
  std::cout << pipetrain::cli::plan_report(*model.module, loader(model.train, a, false).batch(0, 0),
                                           request)
            << std::endl;
  return 0;
}

// The checkpoint `a.ckpt_path` names, or "" where it names none (yet: fit's "last" before the
// first save; the Trainer reports a path that names nothing).
std::string checkpoint_of(const Args& a) {
  if (a.ckpt_path.empty()) return "";
  try {
    return pipetrain::resolve_checkpoint_path(a.ckpt_path, a.trainer.default_root_dir());
  } catch (const std::exception&) {
    return "";
  }
}

int run(const std::string& command, Args given) {
  // A checkpoint's model is the one its run trained: its family and shape (heads, RoPE, norms)
  // are the config.json beside it, which the flags may only repeat. Checked here, before any rank
  // starts.
  given.model =
      pipetrain::cli::with_run_shape(given.model, given.model_given, checkpoint_of(given));
  check_seconds(given.trainer);
  const Args a = resolved(command, given);
  if (command == "plan") return plan(a);
  const auto options = trainer_options(a);
  check_pipeline(options, a.model);
  if (const auto status = pipetrain::launch_ranks(options)) return *status;
  pipetrain::Trainer trainer(options);
  auto model = pipetrain::cli::make_model(a.model);
  // Evaluation reads the validation data: the built-in models always have some, gpt on token
  // files where --val-data (or a val.bin beside --train-data) names it.
  const auto val = [&] {
    if (!model.val) {
      throw std::invalid_argument(command + " needs validation data: pass --val-data FILE");
    }
    return loader(model.val, a, false);
  };
  if (command == "fit") {
    const bool gpt2 = a.model.name == "gpt2";
    if (pipetrain::cli::is_hub_model(a.model.name) && trainer.is_global_zero()) {
      // Beside the checkpoints (in the run's folder, or the root's without a logger), what their
      // weights do not say (GPT-2's heads, a decoder's RoPE and norms), for export.
      const auto& dir = trainer.options().loggers().empty() ? trainer.options().default_root_dir()
                                                            : trainer.log_dir();
      if (gpt2) {
        pipetrain::write_hf_gpt2_config(pipetrain::cli::gpt2_config(a.model), dir);
      } else {
        // The bos and eos ids of the folder fit started from, kept across resumes.
        pipetrain::write_hf_decoder_config(
            pipetrain::cli::decoder_config(a.model), a.model.name, dir,
            a.model.init_from.empty() ? a.model.shape_from : a.model.init_from);
      }
    }
    const auto train = loader(model.train, a, true);
    std::optional<pipetrain::DataLoader> val_loader;
    if (model.val) val_loader = loader(model.val, a, false);
    trainer.fit(*model.module, train, val_loader ? &*val_loader : nullptr, a.ckpt_path);
    // Preempted: last.ckpt is saved; the shell's status of a signal tells a scheduler (or
    // torchrun --max-restarts) the job is not done.
    if (trainer.stopped_by_signal() != 0) return 128 + trainer.stopped_by_signal();
  } else if (command == "validate") {
    print_metrics(trainer, "validate", trainer.validate(*model.module, val(), a.ckpt_path));
  } else if (command == "test") {
    print_metrics(trainer, "test", trainer.test(*model.module, val(), a.ckpt_path));
  } else if (model.vocabulary) {
    // Sampling is one forward per character: rank 0 runs the whole loaded model itself.
    if (trainer.is_global_zero()) {
      if (!a.ckpt_path.empty()) {
        const auto path = trainer.resolve_checkpoint(a.ckpt_path);
        auto layers = model.module->layers();
        pipetrain::load_weights(layers, pipetrain::StoredWeights(path));
      }
      std::cout << pipetrain::cli::generate(model.module->layers(), *model.vocabulary, a.prompt,
                                            a.max_new_tokens, a.temperature, a.trainer.seed())
                << std::endl;
    }
  } else {
    const auto outputs = trainer.predict(*model.module, val(), a.ckpt_path);
    if (trainer.is_global_zero()) {
      const auto all = torch::cat(outputs);
      const auto first = all.slice(0, 0, std::min<int64_t>(16, all.size(0))).flatten();
      std::cout << "predicted " << all.size(0) << " rows; first:";
      for (int64_t i = 0; i < first.numel(); ++i) std::cout << " " << first[i].item<double>();
      std::cout << std::endl;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pipetrain: train LibTorch Sequential models on one device or split into a pipeline"};
  // A flag given again replaces its value, as in argparse and most Unix tools, so that a script can
  // override one of a shared list of flags ("${common[@]}" --devices 3).
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.require_subcommand(1);
  // One Args per subcommand: CLI11 applies environment variables to every subcommand's options,
  // so shared storage would let another subcommand's environment value win over a flag.
  std::map<std::string, Args> args;
  const std::vector<std::pair<std::string, std::string>> commands{
      {"fit", "train a built-in model"},
      {"validate", "evaluate on the validation data"},
      {"test", "evaluate on the test data"},
      {"predict", "predict (gpt: generate text from --prompt)"},
      {"plan",
       "profile the model's layers here and print the fastest pipeline plan over --devices ranks "
       "within --max-memory per device (no training)"}};
  std::map<std::string, CLI::App*> subcommands;
  for (const auto& [name, help] : commands) {
    subcommands[name] = app.add_subcommand(name, help);
    add_flags(*subcommands[name], args[name]);
  }
  pipetrain::cli::ExportOptions exported;
  CLI::App* export_command = app.add_subcommand(
      "export",
      "write a checkpoint's weights as a Hugging Face folder (transformers' from_pretrained)");
  export_command->add_option("--format", exported.format,
                             "hf (gpt2, llama, qwen3; hf-gpt2 is gpt2's name for it)");
  export_command->add_option("--model", exported.model.name,
                             "the checkpoint's model: gpt2, llama or qwen3");
  add_shape_flags(*export_command, exported.model);
  // As the other subcommands read them, their environment variables included.
  export_command
      ->add_option("--ckpt-path", exported.ckpt_path,
                   "a checkpoint of --model gpt2, llama or qwen3: a .ckpt folder, last or best (as "
                   "fit's)")
      ->envname(env_name("--ckpt-path"))
      ->required();
  export_command
      ->add_option("--default-root-dir", exported.default_root_dir,
                   "where lightning_logs/ is, for --ckpt-path last or best")
      ->envname(env_name("--default-root-dir"));
  export_command
      ->add_option("--output", exported.output,
                   "folder for config.json and the weights (model.safetensors, or shards and "
                   "their index)")
      ->required();
  export_command->add_flag(
      "--overwrite", exported.overwrite,
      "write into a folder that holds other files than an export's (replacing its config.json "
      "and weights files)");
  export_command->add_option("--dtype", exported.dtype,
                             "llama, qwen3: the weights' dtype in the folder: bf16 or fp32");
  export_command->add_option("--max-shard-size", exported.max_shard_size,
                             "llama, qwen3: the largest weights file, as transformers spells it "
                             "(5GB, 500MB, 2GiB)");
  pipetrain::cli::GenerateRequest generation;
  CLI::App* generate_command = app.add_subcommand(
      "generate",
      "continue prompts with a GPT-2, Llama or Qwen3: a Hugging Face folder's, or a checkpoint's");
  generate_command->add_option("--init-from", generation.init_from,
                               "the model's Hugging Face folder (config.json, weights, "
                               "tokenizer.json): the Hub's, or a checkpoint's export");
  generate_command
      ->add_option("--ckpt-path", generation.ckpt_path,
                   "or a checkpoint of fit's (a .ckpt folder, last or best): a gpt2, llama or "
                   "qwen3 run's, with --tokenizer")
      ->envname(env_name("--ckpt-path"));
  generate_command
      ->add_option("--default-root-dir", generation.default_root_dir,
                   "where lightning_logs/ is, for --ckpt-path last or best")
      ->envname(env_name("--default-root-dir"));
  generate_command->add_option("--tokenizer", generation.tokenizer,
                               "a tokenizer.json or its folder (default: --init-from's)");
  generate_command
      ->add_option("--prompt", generation.prompts,
                   "text to continue; repeatable (all run as one batch)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  generate_command
      ->add_option("--prompt-ids", generation.prompt_ids,
                   "a prompt as token ids (1,2,3), no tokenizer read: prints the new ids; "
                   "repeatable (with --ckpt-path and no --tokenizer no EOS is known: rows run to "
                   "--max-new-tokens)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  generate_command->add_option("--prompts-file", generation.prompts_file,
                               "prompts, one a line or JSONL {\"prompt\": ...}; - reads standard "
                               "input");
  generate_command->add_flag("--chat", generation.chat,
                             "each prompt a user turn of the model's chat template, the "
                             "assistant's turn to come");
  generate_command->add_option("--max-new-tokens", generation.max_new_tokens,
                               "tokens made per prompt at the most");
  generate_command->add_option("--temperature", generation.temperature,
                               "0: greedy; above: sampling from softmax(logits / temperature)");
  generate_command->add_option("--top-k", generation.top_k,
                               "sample among the k most likely tokens alone (0: all)");
  generate_command->add_option("--top-p", generation.top_p,
                               "sample among the fewest most likely tokens whose probabilities "
                               "reach p (1: all)");
  generate_command->add_option("--seed", generation.seed, "seeds the sampling");
  generate_command->add_option("--accelerator", generation.accelerator,
                               "cpu, cuda or auto (cuda when a GPU is visible)");
  generate_command->add_option("--strategy", generation.strategy,
                               "single, or pipe: the model's layers spread over --devices "
                               "processes, for a model too big for one device");
  generate_command->add_option("--devices", generation.devices,
                               "pipe: processes (one per GPU) the model's layers are spread over");
  generate_command
      ->add_option("--balance", generation.balance,
                   "pipe: layers per process, e.g. 2,3 (default: the blocks spread evenly, the "
                   "embedding with the first, the final norm and head with the last)")
      ->delimiter(',');
  generate_command->add_option("--dtype", generation.dtype,
                               "the weights' and activations' dtype: bf16 or fp32 (default: bf16 "
                               "on a GPU, fp32 on the CPU)");
  pipetrain::cli::PrepareDataOptions prepare;
  CLI::App* prepare_command = app.add_subcommand(
      "prepare-data",
      "make token files from text: with --tokenizer llm.c shards of its ids, without train.bin "
      "and val.bin of byte tokens");
  prepare_command
      ->add_option("--input", prepare.inputs,
                   "a text file, a JSONL file, a folder of them (sorted), or - (standard "
                   "input); repeatable (byte tokens: one file)")
      ->required();
  prepare_command->add_option("--output", prepare.output, "directory for the token files")
      ->required();
  prepare_command->add_option("--val-fraction", prepare.val_fraction,
                              "share of the documents for the val shards (byte tokens: of the "
                              "text, from its end, for val.bin)");
  prepare_command->add_option("--tokenizer", prepare.tokenizer,
                              "a Hugging Face tokenizer.json, or a model's folder holding one");
  prepare_command->add_option("--format", prepare.format,
                              "the input's format, with --tokenizer: text (a file is a document), "
                              "jsonl (a line is one), chat (a line is {\"messages\": [{\"role\", "
                              "\"content\"}, ...]}: the assistant turns carry loss) or "
                              "prompt-completion (a line is {\"prompt\", \"completion\"}: the "
                              "completion carries loss); default: jsonl for .jsonl files");
  prepare_command->add_option("--text-field", prepare.text_field,
                              "with --tokenizer: the JSONL field that holds a document's text");
  prepare_command->add_option("--shard-size", prepare.shard_size,
                              "with --tokenizer: tokens per shard (the last one shorter)");
  prepare_command->add_option("--name", prepare.name,
                              "with --tokenizer: shards are NAME_train_000000.bin, "
                              "NAME_val_000000.bin, ... (default: the --output folder's name)");
  prepare_command->add_option("--threads", prepare.threads,
                              "with --tokenizer: threads that encode (0: every core)");
  prepare_command->add_option("--file-format", prepare.file_format,
                              "byte tokens: nanogpt (raw tokens) or llmc (llm.c's header first)");
  prepare_command->add_option("--token-dtype", prepare.token_dtype,
                              "byte tokens: uint16, or uint32 with --file-format llmc (llm.c's "
                              "Llama 3 shard)");
  // Errors name the rank that met them, once (the distributed layer's own messages already do).
  const char* rank = std::getenv("RANK");
  auto report = [&](const std::string& message) {
    // Ranks that meet the same error (a refusal they all agree on) say it once, not once each.
    if (!pipetrain::first_to_report(message)) return;
    const std::string named = rank ? std::string("rank ") + rank : "";
    const bool says_who = !named.empty() && message.rfind(named, 0) == 0 &&
                          (message[named.size()] == ':' || message[named.size()] == ' ');
    pipetrain::print_line("pipetrain: error: " + (named.empty() || says_who ? "" : named + ": ") +
                          message);
  };
  try {
    const std::string config = find_config(argc, argv);
    if (!config.empty()) {
      for (auto& [name, sub] : subcommands) apply_config(*sub, config);
    }
  } catch (const std::exception& e) {
    report(e.what());
    return kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageError;  // --help is not an error
  } catch (const std::invalid_argument& e) {    // a value a flag's own reader refused
    report(e.what());
    return kUsageError;
  }

  // Whether --model was given (on the command line, in the environment or in --config), rather
  // than left at its default for a checkpoint's run to say.
  const auto model_given = [](CLI::App& sub, const std::string& default_name) {
    const CLI::Option* option = sub.get_option("--model");
    return option->count() > 0 || option->get_default_str() != default_name;
  };
  exported.model_given = model_given(*export_command, pipetrain::cli::ExportOptions().model.name);
  for (auto& [name, sub] : subcommands)
    args[name].model_given = model_given(*sub, Args().model.name);
  try {
    if (export_command->parsed()) {
      pipetrain::cli::export_checkpoint(exported);
      return 0;
    }
    if (generate_command->parsed()) {
      return pipetrain::cli::generate_text(generation, std::cout);
    }
    if (prepare_command->parsed()) {
      // Each kind of token files has flags of its own: given to the other, they are refused
      // (--format, prepare_data's).
      const bool tokenized = !prepare.tokenizer.empty();
      const auto refuse_given = [&](std::initializer_list<const char*> flags, const char* why) {
        for (const char* flag : flags) {
          if (prepare_command->get_option(flag)->count() > 0) {
            throw std::invalid_argument(std::string(flag) + why);
          }
        }
      };
      if (tokenized) {
        refuse_given({"--file-format", "--token-dtype"},
                     " is for byte tokens: a tokenizer's ids are written as llm.c shards, of a "
                     "width its vocabulary gives");
        if (prepare.format == "chat" || prepare.format == "prompt-completion") {
          refuse_given({"--text-field"},
                       " is for --format jsonl: a chat line's fields are "
                       "messages, a prompt-completion line's prompt and "
                       "completion");
        }
      } else {
        refuse_given({"--text-field", "--shard-size", "--name", "--threads"},
                     " is for a tokenizer's shards: pass --tokenizer");
      }
      std::cout << pipetrain::cli::prepare_data(prepare) << std::endl;
      return 0;
    }
    for (const auto& [name, sub] : subcommands) {
      if (sub->parsed()) return run(name, args[name]);
    }
  } catch (const std::invalid_argument& e) {
    report(pipetrain::error_message(e));
    return kUsageError;
  } catch (const std::exception& e) {
    report(pipetrain::error_message(e));
    return 1;
  }
  return 0;
}
