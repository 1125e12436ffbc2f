// `pipetrain`: trains, validates, tests and predicts with a built-in model under any strategy, so
// a first run needs no code.
//   pipetrain fit --model gpt --strategy pipe --devices 2 --chunks 4
//   pipetrain predict --model gpt --ckpt-path last --prompt "The "
// Every flag has an environment variable (PIPETRAIN_<FLAG>) and a key in --config FILE (JSON);
// the command line wins over the environment, which wins over the config file.
#include <CLI/CLI.hpp>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/early_stopping.h>
#include <pipetrain/error.h>
#include <pipetrain/lr_monitor.h>
#include <pipetrain/model_checkpoint.h>
#include <pipetrain/module.h>
#include <pipetrain/trainer.h>

#include "models/hf_gpt2.h"
#include "models/models.h"
#include "models/prepare_data.h"

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

// Exit status of a run the command or its input got wrong (a flag, a value, a model that cannot
// be split as asked), as CLI11's parse errors; 1 is a run that failed.
constexpr int kUsageError = 2;

struct Args {
  pipetrain::cli::ModelOptions model;
  std::string strategy = "single";
  std::string accelerator = "auto";
  int64_t devices = 1;
  int64_t num_nodes = 1;
  int64_t stages = 0;
  std::vector<int64_t> balance;
  int64_t chunks = 1;
  std::string checkpoint = "except_last";
  std::string schedule = "gpipe";
  int64_t virtual_stages = 1;
  int64_t max_memory = 0;
  std::string schedule_file;
  bool cuda_graphs = false;
  bool fuse_gradient_accumulation = false;
  bool deferred_batch_norm = false;
  std::string trace;
  int64_t max_epochs = 1000;
  int64_t min_epochs = 0;
  int64_t max_steps = -1;
  double max_time = 0;
  std::string limit_train_batches = "1.0";
  std::string limit_val_batches = "1.0";
  std::string limit_test_batches = "1.0";
  std::string limit_predict_batches = "1.0";
  std::string val_check_interval = "1.0";
  int64_t check_val_every_n_epoch = 1;
  int64_t num_sanity_val_steps = 2;
  int64_t accumulate_grad_batches = 1;
  double gradient_clip_val = 0;
  bool stop_on_nonfinite_loss = true;
  std::string gradient_clip_algorithm = "norm";
  int64_t fast_dev_run = 0;
  bool deterministic = false;
  bool enable_progress_bar = true;
  bool enable_checkpointing = true;
  int64_t log_every_n_steps = 50;
  std::string precision = "32-true";
  std::vector<std::string> logger{"csv", "tensorboard"};
  int64_t batch_size = 32;
  int64_t num_workers = 1;
  uint64_t seed = 0;
  std::string default_root_dir = ".";
  int64_t timeout = 300;
  std::string ckpt_path;
  std::string monitor;
  std::string mode = "min";
  int64_t save_top_k = 1;
  bool save_last = true;
  int64_t every_n_train_steps = 0;
  int64_t early_stopping_patience = 0;
  std::string prompt = "The ";
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  std::string config;
};

std::string join(const std::vector<std::string>& names, const char* sep) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? sep : "") << names[i];
  return out.str();
}

