// How the Trainer places a model on processes and devices, chosen by name as in Lightning
// (`strategy="pipe"`). New strategies register a factory under a name of their own.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/data.h"

namespace pipetrain {

class Module;
class LoggedMetrics;
class World;
struct TrainerOptions;

class Strategy {
 public:
  virtual ~Strategy() = default;

  // Processes this strategy runs on (the Trainer launches them when no launcher did).
  virtual int64_t world_size() const = 0;
  // Places `module` on this process: after it, module.forward() and module.parameters() mean what
  // they mean for this rank.
  virtual void setup(Module& module, std::shared_ptr<World> world) = 0;
  // Forward and backward of one batch, gradients left in parameters(); log() calls go to `metrics`.
  virtual void training_step(Module& module, const Batch& batch, int64_t batch_idx,
                             LoggedMetrics& metrics) = 0;
  // The step's logged values as sample-weighted means, on rank 0; empty on the other ranks. Every
  // rank calls it on the same steps.
  virtual std::map<std::string, double> reduce_metrics(const LoggedMetrics& metrics) = 0;
  // A line describing the placement, printed once by rank 0.
  virtual std::string describe() const = 0;
};

// Builds a strategy from the Trainer's options; throws std::invalid_argument on options it cannot
// honour (e.g. `single` with 2 devices).
using StrategyFactory = std::function<std::unique_ptr<Strategy>(const TrainerOptions&)>;

void register_strategy(const std::string& name, StrategyFactory factory);
// Throws std::invalid_argument naming the registered strategies when `name` is unknown.
std::unique_ptr<Strategy> create_strategy(const std::string& name, const TrainerOptions& options);
std::vector<std::string> strategy_names();

}  // namespace pipetrain
