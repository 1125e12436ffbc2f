#include "pipeline/tied_parameters.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include "distributed/world_connection.h"
#include "pipetrain/error.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/world.h"

namespace pipetrain {
namespace {

int64_t layer_of(const std::string& name) { return std::stoll(name.substr(0, name.find('.'))); }

bool holds(const std::vector<at::Tensor>& tensors, const at::Tensor& tensor) {
  for (const auto& t : tensors) {
    if (t.is_same(tensor)) return true;
  }
  return false;
}

// ", whose layer 2 has weight, bias" where `name` ("2.weigth") names a layer of `sequential`.
std::string parameters_of_its_layer(const torch::nn::Sequential& sequential,
                                    const std::string& name) {
  const auto dot = name.find('.');
  if (dot == 0 || dot == std::string::npos || name.find_first_not_of("0123456789") != dot) {
    return "";
  }
  const int64_t layer = std::stoll(name.substr(0, dot));
  if (layer >= static_cast<int64_t>(sequential->size())) {
    return " (the Sequential has " + std::to_string(sequential->size()) + " layers)";
  }
  std::string own;
  for (const auto& item : (sequential->begin() + layer)->ptr()->named_parameters()) {
    own += (own.empty() ? "" : ", ") + item.key();
  }
  return ", whose layer " + std::to_string(layer) + " has " +
         (own.empty() ? std::string("no parameters") : own);
}

// Groups of indices, merged as ties are found (union-find).
class Groups {
 public:
  explicit Groups(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  size_t root(size_t i) { return parent_[i] == i ? i : parent_[i] = root(parent_[i]); }
  void join(size_t a, size_t b) {
    a = root(a);
    b = root(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);  // the earliest name leads
  }

 private:
  std::vector<size_t> parent_;
};

}  // namespace

std::vector<TiedParameter> find_tied_parameters(
    const torch::nn::Sequential& sequential, const std::vector<int64_t>& balance,
    const std::vector<std::vector<std::string>>& declared,
    const std::vector<int64_t>& rank_of_stage) {
  // Where each layer runs: its stage, or the rank running that stage.
  std::vector<int64_t> stage_of_layer;
  for (size_t s = 0; s < balance.size(); ++s) {
    const int64_t where = rank_of_stage.empty() ? static_cast<int64_t>(s) : rank_of_stage.at(s);
    stage_of_layer.insert(stage_of_layer.end(), balance[s], where);
  }
  const auto named = sequential->named_parameters();
  std::vector<std::string> names;
  std::map<std::string, size_t> index_of;
  for (const auto& item : named) {
    index_of[item.key()] = names.size();
    names.push_back(item.key());
  }
  // A declared name in a layer another process holds (a model built per rank) is taken on trust
  // here: its holder checks it, and TiedGradients compares the shapes across processes.
  for (const auto& group : declared) {
    for (const auto& name : group) {
      if (index_of.count(name)) continue;
      if (!held_elsewhere(sequential, name)) {
        throw std::invalid_argument("a tie (LayerSpec::tie, PipeOptions::tied_parameters) names '" +
                                    name + "', which the model does not have" +
                                    parameters_of_its_layer(sequential, name) +
                                    ": name parameters by their place in the whole Sequential, "
                                    "e.g. '0.weight'");
      }
      index_of[name] = names.size();
      names.push_back(name);
    }
  }
  Groups groups(names.size());
  std::map<const c10::TensorImpl*, size_t> first_with;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto [first, inserted] = first_with.emplace(named[i].value().unsafeGetTensorImpl(), i);
    if (!inserted) groups.join(first->second, i);
  }
  for (const auto& group : declared) {
    for (const auto& name : group) {
      if (named.contains(name) && named.contains(group.front())) {
        const auto& lead = named[group.front()];
        const auto& tensor = named[name];
        if (!tensor.sizes().equals(lead.sizes()) || tensor.scalar_type() != lead.scalar_type()) {
          throw std::invalid_argument("PipeOptions::tied_parameters ties '" + name + "' " +
                                      shape_text(tensor.sizes()) + " to '" + group.front() + "' " +
                                      shape_text(lead.sizes()) +
                                      ": tied parameters need the same shape and dtype");
        }
      }
      groups.join(index_of.at(group.front()), index_of.at(name));
    }
  }
  // Every process must see the same ties with the same first names in the same order: names go
  // in the model's order, by layer, then as the layer lists them (a name of a layer held
  // elsewhere, after them).
  const auto model_order = [&](const std::string& a, const std::string& b) {
    return std::make_pair(layer_of(a), index_of.at(a)) <
           std::make_pair(layer_of(b), index_of.at(b));
  };
  std::map<size_t, TiedParameter> by_root;
  for (size_t i = 0; i < names.size(); ++i) by_root[groups.root(i)].names.push_back(names[i]);
  std::vector<TiedParameter> ties;
  for (auto& [root, tie] : by_root) {
    if (tie.names.size() < 2) continue;
    std::sort(tie.names.begin(), tie.names.end(), model_order);
    for (const auto& name : tie.names) {
      const int64_t stage = stage_of_layer.at(layer_of(name));
      if (std::find(tie.stages.begin(), tie.stages.end(), stage) == tie.stages.end()) {
        tie.stages.push_back(stage);
      }
    }
    tie.first_stage = stage_of_layer.at(layer_of(tie.names.front()));
    std::sort(tie.stages.begin(), tie.stages.end());
    ties.push_back(std::move(tie));
  }
  std::sort(ties.begin(), ties.end(), [&](const TiedParameter& a, const TiedParameter& b) {
    return model_order(a.names.front(), b.names.front());
  });
  return ties;
}

std::vector<at::Tensor> distinct_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> distinct;
  for (const auto& t : tensors) {
    if (!holds(distinct, t)) distinct.push_back(t);
  }
  return distinct;
}