// "--max-epochs" -> "PIPETRAIN_MAX_EPOCHS".
std::string env_name(const std::string& flag) {
  std::string name = "PIPETRAIN_";
  for (char c : flag.substr(2)) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

// The flags of every subcommand, declared once.
void add_flags(CLI::App& app, Args& a) {
  auto add = [&](const std::string& flag, auto& value, const std::string& help) {
    return app.add_option(flag, value, help)->envname(env_name(flag));
  };
  add("--config", a.config, "JSON file of flag values (keys as the flags, e.g. \"max_epochs\")");
  add("--model", a.model.name, "built-in model: " + join(pipetrain::cli::model_names(), ", "));
  add("--lr", a.model.lr, "learning rate");
  add("--dropout", a.model.dropout, "dropout probability inside the model");
  add("--corpus", a.model.corpus,
      "gpt: a text file to train on (default: /usr/share/common-licenses)");
  add("--train-data", a.model.train_data,
      "gpt, gpt2: token file to train on (nanoGPT's train.bin or an llm.c shard; see "
      "prepare-data)");
  add("--val-data", a.model.val_data,
      "gpt, gpt2: token file to validate on (default: val.bin beside --train-data, if there)");
  add("--vocab-size", a.model.vocab_size,
      "token ids are below this (0: gpt 256, byte tokens; gpt2 50304)");
  add("--block-size", a.model.block_size,
      "gpt, gpt2: context length in tokens (0: the model's, 32 and 1024)");
  add("--model-size", a.model.model_size, "gpt2: 124M, 350M, 774M or 1558M (GPT-2 small to xl)");
  add("--n-layer", a.model.n_layer, "gpt2: transformer blocks (0: the preset's)");
  add("--n-head", a.model.n_head, "gpt2: attention heads (0: the preset's)");
  add("--n-embd", a.model.n_embd, "gpt2: embedding width (0: the preset's)");
  add("--init-from", a.model.init_from,
      "gpt2: start from a Hugging Face GPT-2 folder (config.json, model.safetensors)");
  add("--strategy", a.strategy,
      "how to place the model: single, pipe, ddp, ddp_pipe, or a registered name");
  add("--accelerator", a.accelerator, "cpu, cuda, or auto (cuda when a GPU is visible)");
  add("--devices", a.devices, "processes per node; under pipe, the number of stages");
  add("--num-nodes", a.num_nodes, "machines; start one launch per node with NODE_RANK set");
  add("--stages", a.stages, "ddp_pipe: stages per pipeline (must divide devices x num-nodes)");
  add("--balance", a.balance, "layers per stage, e.g. 2,2 (default: by parameter count)")
      ->delimiter(',');
  add("--chunks", a.chunks, "micro-batches per batch");
  add("--checkpoint", a.checkpoint, "activation checkpointing: always, except_last, never");
  add("--schedule", a.schedule,
      "pipeline schedule: gpipe, 1f1b, zbh1, zbh2, interleaved1f1b, zbv, or auto (the fastest of "
      "the first four, timed)");
  add("--virtual-stages", a.virtual_stages,
      "stages per process (interleaved1f1b: rank r runs stages r, r + devices, ...; zbv: 2)");
  add("--max-memory", a.max_memory,
      "the most micro-batches' activations a stage may hold (auto picks among the schedules "
      "that fit; 0: no limit)");
  add("--schedule-file", a.schedule_file,
      "a schedule of one's own: torch.distributed.pipelining's compute-only CSV, one line per "
      "process");
  add("--cuda-graphs", a.cuda_graphs,
      "replay forward and backward as CUDA graphs (cuda, checkpoint never)");
  add("--fuse-gradient-accumulation", a.fuse_gradient_accumulation,
      "Linear layers add weight gradients inside their GEMM");
  add("--deferred-batch-norm", a.deferred_batch_norm,
      "BatchNorm running statistics from the whole batch, not each micro-batch");
  add("--max-epochs", a.max_epochs, "stop after this many epochs");
  add("--min-epochs", a.min_epochs, "train at least this many epochs, even if asked to stop");
  add("--max-steps", a.max_steps, "stop after this many optimizer steps (-1: no limit)");
  add("--max-time", a.max_time, "stop after this many seconds of training (0: no limit)");
  add("--limit-train-batches", a.limit_train_batches, "batches per epoch: a count or a fraction");
  add("--limit-val-batches", a.limit_val_batches, "validation batches: a count or a fraction");
  add("--limit-test-batches", a.limit_test_batches, "test batches: a count or a fraction");
  add("--limit-predict-batches", a.limit_predict_batches, "predict batches: count or fraction");
  add("--val-check-interval", a.val_check_interval,
      "validate every this many batches, or this fraction of an epoch");
  add("--check-val-every-n-epoch", a.check_val_every_n_epoch, "validate every N epochs");
  add("--num-sanity-val-steps", a.num_sanity_val_steps, "validation batches run before training");
  add("--accumulate-grad-batches", a.accumulate_grad_batches, "batches per optimizer step");
  add("--gradient-clip-val", a.gradient_clip_val, "clip gradients at this value (0: off)");
  add("--stop-on-nonfinite-loss", a.stop_on_nonfinite_loss,
      "stop with an error at the first NaN or infinite training loss");
  add("--gradient-clip-algorithm", a.gradient_clip_algorithm,
      "norm (global norm over all stages) or value");
  add("--fast-dev-run", a.fast_dev_run, "run N batches of each loop, no logs or checkpoints");
  add("--deterministic", a.deterministic, "use deterministic algorithms only");
  add("--enable-progress-bar", a.enable_progress_bar, "show progress (rank 0)");
  add("--enable-checkpointing", a.enable_checkpointing, "save checkpoint files");
  add("--log-every-n-steps", a.log_every_n_steps, "log metrics every K steps");
  add("--precision", a.precision, "32-true, bf16-mixed or bf16-true");
  add("--logger", a.logger, "loggers: csv, tensorboard (comma-separated; none: no logs)")
      ->delimiter(',');
  add("--batch-size", a.batch_size, "samples per step and replica (split into --chunks)");
  add("--num-workers", a.num_workers, "threads preparing batches ahead of the step (0: none)");
  add("--seed", a.seed, "seed for initial weights and shuffling");
  add("--default-root-dir", a.default_root_dir, "where lightning_logs/ goes");
  add("--trace", a.trace, "fit: write a Chrome-trace JSON of every rank's spans to this file");
  add("--timeout", a.timeout, "seconds to wait for another rank before failing");
  add("--ckpt-path", a.ckpt_path, "checkpoint to resume from or evaluate: a path, or last");
  add("--monitor", a.monitor, "metric that picks the best checkpoints (default: by recency)");
  add("--mode", a.mode, "min or max: which way --monitor improves");
  add("--save-top-k", a.save_top_k, "best checkpoints to keep (-1: all)");
  add("--save-last", a.save_last, "also keep last.ckpt");
  add("--every-n-train-steps", a.every_n_train_steps, "checkpoint every N steps (0: per epoch)");
  add("--early-stopping-patience", a.early_stopping_patience,
      "stop when --monitor has not improved for N validations (0: off)");
  add("--prompt", a.prompt, "predict, gpt: text to continue");
  add("--max-new-tokens", a.max_new_tokens, "predict, gpt: characters to generate");
  add("--temperature", a.temperature, "predict, gpt: sampling temperature");
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

// The --config path, before the real parse (so its values can become defaults).
std::string find_config(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) return argv[i + 1];
    if (arg.rfind("--config=", 0) == 0) return arg.substr(9);
  }
  const char* env = std::getenv("PIPETRAIN_CONFIG");
  return env ? env : "";
}

