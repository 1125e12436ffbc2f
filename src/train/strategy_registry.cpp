// The name -> factory table behind TrainerOptions::strategy. Built-ins are added when the table is
// first used, so registering from another translation unit never races static initialisation.
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "pipetrain/strategy.h"

namespace pipetrain {

std::unique_ptr<Strategy> make_single_strategy(const TrainerOptions& options);
std::unique_ptr<Strategy> make_pipe_strategy(const TrainerOptions& options);
std::unique_ptr<Strategy> make_ddp_strategy(const TrainerOptions& options);
std::unique_ptr<Strategy> make_ddp_pipe_strategy(const TrainerOptions& options);

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, StrategyFactory> factories{{"single", make_single_strategy},
                                                   {"pipe", make_pipe_strategy},
                                                   {"ddp", make_ddp_strategy},
                                                   {"ddp_pipe", make_ddp_pipe_strategy}};
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void register_strategy(const std::string& name, StrategyFactory factory) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> strategy_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.factories) names.push_back(entry.first);
  return names;
}

std::unique_ptr<Strategy> create_strategy(const std::string& name, const TrainerOptions& options) {
  StrategyFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::ostringstream message;
    message << "unknown strategy '" << name << "': registered strategies are ";
    const auto names = strategy_names();
    for (size_t i = 0; i < names.size(); ++i) message << (i ? ", " : "") << names[i];
    throw std::invalid_argument(message.str());
  }
  return factory(options);
}

}  // namespace pipetrain