struct TiedGradients::Local {
  const TiedParameter* tie = nullptr;
  std::vector<at::Tensor> tensors;  // this stage's distinct tensors of the tie, in name order
  bool holds_first_name = false;    // then tensors[0] is the one a whole-model sum counts
  std::shared_ptr<World> stages;    // the stages sharing it; null when this stage alone holds it
};

namespace {

// Gives this stage's copies of `tie` the values of the copy on its first stage, after checking
// that every stage's copies have its shape and dtype.
void start_from_first_copy(const TiedParameter& tie, const std::vector<at::Tensor>& tensors,
                           const World& stages, int64_t stage) {
  const auto root = static_cast<int64_t>(
      std::find(tie.stages.begin(), tie.stages.end(), tie.first_stage) - tie.stages.begin());
  const at::Tensor& here = tensors.front();
  const std::string shape = shape_text(here.sizes()) + " " + c10::toString(here.scalar_type());
  const std::string first_shape = stages.broadcast(shape, root);
  const bool fits = stages.all_reduce_sum(first_shape == shape ? 0.0 : 1.0) == 0;
  if (!fits) {
    throw std::invalid_argument("PipeOptions::tied_parameters ties " + tie.names.front() + " (" +
                                first_shape + ") to names whose tensors on stage " +
                                std::to_string(stage) + " are " + shape +
                                " on some stage: tied parameters need the same shape and dtype");
  }
  stages.broadcast_into(here, root);
  for (const auto& t : tensors) {
    if (!t.is_same(here)) t.copy_(here);
  }
}

// Whether any of `stages` used its copies of a tie, each saying whether it did (`used_here`): a
// collective, whose sum a stage reads (a host wait) only where it did not.
bool used_on_any_stage(const World& stages, bool used_here) {
  const auto used =
      stages.all_reduce_sum_on_device(torch::full({1}, used_here ? 1.0 : 0.0, torch::kFloat64));
  return used_here || used.item<double>() > 0;
}

const char* const kFreezeAlike =
    "set requires_grad alike on every name of the tie (freeze all of them or none)";

// Why the copies of `tie` cannot train as one parameter: some `what`, others `others`.
std::string copies_disagree(const TiedParameter& tie, const std::string& what,
                            const std::string& others, const std::string& what_to_do) {
  std::string names;
  for (const auto& name : tie.names) names += (names.empty() ? "" : ", ") + name;
  return "the tied parameter " + names + " trains as one parameter, but some of its copies " +
         what + " and others " + others + ", so they would train apart: " + what_to_do;
}

}  // namespace

