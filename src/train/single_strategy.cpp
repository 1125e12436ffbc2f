// `single`: the whole model in this one process, the whole batch in one forward and backward.
// It is the reference every other strategy must match.
#include <torch/torch.h>

#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

class SingleStrategy : public Strategy {
 public:
  int64_t world_size() const override { return 1; }

  void setup(Module& module, std::shared_ptr<World>) override {
    module.place([&module](const at::Tensor& x) { return module.layers()->forward(x); },
                 module.layers());
  }

  void training_step(Module& module, const Batch& batch, int64_t batch_idx,
                     LoggedMetrics& metrics) override {
    module.set_log_target(&metrics, batch.data.size(0));
    const at::Tensor loss = module.training_step(batch, batch_idx);
    module.set_log_target(nullptr, 0);
    loss.backward();
  }

  std::map<std::string, double> reduce_metrics(const LoggedMetrics& metrics) override {
    return metrics.means();
  }

  std::string describe() const override { return "strategy single: 1 process"; }
};

}  // namespace

std::unique_ptr<Strategy> make_single_strategy(const TrainerOptions& options) {
  if (options.devices() != 1) {
    throw std::invalid_argument("strategy 'single' runs on one device, but devices is " +
                                std::to_string(options.devices()) +
                                ": use --devices 1, or --strategy pipe to split the model");
  }
  return std::make_unique<SingleStrategy>();
}

}  // namespace pipetrain
