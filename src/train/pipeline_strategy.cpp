// `single` and `pipe`: the model as a pipeline of stages, one process per stage (`single` is the
// one-stage, one-micro-batch case, so both share every code path and `single` stays the reference).
// The user's steps run on the last stage once per micro-batch, where forward() returns the
// pipeline's output for that micro-batch; what they log is reduced there and broadcast.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "pipetrain/balance.h"
#include "pipetrain/module.h"
#include "pipetrain/pipe.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer_options.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

// Metrics travel as "name<TAB>hexfloat<TAB>prog_bar" lines: exact, and no schema to agree on.
std::string encode(const ReducedMetrics& metrics) {
  std::ostringstream out;
  for (const auto& [name, metric] : metrics) {
    char number[64];
    std::snprintf(number, sizeof number, "%a", metric.value);
    out << name << '\t' << number << '\t' << (metric.prog_bar ? 1 : 0) << '\n';
  }
  return out.str();
}

ReducedMetrics decode(const std::string& text) {
  ReducedMetrics metrics;
  std::istringstream in(text);
  std::string name, number;
  int prog_bar = 0;
  while (std::getline(in, name, '\t') && std::getline(in, number, '\t') && in >> prog_bar) {
    in.ignore();
    metrics[name] = {std::strtod(number.c_str(), nullptr), prog_bar != 0};
  }
  return metrics;
}

// The index of the layer a global name ("3.weight") belongs to.
int64_t layer_of(const std::string& name) { return std::stoll(name.substr(0, name.find('.'))); }

class PipelineStrategy : public Strategy {
 public:
  PipelineStrategy(std::string name, int64_t stages, PipeOptions options)
      : name_(std::move(name)), stages_(stages), options_(std::move(options)) {}

  int64_t world_size() const override { return stages_; }

  void setup(Module& module, std::shared_ptr<World> world) override {
    world_ = std::move(world);
    broadcast_initial_weights(module);
    pipe_ = std::make_unique<Pipe>(module.layers(), options_, world_);
    module.place(
        [this](const at::Tensor& input) {
          if (!current_output_.defined()) {
            throw std::logic_error(
                "forward() runs only inside a step, on the step's batch.data (the Trainer "
                "computes it through the pipeline)");
          }
          if (input.dim() == 0 || input.size(0) != current_output_.size(0)) {
            throw std::invalid_argument("forward() must be given the step's batch.data (" +
                                        std::to_string(current_output_.size(0)) + " rows)");
          }
          return current_output_;
        },
        pipe_->stage_module());
  }

  void training_step(Module& module, const Batch& batch, int64_t batch_idx, double loss_scale,
                     LoggedMetrics& metrics) override {
    auto step = [&](const Batch& micro) { return module.training_step(micro, batch_idx); };
    pipe_->forward_backward(
        batch.data, batch.data.size(0), [&](const at::Tensor& output, const MicroBatch& mb) {
          return run_user_step(module, batch, mb, output, metrics, step) * loss_scale;
        });
  }

  void evaluation_step(Module& module, const Batch& batch, int64_t batch_idx,
                       const EvaluationStep& step, LoggedMetrics& metrics) override {
    auto evaluate = [&](const Batch& micro) {
      step(micro, batch_idx);
      return at::Tensor();
    };
    pipe_->forward(batch.data, batch.data.size(0),
                   [&](const at::Tensor& output, const MicroBatch& mb) {
                     run_user_step(module, batch, mb, output, metrics, evaluate);
                   });
  }

  at::Tensor predict_step(Module& module, const Batch& batch, int64_t batch_idx) override {
    std::vector<at::Tensor> outputs;
    LoggedMetrics ignored;
    auto predict = [&](const Batch& micro) { return module.predict_step(micro, batch_idx); };
    pipe_->forward(batch.data, batch.data.size(0),
                   [&](const at::Tensor& output, const MicroBatch& mb) {
                     outputs.push_back(run_user_step(module, batch, mb, output, ignored, predict));
                   });
    if (pipe_->stages() == 1) return torch::cat(outputs);
    if (pipe_->is_last_stage()) pipe_->send_to(torch::cat(outputs), 0);
    if (world_->is_global_zero()) return pipe_->recv_from(pipe_->stages() - 1);
    return {};
  }

  ReducedMetrics reduce_metrics(const LoggedMetrics& metrics) override {
    const int64_t last = pipe_->stages() - 1;
    if (last == 0) return metrics.reduce();
    const std::string text = pipe_->is_last_stage() ? encode(metrics.reduce()) : std::string();
    return decode(world_->broadcast(text, last));
  }

  double gradient_norm(Module& module) override {
    double sum_of_squares = 0;
    for (const auto& p : module.parameters()) {
      if (p.grad().defined())
        sum_of_squares += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    }
    return std::sqrt(world_->all_reduce_sum(sum_of_squares));
  }

