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

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

class World;
class Trace;
class TiedGradients;

// One micro-batch of a batch: rows [begin, end) of it. A batch is cut along dim 0 into exactly
// `chunks` pieces whose sizes differ by at most one (the first batch_size % chunks get one row
// more), so the schedule built for `chunks` micro-batches is the one that runs.
struct MicroBatch {
  int64_t index = 0;  // position in the batch, 0-based
  int64_t begin = 0;  // first sample (inclusive)
  int64_t end = 0;    // last sample (exclusive)
  int64_t size() const { return end - begin; }
  // Its share of a batch of `batch_size` rows: what the Pipe scales its mean loss by (LossFn).
  double share_of(int64_t batch_size) const {
    return static_cast<double>(size()) / static_cast<double>(batch_size);
  }
};

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
  // max_in_flight, the fastest runs from then on, or, where several are predicted within 1% of it,
  // each runs two more steps and the one measured fastest does. Rank 0 prints the predictions
  // and measurements (src/pipeline/schedule_choice.h). One stage per rank, no CUDA graphs.
  TORCH_ARG(std::string, schedule) = "gpipe";
  // The most micro-batches' activations one stage may hold at once (activations_held in
  // schedule.h: 1f1b's and zbh1's first stage hold min(ranks, chunks), zbh2's up to 2 ranks - 1,
  // gpipe's chunks): a schedule that holds more is refused, and "auto" picks among those that
  // fit. 0: no limit.
  TORCH_ARG(int64_t, max_in_flight) = 0;
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
  // (src/ops/fused_linear.h) instead of adding each micro-batch's gradient afterwards. A stage
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
  // Where this stage records its forward, backward, send and receive spans; null: none. The
  // Trainer sets it from TrainerOptions::trace (a Chrome-trace file), which is how users ask.
  TORCH_ARG(std::shared_ptr<Trace>, trace) = nullptr;
};

// The rank of the pipeline (of `ranks` processes) running each stage under `options`: stage s on
// rank s, or where interleaved and V-shaped schedules (or a schedule file) place it. What a model
// built per rank needs to know before any Pipe exists: which layers each process builds.
std::vector<int64_t> stage_ranks(const PipeOptions& options, int64_t ranks);

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
  // The same, for callers that weigh the micro-batches themselves: what `contribution` returns is
  // backpropagated as it is, unscaled, and the sum of them returned (the Trainer's strategies: a
  // mean by its share of the global batch, a sum_over() sum as a sum).
  at::Tensor forward_backward_unscaled(const at::Tensor& input, int64_t batch_size,
                                       const LossFn& contribution);

  // Forward only, for evaluation: no autograd graph and no recomputation, micro-batches in order.
  void forward(const at::Tensor& input, int64_t batch_size, const OutputFn& on_output);

  // Gives every copy of a tied parameter the sum of all copies' gradients, so the copies on
  // different stages take the same optimizer step. Call it once before each optimizer step, after
  // the batches it accumulates; every stage calls it.
  void reduce_tied_gradients();
  // The parameters used by layers of several stages (or declared tied), and this stage's copies.
  const TiedGradients& tied_parameters() const;

  // Runs just before this stage's last backward of every forward_backward(): data parallelism
  // starts reducing gradients from there, once no other micro-batch will add to them.
  void set_last_backward_hook(std::function<void()> hook);

  // This process's layers (of all its stages), named by their index in the whole Sequential
  // ("3.weight").
  const torch::nn::Sequential& stage_module() const;
  // Each once, even when several layers share one (what an optimizer takes).
  std::vector<at::Tensor> parameters() const;

  // How this rank's stages run, decided at construction: "eager", "CUDA graphs", or why CUDA
  // graphs that were asked for are not used ("eager (not using CUDA graphs: ...)"). At the first
  // step graphs may still step aside (a stage whose inputs or outputs they cannot capture),
  // saying so then and here.
  const std::string& execution() const;

  // The schedule the next step runs: the option's, or, under "auto", the one it is timing or has
  // chosen.
  const std::string& schedule() const;
  // Under "auto", whether it is still timing steps to choose (profiling, or trying finalists).
  bool choosing_schedule() const;

  int64_t stages() const;
  // The rank that runs `stage`, as the schedule places it.
  int64_t rank_of_stage(int64_t stage) const;
  // Whether this rank runs the first stage (it reads the input) / the last (it has the output).
  bool is_first_stage() const;
  bool is_last_stage() const;
  const std::vector<int64_t>& balance() const;

  class Impl;  // src/pipeline/pipe_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipetrain
