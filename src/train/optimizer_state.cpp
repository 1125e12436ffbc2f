#include "train/optimizer_state.h"

#include "pipetrain/fused_adamw.h"

#include <c10/util/Type.h>
#include <torch/optim.h>

#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>

namespace pipetrain {
namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using Fields = std::vector<std::pair<const char*, at::Tensor*>>;
using FieldNames = std::vector<const char*>;

constexpr int64_t kFormatVersion = 1;

// What this file needs to know about one built-in optimizer. The states' own serialize() does the
// writing and reading; the rest is for checks and device moves, which it cannot do.
struct Kind {
  const char* name;  // written to the archive; also how messages name it
  const std::type_info& type;
  std::unique_ptr<OptimizerParamState> (*make_state)();
  // Every tensor field of a state, defined or not.
  Fields (*tensors)(OptimizerParamState& state);
  // The fields step() reads for a parameter whose group has these options: a state without one
  // of them would fail later, deep inside step(), or silently train differently.
  FieldNames (*required)(const OptimizerOptions& options);
};

template <typename State>
std::unique_ptr<OptimizerParamState> make_state() {
  return std::make_unique<State>();
}

template <typename State>
State& state_as(OptimizerParamState& state) {
  return static_cast<State&>(state);
}

template <typename Options>
const Options& options_as(const OptimizerOptions& options) {
  return static_cast<const Options&>(options);
}

Fields adam_tensors(OptimizerParamState& state) {
  auto& s = state_as<torch::optim::AdamParamState>(state);
  return {{"exp_avg", &s.exp_avg()},
          {"exp_avg_sq", &s.exp_avg_sq()},
          {"max_exp_avg_sq", &s.max_exp_avg_sq()}};
}

Fields adamw_tensors(OptimizerParamState& state) {
  auto& s = state_as<torch::optim::AdamWParamState>(state);
  return {{"exp_avg", &s.exp_avg()},
          {"exp_avg_sq", &s.exp_avg_sq()},
          {"max_exp_avg_sq", &s.max_exp_avg_sq()}};
}

FieldNames adam_required(bool amsgrad) {
  if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

FieldNames adamw_required(const OptimizerOptions& options) {
  return adam_required(options_as<torch::optim::AdamWOptions>(options).amsgrad());
}

const std::vector<Kind>& kinds() {
  namespace optim = torch::optim;
  static const std::vector<Kind> all = {
      {"SGD", typeid(optim::SGD), make_state<optim::SGDParamState>,
       [](OptimizerParamState& state) -> Fields {
         return {{"momentum_buffer", &state_as<optim::SGDParamState>(state).momentum_buffer()}};
       },
       [](const OptimizerOptions& options) -> FieldNames {
         // Without momentum, SGD never reads its state.
         if (options_as<optim::SGDOptions>(options).momentum() == 0) return {};
         return {"momentum_buffer"};
       }},
      {"Adam", typeid(optim::Adam), make_state<optim::AdamParamState>, adam_tensors,
       [](const OptimizerOptions& options) {
         return adam_required(options_as<optim::AdamOptions>(options).amsgrad());
       }},
      {"AdamW", typeid(optim::AdamW), make_state<optim::AdamWParamState>, adamw_tensors,
       adamw_required},
      // AdamW's state and options, stepped by a fused kernel: its checkpoints are AdamW's.
      {"AdamW", typeid(FusedAdamW), make_state<optim::AdamWParamState>, adamw_tensors,
       adamw_required},
      {"RMSprop", typeid(optim::RMSprop), make_state<optim::RMSpropParamState>,
       [](OptimizerParamState& state) -> Fields {
         auto& s = state_as<optim::RMSpropParamState>(state);
         return {{"square_avg", &s.square_avg()},
                 {"momentum_buffer", &s.momentum_buffer()},
                 {"grad_avg", &s.grad_avg()}};
       },
       [](const OptimizerOptions& options) {
         const auto& o = options_as<optim::RMSpropOptions>(options);
         FieldNames names = {"square_avg"};
         if (o.momentum() > 0) names.push_back("momentum_buffer");
         if (o.centered()) names.push_back("grad_avg");
         return names;
       }},
      {"Adagrad", typeid(optim::Adagrad), make_state<optim::AdagradParamState>,
       [](OptimizerParamState& state) -> Fields {
         return {{"sum", &state_as<optim::AdagradParamState>(state).sum()}};
       },
       [](const OptimizerOptions&) -> FieldNames { return {"sum"}; }},
  };
  return all;
}

// Exact types only: a subclass may keep state of another shape, so it is refused like any other.
const Kind& kind_of(const torch::optim::Optimizer& optimizer) {
  for (const auto& kind : kinds()) {
    if (typeid(optimizer) == kind.type) return kind;
  }
  throw std::runtime_error(
      "optimizer state by parameter name supports SGD, Adam, AdamW, RMSprop "
      "and Adagrad, not " +
      c10::demangle(typeid(optimizer).name()));
}

// The optimizer's state map is keyed by the parameter's TensorImpl: as a string in libtorch 1.x
// (c10::guts::to_string of the pointer, which streams it), as the pointer itself in 2.x. A
// template, so that only the branch of the libtorch at hand is compiled.
template <typename Key>
Key state_key(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << impl;
    return out.str();
  } else {
    return impl;
  }
}

template <typename StateMap>
typename StateMap::key_type key_in(const StateMap&, const at::Tensor& parameter) {
  return state_key<typename StateMap::key_type>(parameter.unsafeGetTensorImpl());
}

void check_unique_names(const NamedParameters& parameters) {
  std::unordered_map<std::string, int> seen;
  for (const auto& [name, parameter] : parameters) {
    if (++seen[name] > 1) {
      throw std::invalid_argument("optimizer state: parameter name '" + name +
                                  "' appears more than once");
    }
  }
}

std::string format_shape(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

}  // namespace

void save_optimizer_state(const torch::optim::Optimizer& optimizer,
                          const NamedParameters& parameters,
                          torch::serialize::OutputArchive& archive) {
  const Kind& kind = kind_of(optimizer);
  check_unique_names(parameters);
  const auto& states = optimizer.state();

  c10::List<std::string> names;
  torch::serialize::OutputArchive state_archive(archive.compilation_unit());
  for (const auto& [name, parameter] : parameters) {
    const auto found = states.find(key_in(states, parameter));
    if (found == states.end() || !found->second) continue;
    // On the CPU, so that a file saved on GPUs loads on any machine; load moves it back.
    auto state = found->second->clone();
    for (auto& [field, tensor] : kind.tensors(*state)) {
      if (tensor->defined()) *tensor = tensor->to(at::kCPU);
    }
    torch::serialize::OutputArchive entry(archive.compilation_unit());
    state->serialize(entry);
    state_archive.write(std::to_string(names.size()), entry);
    names.push_back(name);
  }
  archive.write("kind", c10::IValue(std::string(kind.name)));
  archive.write("version", c10::IValue(kFormatVersion));
  archive.write("names", c10::IValue(names));
  archive.write("state", state_archive);
}

int64_t load_optimizer_state(torch::optim::Optimizer& optimizer, const NamedParameters& parameters,
                             torch::serialize::InputArchive& archive) {
  const Kind& kind = kind_of(optimizer);
  check_unique_names(parameters);

  c10::IValue saved_kind;
  if (!archive.try_read("kind", saved_kind) || !saved_kind.isString()) {
    throw std::runtime_error(
        "the archive holds no optimizer state by parameter name (no 'kind' entry); it was not "
        "written by save_optimizer_state");
  }
  if (saved_kind.toStringRef() != kind.name) {
    throw std::runtime_error("the optimizer state in the archive was written by " +
                             saved_kind.toStringRef() + "; it cannot be loaded into " + kind.name +
                             " (use the optimizer the checkpoint was trained with)");
  }
  c10::IValue version;
  archive.read("version", version);
  if (!version.isInt() || version.toInt() != kFormatVersion) {
    throw std::runtime_error(
        "optimizer state: unsupported format version " +
        (version.isInt() ? std::to_string(version.toInt()) : "(not a number)"));
  }
  c10::IValue names_value;
  archive.read("names", names_value);
  std::map<std::string, size_t> index_of;
  const auto names = names_value.toListRef();
  for (size_t i = 0; i < names.size(); ++i) index_of[names[i].toStringRef()] = i;
  torch::serialize::InputArchive state_archive;
  archive.read("state", state_archive);

  // The options of the group holding each parameter; parameters the optimizer does not hold
  // (frozen ones, say) get no state, as they never step.
  std::unordered_map<c10::TensorImpl*, const OptimizerOptions*> options_of;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      options_of.emplace(parameter.unsafeGetTensorImpl(), &group.options());
    }
  }

  // Read and check everything first, so that a bad entry leaves the optimizer untouched.
  auto& states = optimizer.state();
  std::vector<std::pair<std::remove_reference_t<decltype(states)>::key_type,
                        std::unique_ptr<OptimizerParamState>>>
      loaded;
  for (const auto& [name, parameter] : parameters) {
    const auto index = index_of.find(name);
    if (index == index_of.end()) continue;
    const auto options = options_of.find(parameter.unsafeGetTensorImpl());
    if (options == options_of.end()) continue;

    torch::serialize::InputArchive entry;
    state_archive.read(std::to_string(index->second), entry);
    auto state = kind.make_state();
    state->serialize(entry);
    std::map<std::string, bool> defined;
    for (auto& [field, tensor] : kind.tensors(*state)) {
      defined[field] = tensor->defined();
      if (!tensor->defined()) continue;
      if (!tensor->sizes().equals(parameter.sizes())) {
        throw std::runtime_error("optimizer state for '" + name + "': " + field + " has shape " +
                                 format_shape(tensor->sizes()) + " but the parameter has " +
                                 format_shape(parameter.sizes()));
      }
      *tensor = parameter.is_floating_point()
                    ? tensor->to(parameter.device(), parameter.scalar_type())
                    : tensor->to(parameter.device());
    }
    for (const char* field : kind.required(*options->second)) {
      if (!defined[field]) {
        throw std::runtime_error("optimizer state for '" + name + "' has no " + field +
                                 ", which this " + kind.name +
                                 " needs with its options: the state was saved with other "
                                 "options (e.g. momentum, amsgrad, centered)");
      }
    }
    loaded.emplace_back(key_in(states, parameter), std::move(state));
  }
  for (auto& [key, state] : loaded) states[key] = std::move(state);
  return static_cast<int64_t>(loaded.size());
}

}  // namespace pipetrain