pipetrain::TrainerOptions trainer_options(const Args& a) {
  std::vector<std::string> loggers;
  for (const auto& name : a.logger) {
    if (name != "none") loggers.push_back(name);
  }
  std::vector<std::shared_ptr<pipetrain::Callback>> callbacks;
  if (a.enable_checkpointing) {
    callbacks.push_back(std::make_shared<pipetrain::ModelCheckpoint>(
        pipetrain::ModelCheckpointOptions()
            .monitor(a.monitor)
            .mode(a.mode)
            .save_top_k(a.save_top_k)
            .save_last(a.save_last)
            .every_n_train_steps(a.every_n_train_steps)));
  }
  if (a.early_stopping_patience > 0) {
    callbacks.push_back(std::make_shared<pipetrain::EarlyStopping>(
        pipetrain::EarlyStoppingOptions()
            .monitor(a.monitor.empty() ? "val_loss" : a.monitor)
            .mode(a.mode)
            .patience(a.early_stopping_patience)));
  }
  if (!loggers.empty()) callbacks.push_back(std::make_shared<pipetrain::LearningRateMonitor>());
  if (a.model.name == "gpt" || a.model.name == "gpt2") {
    callbacks.push_back(std::make_shared<pipetrain::cli::PerplexityLogger>());
    callbacks.push_back(std::make_shared<pipetrain::ThroughputMonitor>(
        pipetrain::cli::throughput_options(a.model)));
  }
  return pipetrain::TrainerOptions()
      .strategy(a.strategy)
      .accelerator(a.accelerator)
      .devices(a.devices)
      .num_nodes(a.num_nodes)
      .stages(a.stages)
      .pipe(pipetrain::PipeOptions()
                .balance(a.balance)
                .chunks(a.chunks)
                .checkpoint(a.checkpoint)
                .schedule(a.schedule)
                .virtual_stages(a.virtual_stages)
                .max_memory(a.max_memory)
                .schedule_file(a.schedule_file)
                .cuda_graphs(a.cuda_graphs)
                .fuse_gradient_accumulation(a.fuse_gradient_accumulation)
                .deferred_batch_norm(a.deferred_batch_norm))
      .trace(a.trace)
      .max_epochs(a.max_epochs)
      .min_epochs(a.min_epochs)
      .max_steps(a.max_steps)
      .max_time(a.max_time)
      .limit_train_batches(parse_limit("--limit-train-batches", a.limit_train_batches))
      .limit_val_batches(parse_limit("--limit-val-batches", a.limit_val_batches))
      .limit_test_batches(parse_limit("--limit-test-batches", a.limit_test_batches))
      .limit_predict_batches(parse_limit("--limit-predict-batches", a.limit_predict_batches))
      .val_check_interval(parse_limit("--val-check-interval", a.val_check_interval))
      .check_val_every_n_epoch(a.check_val_every_n_epoch)
      .num_sanity_val_steps(a.num_sanity_val_steps)
      .accumulate_grad_batches(a.accumulate_grad_batches)
      .gradient_clip_val(a.gradient_clip_val)
      .stop_on_nonfinite_loss(a.stop_on_nonfinite_loss)
      .gradient_clip_algorithm(a.gradient_clip_algorithm)
      .fast_dev_run(a.fast_dev_run)
      .deterministic(a.deterministic)
      .enable_progress_bar(a.enable_progress_bar)
      .enable_checkpointing(a.enable_checkpointing)
      .log_every_n_steps(a.log_every_n_steps)
      .precision(a.precision)
      .loggers(loggers)
      .callbacks(callbacks)
      .seed(a.seed)
      .default_root_dir(a.default_root_dir)
      .timeout_seconds(a.timeout);
}

