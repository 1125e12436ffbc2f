// What the Trainer's machinery costs per training step: the same fit with loggers (CSV and
// TensorBoard), the progress bar and callbacks (learning-rate monitor, early stopping, a
// checkpoint callback that never fires during the timed steps), against a bare fit with all of
// them off. Goal: at most 2% more time per step, with metrics logged every step (the worst case).
//   build/bench/trainer_overhead_bench [steps=400] [rounds=5] [log_every_n_steps=1]
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>

#include "bench_common.h"
#include "pipetrain/early_stopping.h"
#include "pipetrain/lr_monitor.h"
#include "pipetrain/model_checkpoint.h"
#include "pipetrain/module.h"
#include "pipetrain/trainer.h"

namespace {

class Mlp : public pipetrain::Module {
 public:
  Mlp() : Module(pipetrain::bench::make_mlp(4, 256)) {}
  at::Tensor training_step(const pipetrain::Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss, pipetrain::LogOptions().prog_bar(true));
    return loss;
  }
  pipetrain::OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
};

double seconds_per_step(bool machinery, int64_t steps, int64_t log_every, const std::string& root) {
  auto options = pipetrain::TrainerOptions()
                     .max_steps(steps)
                     .log_every_n_steps(log_every)
                     .default_root_dir(root)
                     .num_sanity_val_steps(0);
  if (machinery) {
    options.loggers({"csv", "tensorboard"})
        .enable_progress_bar(true)
        .callbacks({std::make_shared<pipetrain::LearningRateMonitor>(),
                    std::make_shared<pipetrain::EarlyStopping>(pipetrain::EarlyStoppingOptions()
                                                                   .monitor("train_loss")
                                                                   .patience(1000000)
                                                                   .check_on_train_epoch_end(true)),
                    std::make_shared<pipetrain::ModelCheckpoint>(
                        pipetrain::ModelCheckpointOptions().every_n_epochs(0))});
  } else {
    options.loggers({}).enable_progress_bar(false).enable_checkpointing(false);
  }
  pipetrain::Trainer trainer(options);
  Mlp model;
  auto x = torch::randn({64 * steps, 256});
  pipetrain::DataLoader loader({x, x.sin()}, pipetrain::DataLoaderOptions().batch_size(64));
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(model, loader);
  return pipetrain::bench::seconds_since(start) / static_cast<double>(steps);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 400;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t log_every = argc > 3 ? std::atoll(argv[3]) : 1;
  at::set_num_threads(1);
  const auto root = std::filesystem::temp_directory_path() / "pipetrain-trainer-overhead";
  std::vector<double> bare, full;
  // Progress lines go to stdout; keep them out of the table.
  std::fflush(stdout);
  FILE* table = fdopen(dup(fileno(stdout)), "w");
  (void)!freopen("/dev/null", "w", stdout);
  for (int r = 0; r < rounds; ++r) {
    bare.push_back(seconds_per_step(false, steps, log_every, root.string()));
    full.push_back(seconds_per_step(true, steps, log_every, root.string()));
  }
  std::filesystem::remove_all(root);
  const double b = pipetrain::bench::median(bare), f = pipetrain::bench::median(full);
  std::fprintf(table, "steps %lld x %d rounds, 1 thread, log_every_n_steps %lld\n",
               static_cast<long long>(steps), rounds, static_cast<long long>(log_every));
  std::fprintf(table, "| fit | ms/step (median) |\n|---|---|\n");
  std::fprintf(table, "| bare (no loggers, progress or callbacks) | %.3f |\n", 1e3 * b);
  std::fprintf(table, "| loggers + progress bar + callbacks | %.3f |\n", 1e3 * f);
  std::fprintf(table, "overhead: %.2f%% (goal <= 2%%)\n", 100.0 * (f / b - 1.0));
  std::fclose(table);
  return 0;
}