  std::map<std::string, at::Tensor> gather_weights(Module& module) override {
    torch::NoGradGuard no_grad;
    auto everything = module.layers()->named_parameters();
    for (const auto& b : module.layers()->named_buffers()) everything.insert(b.key(), b.value());
    // Rank 0 keeps a copy of every layer; the other stages send theirs into it.
    for (int64_t stage = 1; stage < pipe_->stages(); ++stage) {
      const int64_t first = first_layer_of(stage);
      const int64_t end = first + pipe_->balance()[stage];
      if (world_->rank() == stage) {
        for (const auto& item : everything) {
          const int64_t layer = layer_of(item.key());
          if (layer >= first && layer < end) pipe_->send_to(item.value(), 0);
        }
      } else if (world_->is_global_zero()) {
        for (const auto& item : everything) {
          const int64_t layer = layer_of(item.key());
          if (layer >= first && layer < end) item.value().copy_(pipe_->recv_from(stage));
        }
      }
    }
    std::map<std::string, at::Tensor> weights;
    if (!world_->is_global_zero()) return weights;
    for (const auto& item : everything) weights[item.key()] = item.value().detach().clone();
    return weights;
  }

  std::map<std::string, std::string> layout() const override {
    return {{"stages", std::to_string(pipe_->stages())},
            {"balance", format_balance(pipe_->balance())}};
  }

  std::string describe() const override {
    if (pipe_->stages() == 1 && options_.chunks() == 1) return "strategy " + name_ + ": 1 process";
    return "strategy " + name_ + ": " + std::to_string(pipe_->stages()) + " stages, balance " +
           format_balance(pipe_->balance()) + ", chunks " + std::to_string(options_.chunks()) +
           ", schedule " + options_.schedule() + ", checkpoint " + options_.checkpoint();
  }

 private:
  // Runs one of the user's steps on micro-batch `mb` of `batch`, forward() yielding `output` and
  // log() going to `metrics` weighted by the micro-batch's rows.
  template <typename Step>
  at::Tensor run_user_step(Module& module, const Batch& batch, const MicroBatch& mb,
                           const at::Tensor& output, LoggedMetrics& metrics, const Step& step) {
    const Batch micro{batch.data.slice(0, mb.begin, mb.end),
                      batch.target.slice(0, mb.begin, mb.end)};
    current_output_ = output;
    module.set_log_target(&metrics, mb.size());
    struct Reset {
      PipelineStrategy* self;
      Module& module;
      ~Reset() {
        self->current_output_ = at::Tensor();
        module.set_log_target(nullptr, 0);
      }
    } reset{this, module};
    return step(micro);
  }

  int64_t first_layer_of(int64_t stage) const {
    int64_t first = 0;
    for (int64_t s = 0; s < stage; ++s) first += pipe_->balance()[s];
    return first;
  }

  // Every rank built the whole model; rank 0's weights become everyone's, as DDP does, so a rank
  // seeded differently cannot silently train different initial weights.
  void broadcast_initial_weights(Module& module) {
    if (world_->size() == 1) return;
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors = module.layers()->parameters();
    for (const auto& b : module.layers()->buffers()) tensors.push_back(b);
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      world_->process_group()->broadcast(one)->wait(world_->timeout());
    }
  }

  std::string name_;
  int64_t stages_;
  PipeOptions options_;
  std::shared_ptr<World> world_;
  std::unique_ptr<Pipe> pipe_;
  at::Tensor current_output_;
};

}  // namespace

std::unique_ptr<Strategy> make_single_strategy(const TrainerOptions& options) {
  if (options.devices() != 1) {
    throw std::invalid_argument("strategy 'single' runs on one device, but devices is " +
                                std::to_string(options.devices()) +
                                ": use --devices 1, or --strategy pipe to split the model");
  }
  return std::make_unique<PipelineStrategy>(
      "single", 1, PipeOptions().chunks(1).checkpoint("never").schedule("gpipe"));
}

std::unique_ptr<Strategy> make_pipe_strategy(const TrainerOptions& options) {
  const auto& pipe = options.pipe();
  if (options.devices() < 1) {
    throw std::invalid_argument("devices must be at least 1 (got " +
                                std::to_string(options.devices()) + ")");
  }
  if (!pipe.balance().empty() && static_cast<int64_t>(pipe.balance().size()) != options.devices()) {
    throw std::invalid_argument("devices (" + std::to_string(options.devices()) +
                                ") disagrees with balance " + format_balance(pipe.balance()) +
                                " (" + std::to_string(pipe.balance().size()) +
                                " stages): give one balance entry per device");
  }
  if (pipe.chunks() < 1) {
    throw std::invalid_argument("chunks must be at least 1 (got " + std::to_string(pipe.chunks()) +
                                ")");
  }
  parse_checkpoint_mode(pipe.checkpoint());
  make_schedule(pipe.schedule(), 1, 1);
  return std::make_unique<PipelineStrategy>("pipe", options.devices(), pipe);
}

}  // namespace pipetrain
