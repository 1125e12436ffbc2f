#include "pipetrain/throughput_monitor.h"

#include <torch/cuda.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>

#include "pipetrain/trainer.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

// Waits for the device's queued work, so that the clock read next marks its end.
double seconds_after_device_work(const Trainer& trainer) {
  if (trainer.world().device().is_cuda()) torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options)
    : options_(std::move(options)) {
  if (options_.items_per_sample() < 0 || options_.flops_per_sample() < 0 ||
      options_.available_flops() < 0) {
    throw std::invalid_argument(
        "ThroughputMonitor: items_per_sample, flops_per_sample and available_flops must not be "
        "negative (got " +
        std::to_string(options_.items_per_sample()) + ", " +
        std::to_string(options_.flops_per_sample()) + ", " +
        std::to_string(options_.available_flops()) + ")");
  }
}

void ThroughputMonitor::on_fit_start(Trainer& trainer, Module&) {
  window_open_ = false;
  last_step_ = trainer.global_step();
}

void ThroughputMonitor::on_train_batch_end(Trainer& trainer, Module&, const TrainBatchOutputs&,
                                           const Batch& batch, int64_t) {
  // Every process sees the whole batch's rows (stages that skip the data get a [rows, 0]
  // tensor); replicas read one share each.
  window_samples_ += batch.data.size(0) * trainer.replicas();
  if (trainer.global_step() == last_step_) return;  // inside an accumulation window
  last_step_ = trainer.global_step();
  ++window_steps_;
  if (trainer.global_step() % trainer.options().log_every_n_steps() != 0) return;

  const double now = seconds_after_device_work(trainer);
  if (window_open_) {
    const double seconds = now - window_start_;
    const double samples_per_sec = static_cast<double>(window_samples_) / seconds;
    std::map<std::string, double> values{
        {"train/steps_per_sec", static_cast<double>(window_steps_) / seconds},
        {"train/samples_per_sec", samples_per_sec}};
    if (options_.items_per_sample() > 0) {
      values["train/items_per_sec"] =
          samples_per_sec * static_cast<double>(options_.items_per_sample());
    }
    if (options_.flops_per_sample() > 0) {
      const double flops_per_sec = samples_per_sec * options_.flops_per_sample();
      values["train/flops_per_sec"] = flops_per_sec;
      if (options_.available_flops() > 0) {
        values["train/mfu"] = flops_per_sec / (options_.available_flops() *
                                               static_cast<double>(trainer.world().size()));
      }
    }
    // The row of the step that closes the window (the Trainer has counted it already).
    trainer.log_metrics(values, trainer.global_step() - 1);
  }
  window_open_ = true;
  window_start_ = now;
  window_steps_ = 0;
  window_samples_ = 0;
}

void ThroughputMonitor::on_validation_end(Trainer&, Module&) { window_open_ = false; }

}  // namespace pipetrain
