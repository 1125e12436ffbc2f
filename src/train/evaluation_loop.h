// validate, test and predict as loop objects, as fit's (fit_loop.h): each runs `reset(); while
// (!done()) advance();` and then its end, on the Trainer's state.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "pipetrain/module.h"

namespace pipetrain {

class BatchStream;
class DataLoader;
class Trainer;

// `batches` batches of validation_step (or test_step), then their epoch's metrics reduced over
// every rank; `record`: hooks see it and its metrics are logged (not so for the sanity check).
class EvaluationLoop {
 public:
  EvaluationLoop(Trainer& trainer, Module& module, const DataLoader& loader, int64_t batches,
                 bool test, bool record);
  ~EvaluationLoop();
  std::map<std::string, double> run();

 private:
  void reset();
  bool done() const { return batch_idx_ >= batches_; }
  void advance();  // one batch
  std::map<std::string, double> on_run_end();
  // Logs each batch's per-step values, where any rank has some.
  void log_step_values();

  Trainer& trainer_;
  Module& module_;
  const DataLoader& loader_;
  const int64_t batches_;
  const bool test_, record_;
  int64_t batch_idx_ = 0;
  std::unique_ptr<BatchStream> stream_;
  LoggedMetrics metrics_;
  std::vector<LoggedMetrics> step_values_;  // each batch's values logged per step
};

// `batches` batches of predict_step; their outputs on rank 0, in input order.
class PredictionLoop {
 public:
  PredictionLoop(Trainer& trainer, Module& module, const DataLoader& loader, int64_t batches);
  ~PredictionLoop();
  std::vector<at::Tensor> run();

 private:
  void reset();
  bool done() const { return batch_idx_ >= batches_; }
  void advance();  // one batch

  Trainer& trainer_;
  Module& module_;
  const DataLoader& loader_;
  const int64_t batches_;
  int64_t batch_idx_ = 0;
  std::unique_ptr<BatchStream> stream_;
  std::vector<at::Tensor> outputs_;
};

}  // namespace pipetrain