TiedGradients::TiedGradients(std::vector<TiedParameter> ties, const torch::nn::Sequential& whole,
                             const torch::nn::Sequential& stage_module, int64_t stage,
                             const std::shared_ptr<World>& pipeline)
    : ties_(std::move(ties)) {
  torch::NoGradGuard no_grad;
  const auto all = whole->named_parameters();
  const auto mine = stage_module->named_parameters();
  std::map<std::vector<int64_t>, std::shared_ptr<World>> groups;
  for (const auto& tie : ties_) {
    // Declared ties between tensors of their own start from the first name's values: here, where
    // this process holds it (a model built per rank holds only its own layers)...
    if (all.contains(tie.names.front())) {
      const auto& first = all[tie.names.front()];
      for (const auto& name : tie.names) {
        if (all.contains(name) && !all[name].is_same(first)) all[name].copy_(first);
      }
    }
    if (std::find(tie.stages.begin(), tie.stages.end(), stage) == tie.stages.end()) continue;
    Local local;
    local.tie = &tie;
    local.holds_first_name = mine.contains(tie.names.front());
    for (const auto& name : tie.names) {
      if (mine.contains(name) && !holds(local.tensors, mine[name])) {
        local.tensors.push_back(mine[name]);
      }
    }
    if (tie.stages.size() > 1) {
      auto& group = groups[tie.stages];
      if (!group) {
        std::vector<int64_t> ranks;
        std::string name = "tied";
        for (const int64_t s : tie.stages) {
          ranks.push_back(pipeline->global_rank(s));
          name += "-" + std::to_string(s);
        }
        group = pipeline->group(ranks, name);
      }
      local.stages = group;
      // ... and from the stage holding it, on the others.
      start_from_first_copy(tie, local.tensors, *group, stage);
    }
    local_.push_back(std::move(local));
  }
}

TiedGradients::~TiedGradients() = default;

void TiedGradients::reduce() {
  torch::NoGradGuard no_grad;
  for (auto& local : local_) {
    // A frozen parameter has no gradient to share, and gets none: an optimizer would step it.
    // Frozen here but used elsewhere (frozen after the first step's check), the copies would part:
    // the stage that sees it says so, and the others' sum fails when it stops.
    if (!local.tensors.front().requires_grad()) {
      if (local.stages && used_on_any_stage(*local.stages, false)) {
        throw std::invalid_argument(copies_disagree(*local.tie, "are frozen (requires_grad false)",
                                                    "use gradients", kFreezeAlike));
      }
      continue;
    }
    at::Tensor sum;
    for (const auto& t : local.tensors) {
      if (!t.grad().defined()) continue;
      sum = sum.defined() ? sum + t.grad() : t.grad();
    }
    // A tie no copy used this step keeps no gradient, as in one process: an optimizer steps a
    // gradient of zeros (weight decay, moments) where it skips a parameter without one. Whether
    // another stage used it is read only where no copy here did (a host wait), never in a step
    // that used it here.
    const bool used_here = sum.defined();
    if (!(local.stages ? used_on_any_stage(*local.stages, used_here) : used_here)) continue;
    if (!used_here) sum = torch::zeros_like(local.tensors.front());
    if (local.stages) {
      // In place: with one tensor here, sum is its gradient.
      std::vector<at::Tensor> buffer{on_wire(sum)};
      try {
        wait(*local.stages, process_group(*local.stages)->allreduce(buffer));
      } catch (const std::exception& e) {
        local.stages->fail("sum tied gradients with", e);
      }
      back_from_wire(sum, buffer[0]);
    }
    for (const auto& t : local.tensors) {
      if (!t.grad().defined()) {
        t.mutable_grad() = sum.clone();
      } else if (!t.grad().is_same(sum)) {
        t.grad().copy_(sum);
      }
    }
  }
}

void TiedGradients::check_trained_alike(const std::vector<at::Tensor>& optimized) const {
  for (const auto& local : local_) {
    double trained = 0;
    double given = 0;
    for (const auto& t : local.tensors) {
      trained += t.requires_grad() ? 1 : 0;
      given += holds(optimized, t) ? 1 : 0;
    }
    std::vector<double> counts{static_cast<double>(local.tensors.size()), trained, given};
    if (local.stages) counts = local.stages->all_reduce_sum(torch::tensor(counts, torch::kFloat64));
    const double copies = counts[0];
    if (counts[1] != 0 && counts[1] != copies) {
      throw std::invalid_argument(
          copies_disagree(*local.tie, "are frozen (requires_grad false)", "are not", kFreezeAlike));
    }
    if (counts[1] != 0 && counts[2] != 0 && counts[2] != copies) {
      throw std::invalid_argument(
          copies_disagree(*local.tie, "are given to the optimizer", "are not",
                          "give configure_optimizers' optimizer every copy or none: build it from "
                          "parameters(), which holds this process's copies"));
    }
  }
}

bool TiedGradients::is_extra_copy(const at::Tensor& parameter) const {
  for (const auto& local : local_) {
    if (!holds(local.tensors, parameter)) continue;
    return !(local.holds_first_name && local.tensors.front().is_same(parameter));
  }
  return false;
}

}  // namespace pipetrain
