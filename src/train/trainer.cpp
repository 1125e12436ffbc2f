// THE TRAINING LOOP MUST READ EASILY. Placement, micro-batching and communication belong to the
// strategy; this file only says what happens in which order.
#include "pipetrain/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/csv_logger.h"
#include "pipetrain/error.h"
#include "pipetrain/launcher.h"
#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Trainer::Trainer(TrainerOptions options)
    : options_(std::move(options)), strategy_(create_strategy(options_.strategy(), options_)) {
  if (options_.log_every_n_steps() < 1) {
    throw std::invalid_argument("log_every_n_steps must be at least 1 (got " +
                                std::to_string(options_.log_every_n_steps()) + ")");
  }
  const auto env = select_cluster_environment();
  const int64_t needed = strategy_->world_size();
  if (env->world_size() == 1 && needed > 1) {
    LaunchOptions launch;
    launch.nprocs = needed;
    std::exit(launch_local_processes(launch));
  }
  if (env->world_size() != needed) {
    throw std::invalid_argument("strategy '" + options_.strategy() + "' with devices " +
                                std::to_string(options_.devices()) + " needs " +
                                std::to_string(needed) + " processes, but the launcher (" +
                                env->name() + ") started " + std::to_string(env->world_size()) +
                                ": make --devices match the number of processes");
  }
  world_ = World::connect(*env, std::chrono::seconds(options_.timeout_seconds()));
  torch::manual_seed(options_.seed());
}

Trainer::~Trainer() = default;

bool Trainer::is_global_zero() const { return world_->is_global_zero(); }

std::string Trainer::log_dir() const { return logger_ ? logger_->log_dir() : std::string(); }

void Trainer::fit(Module& module, const DataLoader& train_loader) {
  const int64_t chunks = options_.pipe().chunks();
  if (options_.strategy() == "pipe" && chunks > train_loader.batch_size()) {
    throw std::invalid_argument(
        "chunks (" + std::to_string(chunks) + ") is larger than the batch size (" +
        std::to_string(train_loader.batch_size()) +
        "): every micro-batch needs at least one sample; lower --chunks or raise --batch-size");
  }
  try {
    strategy_->setup(module, world_);
  } catch (const std::exception& e) {
    world_->publish_error(error_message(e));
    throw;
  }
  auto optimizer = module.configure_optimizers();
  if (is_global_zero()) {
    logger_ = std::make_unique<CSVLogger>(options_.default_root_dir());
    if (options_.enable_progress_bar()) std::cout << strategy_->describe() << std::endl;
  }

  const int64_t batches = train_loader.num_batches();
  fit_start_seconds_ = now_seconds();
  bool done = options_.max_steps() == 0;
  for (current_epoch_ = 0; current_epoch_ < options_.max_epochs() && !done; ++current_epoch_) {
    for (int64_t batch_idx = 0; batch_idx < batches; ++batch_idx) {
      const Batch batch = train_loader.batch(current_epoch_, batch_idx);
      LoggedMetrics logged;
      optimizer->zero_grad();
      try {
        strategy_->training_step(module, batch, batch_idx, logged);
      } catch (const std::exception& e) {
        world_->publish_error(error_message(e));
        throw;
      }
      optimizer->step();

      if ((global_step_ + 1) % options_.log_every_n_steps() == 0) {
        log_step(strategy_->reduce_metrics(logged), batches);
      }
      ++global_step_;
      if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) {
        done = true;
        break;
      }
    }
  }
  if (logger_) {
    logger_->save();
    if (options_.enable_progress_bar()) {
      std::cout << "trained " << global_step_ << " steps in " << current_epoch_
                << " epochs; metrics: " << logger_->metrics_path() << std::endl;
    }
  }
  world_->barrier();
}

void Trainer::log_step(const std::map<std::string, double>& metrics, int64_t batches_per_epoch) {
  if (!logger_) return;
  auto row = metrics;
  row["epoch"] = static_cast<double>(current_epoch_);
  logger_->log_metrics(row, global_step_);
  logger_->save();
  if (!options_.enable_progress_bar()) return;
  const double elapsed = now_seconds() - fit_start_seconds_;
  std::printf("epoch %lld | step %lld (%lld/%lld) | %.1f it/s",
              static_cast<long long>(current_epoch_), static_cast<long long>(global_step_ + 1),
              static_cast<long long>(global_step_ % batches_per_epoch + 1),
              static_cast<long long>(batches_per_epoch),
              elapsed > 0 ? static_cast<double>(global_step_ + 1) / elapsed : 0.0);
  for (const auto& [name, value] : metrics) std::printf(" | %s %.5g", name.c_str(), value);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace pipetrain
