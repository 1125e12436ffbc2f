// `pipe`: one process per stage. The user's training_step runs on the last stage once per
// micro-batch, where forward() returns the pipeline's output for that micro-batch; what it logs is
// reduced there and handed to rank 0, which writes it.
#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "pipetrain/module.h"
#include "pipetrain/pipe.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

// Metrics travel through the store as "name<TAB>hexfloat" lines: exact, and no schema to agree on.
std::string encode(const std::map<std::string, double>& metrics) {
  std::ostringstream out;
  for (const auto& [name, value] : metrics) {
    char number[64];
    std::snprintf(number, sizeof number, "%a", value);
    out << name << '\t' << number << '\n';
  }
  return out.str();
}

std::map<std::string, double> decode(const std::string& text) {
  std::map<std::string, double> metrics;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto tab = line.find('\t');
    metrics[line.substr(0, tab)] = std::strtod(line.c_str() + tab + 1, nullptr);
  }
  return metrics;
}

class PipeStrategy : public Strategy {
 public:
  explicit PipeStrategy(const TrainerOptions& options)
      : options_(options.pipe()), stages_(options.devices()) {}

  int64_t world_size() const override { return stages_; }

  void setup(Module& module, std::shared_ptr<World> world) override {
    world_ = std::move(world);
    broadcast_initial_weights(module);
    pipe_ = std::make_unique<Pipe>(module.layers(), options_, world_);
    module.place(
        [this](const at::Tensor& input) {
          if (!current_output_.defined()) {
            throw std::logic_error(
                "under strategy 'pipe', forward() runs only inside training_step, on the "
                "step's batch");
          }
          if (input.dim() == 0 || input.size(0) != current_output_.size(0)) {
            throw std::invalid_argument(
                "under strategy 'pipe', forward() must be given the step's batch.data (" +
                std::to_string(current_output_.size(0)) + " rows)");
          }
          return current_output_;
        },
        pipe_->stage_module());
  }

  void training_step(Module& module, const Batch& batch, int64_t batch_idx,
                     LoggedMetrics& metrics) override {
    const int64_t batch_size = batch.data.size(0);
    auto loss_fn = [&](const at::Tensor& output, const MicroBatch& mb) {
      const Batch micro{batch.data.slice(0, mb.begin, mb.end),
                        batch.target.slice(0, mb.begin, mb.end)};
      current_output_ = output;
      module.set_log_target(&metrics, mb.size());
      at::Tensor loss;
      try {
        loss = module.training_step(micro, batch_idx);
      } catch (...) {
        current_output_ = at::Tensor();
        module.set_log_target(nullptr, 0);
        throw;
      }
      current_output_ = at::Tensor();
      module.set_log_target(nullptr, 0);
      return loss;
    };
    pipe_->forward_backward(batch.data, batch_size, loss_fn);
  }

  std::map<std::string, double> reduce_metrics(const LoggedMetrics& metrics) override {
    const int64_t last = pipe_->stages() - 1;
    if (last == 0) return metrics.means();
    const std::string key = "pipetrain/metrics/" + std::to_string(reductions_++);
    auto& store = world_->store();
    if (pipe_->is_last_stage()) {
      const auto text = encode(metrics.means());
      store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
    }
    if (!world_->is_global_zero()) return {};
    const auto bytes = store->get(key);
    store->deleteKey(key);
    return decode(std::string(bytes.begin(), bytes.end()));
  }

  std::string describe() const override {
    return "strategy pipe: " + std::to_string(pipe_->stages()) + " stages, balance " +
           join(pipe_->balance()) + ", chunks " + std::to_string(options_.chunks()) +
           ", schedule " + options_.schedule() + ", checkpoint " + options_.checkpoint();
  }

 private:
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

  PipeOptions options_;
  int64_t stages_;
  std::shared_ptr<World> world_;
  std::unique_ptr<Pipe> pipe_;
  at::Tensor current_output_;
  int64_t reductions_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_pipe_strategy(const TrainerOptions& options) {
  const auto& pipe = options.pipe();
  if (options.devices() < 1) {
    throw std::invalid_argument("devices must be at least 1 (got " +
                                std::to_string(options.devices()) + ")");
  }
  if (!pipe.balance().empty() && static_cast<int64_t>(pipe.balance().size()) != options.devices()) {
    throw std::invalid_argument("devices (" + std::to_string(options.devices()) +
                                ") disagrees with balance " + join(pipe.balance()) + " (" +
                                std::to_string(pipe.balance().size()) +
                                " stages): give one balance entry per device");
  }
  if (pipe.chunks() < 1) {
    throw std::invalid_argument("chunks must be at least 1 (got " + std::to_string(pipe.chunks()) +
                                ")");
  }
  parse_checkpoint_mode(pipe.checkpoint());
  make_schedule(pipe.schedule(), 1, 1);
  return std::make_unique<PipeStrategy>(options);
}

}  // namespace pipetrain
