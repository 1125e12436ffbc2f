// `pipetrain`: trains a built-in model with any strategy, so a first run needs no code.
//   pipetrain fit --model mlp --strategy pipe --devices 2 --chunks 4
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <sstream>

#include <pipetrain/error.h>
#include <pipetrain/strategy.h>
#include <pipetrain/trainer.h>

#include "models.h"

namespace {

std::string join(const std::vector<std::string>& names, const char* sep) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? sep : "") << names[i];
  return out.str();
}

struct FitArgs {
  pipetrain::cli::ModelOptions model;
  std::string strategy = "single";
  int64_t devices = 1;
  std::vector<int64_t> balance;
  int64_t chunks = 1;
  std::string checkpoint = "except_last";
  std::string schedule = "gpipe";
  int64_t max_epochs = 1000;
  int64_t max_steps = -1;
  int64_t batch_size = 32;
  uint64_t seed = 0;
  std::string default_root_dir = ".";
  int64_t log_every_n_steps = 50;
};

void add_fit_options(CLI::App& fit, FitArgs& args) {
  fit.add_option("--model", args.model.name,
                 "built-in model: " + join(pipetrain::cli::model_names(), ", "))
      ->envname("PIPETRAIN_MODEL");
  fit.add_option("--strategy", args.strategy,
                 "how to place the model: single, pipe, or a registered name")
      ->envname("PIPETRAIN_STRATEGY");
  fit.add_option("--devices", args.devices, "processes to run on; under pipe, the number of stages")
      ->envname("PIPETRAIN_DEVICES");
  fit.add_option("--balance", args.balance,
                 "layers per stage, e.g. 2,2 (default: by parameter count)")
      ->delimiter(',')
      ->envname("PIPETRAIN_BALANCE");
  fit.add_option("--chunks", args.chunks, "micro-batches per batch")->envname("PIPETRAIN_CHUNKS");
  fit.add_option("--checkpoint", args.checkpoint,
                 "activation checkpointing: always, except_last, never")
      ->envname("PIPETRAIN_CHECKPOINT");
  fit.add_option("--schedule", args.schedule, "pipeline schedule: gpipe, 1f1b")
      ->envname("PIPETRAIN_SCHEDULE");
  fit.add_option("--max-epochs", args.max_epochs, "stop after this many epochs")
      ->envname("PIPETRAIN_MAX_EPOCHS");
  fit.add_option("--max-steps", args.max_steps,
                 "stop after this many optimizer steps (-1: no limit)")
      ->envname("PIPETRAIN_MAX_STEPS");
  fit.add_option("--batch-size", args.batch_size, "samples per step (split into --chunks)")
      ->envname("PIPETRAIN_BATCH_SIZE");
  fit.add_option("--lr", args.model.lr, "learning rate")->envname("PIPETRAIN_LR");
  fit.add_option("--dropout", args.model.dropout, "dropout probability between mlp layers")
      ->envname("PIPETRAIN_DROPOUT");
  fit.add_option("--seed", args.seed, "seed for initial weights and shuffling")
      ->envname("PIPETRAIN_SEED");
  fit.add_option("--default-root-dir", args.default_root_dir, "where lightning_logs/ goes")
      ->envname("PIPETRAIN_DEFAULT_ROOT_DIR");
  fit.add_option("--log-every-n-steps", args.log_every_n_steps, "log metrics every K steps")
      ->envname("PIPETRAIN_LOG_EVERY_N_STEPS");
}

int run_fit(const FitArgs& args) {
  pipetrain::Trainer trainer(pipetrain::TrainerOptions()
                                 .strategy(args.strategy)
                                 .devices(args.devices)
                                 .pipe(pipetrain::PipeOptions()
                                           .balance(args.balance)
                                           .chunks(args.chunks)
                                           .checkpoint(args.checkpoint)
                                           .schedule(args.schedule))
                                 .max_epochs(args.max_epochs)
                                 .max_steps(args.max_steps)
                                 .seed(args.seed)
                                 .default_root_dir(args.default_root_dir)
                                 .log_every_n_steps(args.log_every_n_steps));
  auto model = pipetrain::cli::make_model(args.model);
  pipetrain::DataLoader loader(
      pipetrain::cli::make_train_data(args.model.name),
      pipetrain::DataLoaderOptions().batch_size(args.batch_size).shuffle(true).seed(args.seed));
  trainer.fit(*model, loader);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pipetrain: train LibTorch Sequential models on one device or split into a pipeline"};
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  FitArgs fit_args;
  CLI::App* fit = app.add_subcommand("fit", "train a built-in model");
  add_fit_options(*fit, fit_args);
  CLI11_PARSE(app, argc, argv);

  try {
    if (fit->parsed()) return run_fit(fit_args);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::cerr << "pipetrain: error: " << (rank ? std::string("rank ") + rank + ": " : "")
              << pipetrain::error_message(e) << std::endl;
    return 1;
  }
  return 0;
}