pipetrain::DataLoader loader(std::shared_ptr<const pipetrain::Dataset> data, const Args& a,
                             bool shuffle) {
  return pipetrain::DataLoader(std::move(data), pipetrain::DataLoaderOptions()
                                                    .batch_size(a.batch_size)
                                                    .shuffle(shuffle)
                                                    .seed(a.seed)
                                                    .num_workers(a.num_workers));
}

void print_metrics(const pipetrain::Trainer& trainer, const std::string& title,
                   const std::map<std::string, double>& metrics) {
  std::ostringstream out;
  out << title << ":";
  for (const auto& [name, value] : metrics) out << " " << name << "=" << value;
  if (!trainer.options().loggers().empty()) out << " (metrics.csv in " << trainer.log_dir() << ")";
  trainer.print(out.str());
}

int run(const std::string& command, const Args& a) {
  const auto options = trainer_options(a);
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
        pipetrain::load_weights(layers, pipetrain::read_checkpoint_weights(path),
                                pipetrain::checkpoint_weights_path(path));
      }
      std::cout << pipetrain::cli::generate(model.module->layers(), *model.vocabulary, a.prompt,
                                            a.max_new_tokens, a.temperature, a.seed)
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
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  // One Args per subcommand: CLI11 applies environment variables to every subcommand's options,
  // so shared storage would let another subcommand's environment value win over a flag.
  std::map<std::string, Args> args;
  const std::vector<std::pair<std::string, std::string>> commands{
      {"fit", "train a built-in model"},
      {"validate", "evaluate on the validation data"},
      {"test", "evaluate on the test data"},
      {"predict", "predict (gpt: generate text from --prompt)"}};
  std::map<std::string, CLI::App*> subcommands;
  for (const auto& [name, help] : commands) {
    subcommands[name] = app.add_subcommand(name, help);
    add_flags(*subcommands[name], args[name]);
  }
  struct ExportOptions {
    std::string format = "hf-gpt2", ckpt_path, output;
    int64_t n_head = 0;
  } exported;
  CLI::App* export_command = app.add_subcommand(
      "export", "write a checkpoint's weights for other tools (hf-gpt2: transformers' GPT-2)");
  export_command->add_option("--format", exported.format, "hf-gpt2 (the one there is)");
  export_command->add_option("--ckpt-path", exported.ckpt_path, "a .ckpt folder of --model gpt2")
      ->required();
  export_command
      ->add_option("--output", exported.output,
                   "folder for model.safetensors and "
                   "config.json")
      ->required();
  export_command->add_option("--n-head", exported.n_head,
                             "attention heads (0: those of the released GPT-2 of this shape)");
  pipetrain::cli::PrepareDataOptions prepare;
  CLI::App* prepare_command =
      app.add_subcommand("prepare-data", "make token files (train.bin, val.bin) from any text");
  prepare_command->add_option("--input", prepare.input, "the text file")->required();
  prepare_command->add_option("--output", prepare.output, "directory for train.bin and val.bin")
      ->required();
  prepare_command->add_option("--val-fraction", prepare.val_fraction,
                              "share of the text, from its end, for val.bin");
  prepare_command->add_option("--format", prepare.format,
                              "nanogpt (raw uint16 tokens) or llmc (llm.c's header first)");
  // Errors name the rank that met them, once (the distributed layer's own messages already do).
  const char* rank = std::getenv("RANK");
  auto report = [&](const std::string& message) {
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
  }

  try {
    if (export_command->parsed()) {
      if (exported.format != "hf-gpt2") {
        throw std::invalid_argument("--format " + exported.format + ": use hf-gpt2");
      }
      const auto weights = pipetrain::read_checkpoint_weights(exported.ckpt_path);
      pipetrain::cli::export_hf_gpt2(
          weights, pipetrain::cli::gpt2_config_of(weights, exported.n_head), exported.output);
      std::cout << "wrote " << exported.output << "/model.safetensors and config.json "
                << "(transformers.GPT2LMHeadModel.from_pretrained(\"" << exported.output << "\"))"
                << std::endl;
      return 0;
    }
    if (prepare_command->parsed()) {
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
