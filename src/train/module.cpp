#include "pipetrain/module.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <string>

#include "pipeline/tied_parameters.h"

namespace pipetrain {

namespace {

at::Tensor as_float64_scalar(const at::Tensor& value) {
  return value.detach().to(torch::kFloat64).reshape({});
}

}  // namespace

void LoggedMetrics::add(const std::string& name, const at::Tensor& value, int64_t samples,
                        const LogOptions& options) {
  if (value.numel() != 1) {
    throw std::invalid_argument("log('" + name + "') needs a scalar, got a tensor of " +
                                std::to_string(value.numel()) + " elements");
  }
  accumulate(name, {as_float64_scalar(value) * samples, static_cast<double>(samples), {}}, options);
}

void LoggedMetrics::add_ratio(const std::string& name, const at::Tensor& sum,
                              const at::Tensor& count, const LogOptions& options) {
  accumulate(name, {as_float64_scalar(sum), 0, as_float64_scalar(count)}, options);
}

void LoggedMetrics::accumulate(const std::string& name, const Sum& sum, const LogOptions& options) {
  // Names travel between ranks and into CSV headers as lines of tab-separated fields.
  if (name.empty() || name.find_first_of("\t\n\r") != std::string::npos) {
    throw std::invalid_argument("log('" + name +
                                "'): a metric name must be non-empty, without tabs or line breaks");
  }
  auto& mine = sums_[name];
  mine.weighted = mine.weighted.defined() ? mine.weighted + sum.weighted : sum.weighted;
  mine.samples += sum.samples;
  if (sum.counts.defined()) {
    mine.counts = mine.counts.defined() ? mine.counts + sum.counts : sum.counts;
  }
  options_[name] = options;
}

void LoggedMetrics::merge(const LoggedMetrics& other) {
  for (const auto& [name, sum] : other.sums_) {
    accumulate(name, sum, other.options_.at(name));
  }
}

std::map<std::string, double> LoggedMetrics::means() const {
  std::map<std::string, double> means;
  for (const auto& [name, total] : totals()) means[name] = total.first / total.second;
  return means;
}

std::map<std::string, std::pair<double, double>> LoggedMetrics::totals() const {
  std::map<std::string, std::pair<double, double>> totals;
  for (const auto& [name, sum] : sums_) {
    const double counted = sum.counts.defined() ? sum.counts.item<double>() : 0;
    totals[name] = {sum.weighted.item<double>(), sum.samples + counted};
  }
  return totals;
}

ReducedMetrics LoggedMetrics::reduce() const {
  ReducedMetrics reduced;
  for (const auto& [name, mean] : means()) {
    const auto logged = logged_names_.find(name);
    reduced[name] = {mean, options_.at(name).prog_bar(),
                     logged == logged_names_.end() ? std::string() : logged->second};
  }
  return reduced;
}

namespace {

// The two rows a logged value can show in: a step's and an epoch's.
enum class Row { kStep, kEpoch };

// Lightning's defaults: training steps log per step, evaluation steps per epoch.
bool logs_in(Row row, const LogOptions& options, bool training) {
  return row == Row::kStep ? options.on_step().value_or(training)
                           : options.on_epoch().value_or(!training);
}

// Copies into `view_*` the entries of `sums` that `row` shows; one shown in both rows is named
// with the row's suffix ("_step", "_epoch"), as Lightning tells them apart, its own name kept in
// `view_logged_names`.
// A template because `Sum` is LoggedMetrics' private type, named only by its members.
template <class Sum>
void copy_row(Row row, bool training, const std::map<std::string, Sum>& sums,
              const std::map<std::string, LogOptions>& options,
              std::map<std::string, Sum>* view_sums,
              std::map<std::string, LogOptions>* view_options,
              std::map<std::string, std::string>* view_logged_names) {
  const Row other = row == Row::kStep ? Row::kEpoch : Row::kStep;
  const char* suffix = row == Row::kStep ? "_step" : "_epoch";
  for (const auto& [name, sum] : sums) {
    const auto& logged = options.at(name);
    if (!logs_in(row, logged, training)) continue;
    const bool forked = logs_in(other, logged, training);
    const auto key = forked ? name + suffix : name;
    (*view_sums)[key] = sum;
    (*view_options)[key] = logged;
    if (forked) (*view_logged_names)[key] = name;
  }
}

}  // namespace

LoggedMetrics LoggedMetrics::step_view(bool training) const {
  LoggedMetrics view;
  copy_row(Row::kStep, training, sums_, options_, &view.sums_, &view.options_, &view.logged_names_);
  return view;
}

LoggedMetrics LoggedMetrics::epoch_view(bool training) const {
  LoggedMetrics view;
  copy_row(Row::kEpoch, training, sums_, options_, &view.sums_, &view.options_,
           &view.logged_names_);
  return view;
}

Module::Module(torch::nn::Sequential layers)
    : layers_(std::move(layers)),
      local_layers_(layers_),
      forward_([this](const at::Tensor& x) { return layers_->forward(x); }) {}

Module::Module(std::vector<LayerSpec> layers)
    : Module(pipetrain::build_layers(layers, std::vector<bool>(layers.size(), false), 0)) {
  if (layers.empty()) throw std::invalid_argument("a Module needs at least one layer");
  specs_ = std::move(layers);
}

void Module::build_layers(const std::vector<bool>& held, uint64_t seed) {
  // Built once: a second Trainer of the same layout keeps the trained layers; another layout
  // would need other layers, and building them afresh would silently drop what was trained.
  if (!built_.empty()) {
    if (held == built_) return;
    throw std::logic_error(
        "this model was built per rank for another layout (its layers on this process differ): "
        "a model built per rank serves one layout; to change it, save a checkpoint, build a new "
        "model and load the checkpoint (ckpt_path)");
  }
  layers_ = pipetrain::build_layers(specs_, held, seed);
  local_layers_ = layers_;
  built_ = held;
}

void Module::validation_step(const Batch&, int64_t) {}

void Module::test_step(const Batch&, int64_t) {}

at::Tensor Module::predict_step(const Batch& batch, int64_t) { return forward(batch.data); }

at::Tensor Module::forward(const at::Tensor& input) { return forward_(input); }

std::vector<at::Tensor> Module::parameters() const {
  return distinct_tensors(local_layers_->parameters());
}

void Module::log(const std::string& name, const at::Tensor& value, const LogOptions& options) {
  if (!log_target_) {
    // A step called by hand, the module never given to a Trainer: Lightning warns and goes on.
    if (!placed_) {
      TORCH_WARN_ONCE("log(\"", name,
                      "\") records nothing outside a Trainer: the module was never fit");
      return;
    }
    // Inside a Trainer, dropping the value would leave the user's metric missing without a word.
    throw std::invalid_argument(
        "log(\"" + name +
        "\") here has nowhere to go: log() records from training_step, validation_step, "
        "test_step and the module's epoch hooks (on_train_epoch_start/end, "
        "on_validation_epoch_start/end, on_test_epoch_start/end), not from predict_step, "
        "configure_optimizers or a Callback; a Callback writes values with "
        "trainer.log_metrics(...)");
  }
  if (in_epoch_hook_) {
    if (options.on_step().value_or(false)) {
      throw std::invalid_argument("log(\"" + name +
                                  "\") with on_step(true) in an epoch's hook: a value logged "
                                  "there is the epoch's; log it per step from a step instead");
    }
    log_target_->add(name, value, 1, LogOptions(options).on_step(false).on_epoch(true));
    return;
  }
  if (summed_ && value.is_same(summed_->result)) {
    log_target_->add_ratio(name, summed_->sum, summed_->count, options);
  } else {
    log_target_->add(name, value, log_samples_, options);
  }
}

at::Tensor Module::sum_over(const at::Tensor& sum, const at::Tensor& count) {
  if (sum.numel() != 1 || count.numel() != 1) {
    throw std::invalid_argument("sum_over(sum, count) takes two scalars, got tensors of " +
                                std::to_string(sum.numel()) + " and " +
                                std::to_string(count.numel()) + " elements");
  }
  const auto count64 = count.detach().to(sum.device(), torch::kFloat64).reshape({});
  summed_ = SummedLoss{(sum.detach() / count64).to(sum.scalar_type()), sum, count64};
  return summed_->result;
}

at::Tensor Module::sum_over(const at::Tensor& sum, double count) {
  return sum_over(sum, torch::tensor(count, torch::kFloat64));
}

void Module::log(const std::string& name, double value, const LogOptions& options) {
  log(name, torch::tensor(value, torch::kFloat64), options);
}

void Module::place(ForwardFn forward, torch::nn::Sequential local_layers) {
  forward_ = std::move(forward);
  local_layers_ = std::move(local_layers);
  placed_ = true;
}

void Module::set_log_target(LoggedMetrics* metrics, int64_t samples) {
  log_target_ = metrics;
  log_samples_ = samples;
}

void Module::run_epoch_hook(void (Module::*hook)(), LoggedMetrics& metrics) {
  struct Target {
    Module& module;
    Target(Module& module, LoggedMetrics& metrics) : module(module) {
      module.set_log_target(&metrics, 1);
      module.in_epoch_hook_ = true;
    }
    ~Target() {
      module.set_log_target(nullptr, 0);
      module.in_epoch_hook_ = false;
    }
  } target(*this, metrics);
  (this->*hook)();
}

}  // namespace pipetrain
