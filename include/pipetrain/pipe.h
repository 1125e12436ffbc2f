// Pipe: a torch::nn::Sequential split into consecutive stages, each process running one stage or
// several (virtual stages), each batch cut into micro-batches that flow through the stages in the
// order of a schedule. Every rank builds the same Sequential and keeps only its own stages'
// layers (SPMD, as torchrun runs it).
// Layers may pass several tensors on (a std::tuple of up to 4, or a std::vector<at::Tensor>),
// across stage boundaries too; the first layer takes the input tensor and the last returns one.
//
//   auto world = pipetrain::World::connect(*pipetrain::select_cluster_environment());
//   pipetrain::Pipe pipe(model, pipetrain::PipeOptions().balance({2, 2}).chunks(8), world);
//   auto loss = pipe.forward_backward(inputs, [&](const at::Tensor& out, const MicroBatch& mb) {
//     return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
//   });
//   pipe.reduce_tied_gradients();  // before every optimizer step (a no-op without tied weights)
//   optimizer.step();
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/microbatch.h"
#include "pipetrain/p2p.h"
#include "pipetrain/plan.h"
#include "pipetrain/recompute.h"
#include "pipetrain/schedule.h"

namespace pipetrain {

class World;
class StageExecution;
class DeferredWeightGradients;
class Trace;
class TiedGradients;
class DeferredBatchNormImpl;
class ScheduleChoice;
struct StageValue;

struct PipeOptions {
  // Layers per stage; empty: split by parameter count (balance_by_size) over the stages.
  TORCH_ARG(std::vector<int64_t>, balance) = {};
  // Stages per rank: the Sequential is cut into virtual_stages x ranks stages, rank r running
  // stages r, r + ranks, ... (loop placement: interleaved1f1b) or, with zbv's 2, stages r and
  // 2 ranks - 1 - r (V placement).
  TORCH_ARG(int64_t, virtual_stages) = 1;
  // Micro-batches per batch; a batch with fewer rows runs as one-row micro-batches.
  TORCH_ARG(int64_t, chunks) = 1;
  // "always" | "except_last" | "never".
  TORCH_ARG(std::string, checkpoint) = "except_last";
  // "gpipe" | "1f1b" | "zbh1" | "zbh2" | "interleaved1f1b" | "zbv" (schedule.h), or "auto":
  // the first two steps run zbh1 and time each stage's F, I and W (the first to warm up), then
  // every rank simulates 1f1b, zbh1, zbh2 and gpipe with those times; of those that fit
  // max_memory, the fastest runs from then on, or, where several are predicted within 1% of it,
  // each runs two more steps and the one measured fastest does. Rank 0 prints the predictions
  // and measurements (src/pipeline/schedule_choice.h). One stage per rank, no CUDA graphs.
  TORCH_ARG(std::string, schedule) = "gpipe";
  // The most micro-batches' activations one stage may hold at once (activations_held in
  // schedule.h: 1f1b's and zbh1's first stage hold min(ranks, chunks), zbh2's up to 2 ranks - 1,
  // gpipe's chunks): a schedule that holds more is refused, and "auto" picks among those that
  // fit. 0: no limit.
  TORCH_ARG(int64_t, max_memory) = 0;
  // A schedule of one's own, in torch.distributed.pipelining's compute-only CSV format
  // (parse_schedule_csv), run instead of `schedule` for batches of `chunks` micro-batches (a
  // shorter batch runs GPipe over the same stages). Its stages must number virtual_stages x ranks.
  TORCH_ARG(std::string, schedule_file) = "";
  // On CUDA with checkpoint "never" and a schedule of whole backwards: replay each micro-batch's
  // forward and backward as captured CUDA graphs, so the CPU no longer launches every kernel (see
  // stage_graphs.h).
  TORCH_ARG(bool, cuda_graphs) = false;
  // nn::Linear layers of the Sequential itself (not Linear layers nested inside a layer, such as a
  // transformer block's) accumulate their weight gradients inside the GEMM
  // (src/pipeline/fused_linear.h) instead of adding each micro-batch's gradient afterwards. A stage
  // that keeps every micro-batch's activations until its backwards anyway (all its forwards come
  // first and none is recomputed: GPipe with checkpoint "never", or any schedule with one
  // micro-batch) computes them after its last backward, one GEMM per layer over the whole batch,
  // keeping the layers' output gradients until then; other stages but the first, after sending each
  // input's gradient (or, where the schedule splits the backward, in its W).
  TORCH_ARG(bool, fuse_gradient_accumulation) = false;
  // BatchNorm layers of the Sequential update their running statistics once per batch, from the
  // whole batch's statistics, rather than once per micro-batch (torchgpipe's DeferredBatchNorm);
  // each micro-batch is still normalised by its own. Not with cuda_graphs.
  TORCH_ARG(bool, deferred_batch_norm) = false;
  // Groups of global parameter names ("0.weight", "7.weight") to train as one parameter, for
  // ties the Pipe cannot see: layers that hold tensors of their own. The same tensor registered
  // in several layers is found without declaring it (tied_parameters.h).
  TORCH_ARG(std::vector<std::vector<std::string>>, tied_parameters) = {};
  // Where this stage records its forward, backward, send and receive spans (trace.h); null: none.
  TORCH_ARG(std::shared_ptr<Trace>, trace) = nullptr;
};

// Runs on the last stage once per micro-batch: given the pipeline's output for that micro-batch,
// returns its loss as a mean over the micro-batch's samples. The pipe scales it by the
// micro-batch's share of the batch, so gradients equal those of the full-batch mean loss.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const MicroBatch& microbatch)>;

// Runs on the last stage once per micro-batch of a forward-only pass, with its output.
using OutputFn = std::function<void(const at::Tensor& output, const MicroBatch& microbatch)>;

class Pipe {
 public:
  // `world` has one rank per virtual_stages stages, placed by the schedule, each on the world's
  // device.
  Pipe(torch::nn::Sequential sequential, PipeOptions options, std::shared_ptr<World> world);
  ~Pipe();
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  // Forward and backward of one batch through all stages. Stage 0 reads `input`; the others
  // ignore it (pass an undefined tensor). Returns the batch's loss on the last stage (detached) and
  // an undefined tensor elsewhere. Gradients accumulate into this stage's parameters.
  at::Tensor forward_backward(const at::Tensor& input, int64_t batch_size, const LossFn& loss_fn);

