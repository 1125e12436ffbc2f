// What a Pipe holds and how it runs, behind its public interface (pipetrain/pipe.h): the rank's
// stages, its plan per chunk count, the micro-batches in flight, and how its stages execute.
// Built in pipe.cpp, run in pipe_executor.cpp, its schedule chosen in pipe_schedule_choice.cpp.
#pragma once

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/p2p.h"
#include "pipeline/plan.h"
#include "pipeline/recompute.h"
#include "pipetrain/pipe.h"
#include "pipetrain/schedule.h"

namespace pipetrain {

class StageExecution;
class DeferredWeightGradients;
class DeferredBatchNormImpl;
class ScheduleChoice;
struct StageValue;

class Pipe::Impl {
 public:
  Impl(torch::nn::Sequential sequential, PipeOptions options, std::shared_ptr<World> world);
  ~Impl();

  at::Tensor forward_backward(const at::Tensor& input, int64_t batch_size, const LossFn& loss_fn);
  void forward(const at::Tensor& input, int64_t batch_size, const OutputFn& on_output);
  void reduce_tied_gradients();
  std::vector<at::Tensor> parameters() const;
  bool choosing_schedule() const;
  int64_t stages() const { return static_cast<int64_t>(balance_.size()); }
  int64_t rank_of_stage(int64_t stage) const { return rank_of_stage_.at(stage); }
  bool is_first_stage() const { return rank_ == rank_of_stage(0); }
  bool is_last_stage() const { return rank_ == rank_of_stage(stages() - 1); }

  struct Step;  // one forward_backward's micro-batches in flight
  // One of this rank's stages.
  struct LocalStage {
    int64_t index = 0;        // in the pipeline
    int64_t first_layer = 0;  // in the Sequential
    torch::nn::Sequential layers;
  };
  const LocalStage& local_stage(int64_t stage) const;
  bool is_first(int64_t stage) const { return stage == 0; }
  bool is_last(int64_t stage) const { return stage == stages() - 1; }
  at::Tensor run_schedule(const at::Tensor& batch_input, int64_t batch_size, const LossFn& loss_fn);
  // The actions of a schedule: F, B or I, and W (schedule.h).
  void run_forward(Step& step, const Action& action);
  void run_backward(Step& step, const Action& action);
  void run_weight_backward(Step& step, const Action& action);
  // The fused Linear layers' weight gradients that `backward` (a B) put off until after its send.
  void run_deferred_weight_gradients(Step& step, const Action& backward);
  // The plan's transfers (plan.h): a receive leaves the tensors in arrived_*_, a send takes them
  // from the step's outgoing packets (and, under CUDA graphs, tells the slot whose buffers they
  // are that they are on their way).
  void run_receive(Step& step, const PlannedAction& planned);
  void run_send(Step& step, const PlannedAction& planned);
  void receive_activation(int64_t peer, int64_t stage, const MicroBatch& mb);
  // What `stage` made for its neighbour (the next stage's activations, or the previous stage's
  // gradients): handed over when that stage runs on this rank, else left for the plan's send (no
  // step: a forward-only pass, sent at once).
  void pass_on(Step* step, bool gradients, int64_t stage, const MicroBatch& mb, Packet packet,
               int64_t slot);
  // This rank's plan for a batch of `chunks` micro-batches, lowered once per chunk count.
  const std::vector<PlannedAction>& plan_for(int64_t chunks);
  StageValue run_stage(const LocalStage& stage, const StageValue& input, int64_t microbatch);
  // `layer`, or, with deferred_batch_norm, the DeferredBatchNorm standing in for it.
  torch::nn::AnyModule defer_batch_norms(const torch::nn::AnyModule& layer, int64_t index);
  // run_stage again, leaving the layers' state (BatchNorm's running statistics) as it was: for
  // the backward of a recomputed micro-batch (`with_grad`), or to learn what the stage returns.
  StageValue rerun_stage(const LocalStage& stage, const StageValue& input, int64_t microbatch,
                         bool with_grad);
  // Under cuda_graphs, at the first forward: drops the graphs (saying why) if this stage takes or
  // returns several tensors, or integer ones at a boundary, which the graphs do not capture.
  void check_graphs_fit(const StageValue& input, int64_t microbatch);
  // Runs eagerly from now on, saying why (`who`: "stage 1 " or the like) and in execution().
  void drop_graphs(const std::string& who, const std::string& why);
  // Schedule "auto", after a full step while it chooses: a profiled step's seconds in F, in B or
  // I, in W over `chunks` micro-batches and handing its `transfers` over, and the whole step's.
  void choose_schedule(const std::vector<double>& profiled_seconds, int64_t transfers,
                       int64_t chunks, double step_seconds);
  // Simulates every candidate with a profiled step's times; returns what to print.
  std::string predict_schedules(const std::vector<double>& seconds, int64_t transfers,
                                int64_t chunks);

  PipeOptions options_;
  std::shared_ptr<World> world_;
  std::unique_ptr<PeerToPeer> p2p_;
  std::vector<int64_t> balance_;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::vector<int64_t> rank_of_stage_;
  std::vector<LocalStage> local_stages_;  // ascending
  // What has arrived for a stage, received from another rank or handed over by a stage of this
  // one: activations from the previous stage, gradients from the next, by (receiving stage,
  // micro-batch).
  std::map<std::pair<int64_t, int64_t>, Packet> arrived_activations_, arrived_gradients_;
  CheckpointMode checkpoint_mode_;
  std::string schedule_name_;  // what runs: the option's, or what auto runs (choice_->running())
  std::unique_ptr<ScheduleChoice> choice_;  // schedule "auto" alone
  Schedule schedule_;
  std::map<int64_t, std::vector<PlannedAction>> plans_;  // by chunks
  torch::nn::Sequential stage_module_;                   // every local stage's layers
  std::function<void()> last_backward_hook_;
  std::unique_ptr<TiedGradients> tied_;
  std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_norms_;
  // How this rank's stages compute (stage_execution.h), and what execution() says of it.
  std::unique_ptr<StageExecution> execution_;
  std::string execution_report_ = "eager";
  bool check_boundary_ = false;  // CUDA graphs, until check_graphs_fit has seen the first input
  // Fused Linear layers' weight gradients, left by their backwards for run_weight_gradients()
  // (null: unfused, or a first stage that computes them within its backwards).
  std::shared_ptr<DeferredWeightGradients> deferred_;
};

}  // namespace pipetrain
