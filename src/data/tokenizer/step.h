// What every kind of tokenizer.json component is (normalizer, pre-tokenizer, post-processor,
// decoder): a step that rewrites one value in place. Each kind also has a "Sequence" of steps of
// its kind run in order, which this one template is.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pipetrain::tokenizer {

template <typename Value>
class Step {
 public:
  virtual ~Step() = default;
  virtual void apply(Value& value) const = 0;
};

template <typename Value>
class Sequence : public Step<Value> {
 public:
  // The steps `make` makes of each config of `configs`.
  template <typename Make>
  Sequence(const nlohmann::json& configs, Make make) {
    for (const auto& config : configs) steps_.push_back(make(config));
  }
  void apply(Value& value) const override {
    for (const auto& step : steps_) step->apply(value);
  }

 private:
  std::vector<std::unique_ptr<Step<Value>>> steps_;
};

// The error for a component of `kind` ("normalizer", ...) whose `type` pipetrain does not
// implement; `implemented` lists those it does.
[[noreturn]] inline void refuse_unimplemented(const std::string& kind, const std::string& type,
                                              const std::string& implemented) {
  throw std::invalid_argument("the " + kind + " '" + type + "' is not implemented (pipetrain has " +
                              implemented + ")");
}

}  // namespace pipetrain::tokenizer