  // Forward only, for evaluation: no autograd graph and no recomputation, micro-batches in order.
  void forward(const at::Tensor& input, int64_t batch_size, const OutputFn& on_output);

  // Gives every copy of a tied parameter the sum of all copies' gradients (tied_parameters.h), so
  // the copies on different stages take the same optimizer step. Call it once before each
  // optimizer step, after the batches it accumulates; every stage calls it.
  void reduce_tied_gradients();
  // The parameters used by layers of several stages (or declared tied), and this stage's copies.
  const TiedGradients& tied_parameters() const { return *tied_; }

  // Runs just before this stage's last backward of every forward_backward(): data parallelism
  // starts reducing gradients from there, once no other micro-batch will add to them.
  void set_last_backward_hook(std::function<void()> hook) { last_backward_hook_ = std::move(hook); }

  // This process's layers (of all its stages), named by their index in the whole Sequential
  // ("3.weight").
  const torch::nn::Sequential& stage_module() const { return stage_module_; }
  // Each once, even when several layers share one (what an optimizer takes).
  std::vector<at::Tensor> parameters() const;

  // How this rank's stages run, decided at construction: "eager", "CUDA graphs", or why CUDA
  // graphs that were asked for are not used ("eager (not using CUDA graphs: ...)"). At the first
  // step graphs may still step aside (a stage whose inputs or outputs they cannot capture),
  // saying so then and here.
  const std::string& execution() const { return execution_report_; }

  // The schedule the next step runs: the option's, or, under "auto", the one it is timing or has
  // chosen.
  const std::string& schedule() const { return schedule_name_; }
  // Under "auto", whether it is still timing steps to choose (profiling, or trying finalists).
  bool choosing_schedule() const;

  int64_t stages() const { return static_cast<int64_t>(balance_.size()); }
  // The rank that runs `stage`, as the schedule places it.
  int64_t rank_of_stage(int64_t stage) const { return rank_of_stage_.at(stage); }
  // Whether this rank runs the first stage (it reads the input) / the last (it has the output).
  bool is_first_stage() const { return rank_ == rank_of_stage(0); }
  bool is_last_stage() const { return rank_ == rank_of_stage(stages() - 1); }
  const std::vector<int64_t>& balance() const { return balance_; }

 private:
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
