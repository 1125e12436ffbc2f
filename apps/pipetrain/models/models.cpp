#include "models/models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/hf_decoder.h>
#include <pipetrain/hf_gpt2.h>
#include <pipetrain/language_model.h>

#include "models/token_data.h"

namespace pipetrain::cli {
namespace {

// Data comes from its own generator so it never depends on --seed or on what ran before.
at::Generator data_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// Lightning's BoringModel: a linear layer regressed towards ones on random inputs (with one hidden
// layer here, so that it has something to split into two stages).
class BoringModel : public Module {
 public:
  explicit BoringModel(double lr)
      : Module(torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 2))),
        lr_(lr) {}

  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss, LogOptions().prog_bar(true));
    return loss;
  }

  void validation_step(const Batch& batch, int64_t) override {
    log("val_loss", torch::mse_loss(forward(batch.data), batch.target),
        LogOptions().prog_bar(true));
  }

  void test_step(const Batch& batch, int64_t) override {
    log("test_loss", torch::mse_loss(forward(batch.data), batch.target));
  }

  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr_));
  }

 private:
  double lr_;
};

constexpr int64_t kMlpFeatures = 32;
constexpr int64_t kMlpHidden = 128;
constexpr int64_t kMlpClasses = 10;
constexpr int64_t kMlpLinears = 8;

// Eight Linear layers with ReLU (and optional dropout) between them, classifying points labelled
// by a fixed random linear teacher.
class MlpModel : public Module {
 public:
  MlpModel(double lr, double dropout) : Module(build(dropout)), lr_(lr) {}

  at::Tensor training_step(const Batch& batch, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(batch.data), batch.target);
    log("train_loss", loss, LogOptions().prog_bar(true));
    return loss;
  }

  void validation_step(const Batch& batch, int64_t) override { evaluate(batch, "val"); }
  void test_step(const Batch& batch, int64_t) override { evaluate(batch, "test"); }

  at::Tensor predict_step(const Batch& batch, int64_t) override {
    return forward(batch.data).argmax(1);
  }

  OptimizerConfig configure_optimizers() override {
    return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr_));
  }

 private:
  void evaluate(const Batch& batch, const std::string& prefix) {
    const auto logits = forward(batch.data);
    log(prefix + "_loss", torch::cross_entropy_loss(logits, batch.target),
        LogOptions().prog_bar(true));
    log(prefix + "_acc", logits.argmax(1).eq(batch.target).to(torch::kFloat32).mean());
  }

  static torch::nn::Sequential build(double dropout) {
    torch::nn::Sequential seq;
    for (int64_t i = 0; i < kMlpLinears; ++i) {
      const int64_t in = i == 0 ? kMlpFeatures : kMlpHidden;
      const int64_t out = i == kMlpLinears - 1 ? kMlpClasses : kMlpHidden;
      seq->push_back(torch::nn::Linear(in, out));
      if (i == kMlpLinears - 1) break;
      seq->push_back(torch::nn::ReLU());
      if (dropout > 0) seq->push_back(torch::nn::Dropout(dropout));
    }
    return seq;
  }

  double lr_;
};

std::shared_ptr<const Dataset> rows(const TensorDataset& data, int64_t begin, int64_t end) {
  return std::make_shared<TensorDataset>(data.inputs.slice(0, begin, end),
                                         data.targets.slice(0, begin, end));
}

constexpr int64_t kByteVocabulary = 256;

// A language model's data: --train-data, and --val-data or what lies beside the training data.
// Returns whether targets may be kMaskedTarget (loss masks, or document masking).
bool read_token_files(const ModelOptions& options, int64_t block_size, int64_t vocab_size,
                      BuiltInModel& built) {
  auto data = read_token_data(options.train_data, options.val_data, block_size, vocab_size);
  built.train = std::move(data.train);
  built.val = std::move(data.val);
  return data.masked;
}

std::string all_bytes() {
  std::string bytes(kByteVocabulary, '\0');
  for (int64_t b = 0; b < kByteVocabulary; ++b) bytes[b] = static_cast<char>(b);
  return bytes;
}

// The presets of one family ("llama", "qwen3"), for an error message.
std::string presets_of(const std::string& family) {
  std::string names;
  for (const auto& name : find_hub_family(family)->presets) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

// A model's shape as config.json keys it, each value (as JSON writes it) with the flag that sets
// it, so that a contradiction names both. A value no flag gives is empty.
struct ShapeValue {
  std::string key, flag, value;
};
using Shape = std::vector<ShapeValue>;

template <typename T>
std::string json_text(const T& value) {
  return nlohmann::json(value).dump();
}

Shape decoder_shape(const nn::DecoderConfig& c) {
  nlohmann::json rope_scaling = nullptr;
  if (c.rope.rope_type() != "default") {
    rope_scaling = {
        {"rope_type", c.rope.rope_type()},
        {"factor", c.rope.factor()},
        {"low_freq_factor", c.rope.low_freq_factor()},
        {"high_freq_factor", c.rope.high_freq_factor()},
        {"original_max_position_embeddings", c.rope.original_max_position_embeddings()}};
  }
  return {{"num_hidden_layers", "--n-layer", json_text(c.n_layer)},
          {"num_attention_heads", "--n-head", json_text(c.n_head)},
          {"num_key_value_heads", "--n-kv-head", json_text(c.kv_heads())},
          {"hidden_size", "--n-embd", json_text(c.n_embd)},
          {"head_dim", "--head-dim", json_text(c.head_size())},
          {"intermediate_size", "--intermediate-size", json_text(c.intermediate_size)},
          {"vocab_size", "--vocab-size", json_text(c.vocab_size)},
          {"rope_theta", "--rope-theta", json_text(c.rope.theta())},
          {"rms_norm_eps", "--rms-norm-eps", json_text(c.rms_norm_eps)},
          {"tie_word_embeddings", "--tie-word-embeddings", json_text(c.tie_word_embeddings)},
          {"attention_bias", "", json_text(c.attention_bias)},
          {"rope_scaling", "", rope_scaling.dump()}};
}

Shape gpt2_shape(const nn::Gpt2Config& c) {
  return {{"n_layer", "--n-layer", json_text(c.n_layer)},
          {"n_head", "--n-head", json_text(c.n_head)},
          {"n_embd", "--n-embd", json_text(c.n_embd)},
          {"n_positions", "--block-size", json_text(c.block_size)},
          {"vocab_size", "--vocab-size", json_text(c.vocab_size)}};
}

// What the flags say of a shape whose keys `full` has (of any model): the values of the flags
// given; with --model-size (`preset`, the preset with those flags), every value.
Shape given_shape(Shape full, const std::map<std::string, std::string>& flags,
                  const std::optional<Shape>& preset, const std::string& model_size) {
  for (size_t i = 0; i < full.size(); ++i) {
    ShapeValue& value = full[i];
    const auto flag = flags.find(value.flag);
    if (flag != flags.end()) {
      value.value = flag->second;
    } else if (preset) {
      value = {value.key, "--model-size " + model_size, (*preset)[i].value};
    } else {
      value.value.clear();
    }
  }
  return full;
}

// The values of the shape flags given.
std::map<std::string, std::string> shape_flags(const ModelOptions& o) {
  std::map<std::string, std::string> flags;
  const auto given = [&](const char* flag, bool is_given, auto value) {
    if (is_given) flags[flag] = json_text(value);
  };
  given("--n-layer", o.n_layer > 0, o.n_layer);
  given("--n-head", o.n_head > 0, o.n_head);
  given("--n-kv-head", o.n_kv_head > 0, o.n_kv_head);
  given("--n-embd", o.n_embd > 0, o.n_embd);
  given("--head-dim", o.head_dim > 0, o.head_dim);
  given("--intermediate-size", o.intermediate_size > 0, o.intermediate_size);
  given("--vocab-size", o.vocab_size > 0, o.vocab_size);
  given("--block-size", o.block_size > 0, o.block_size);
  given("--rope-theta", o.rope_theta > 0, o.rope_theta);
  given("--rms-norm-eps", o.rms_norm_eps > 0, o.rms_norm_eps);
  given("--tie-word-embeddings", o.tie_word_embeddings.has_value(),
        o.tie_word_embeddings.value_or(false));
  return flags;
}

// `options` without the folders that give a shape: the preset and the flags alone.
ModelOptions flags_alone(ModelOptions options) {
  options.init_from.clear();
  options.shape_from.clear();
  return options;
}

// Refuses `given` where it says another value than `stored`, the shape `where` describes, naming
// the key, the value and the flag (or folder) that says otherwise.
void check_shape(const Shape& stored, const Shape& given, const std::string& where,
                 const std::string& remedy) {
  for (size_t i = 0; i < stored.size(); ++i) {
    if (given[i].value.empty() || given[i].value == stored[i].value) continue;
    throw std::invalid_argument(where + " has " + stored[i].key + " " + stored[i].value + ", and " +
                                given[i].flag + " says " + given[i].value + ": " + remedy);
  }
}

// Every value of `shape` as the config.json of `folder` says it.
Shape from_folder(Shape shape, const std::string& folder) {
  for (auto& value : shape) value.flag = "--init-from " + folder + " (its config.json)";
  return shape;
}

// What a run's config.json is called in messages, and what to do where flags contradict it.
std::string run_words(const std::string& run) {
  return "the run that wrote the checkpoint (" + run + "/config.json)";
}
constexpr const char* kRunRemedy =
    "a checkpoint keeps its run's shape; leave the shape flags out (the shape is read from "
    "there), or give a checkpoint of a run of this shape";

// The shape `stored` a folder's config.json gives (--init-from's, else shape_from's): the flags
// may only repeat it (with --model-size, `preset` is the preset's shape under the flags), and the
// config.json of shape_from (`read` reads one) must be the same where both folders are given.
// `model` says what a folder holds in messages ("a model").
void check_folder_shape(const ModelOptions& options, const Shape& stored, const std::string& model,
                        const std::function<Shape()>& preset,
                        const std::function<Shape(const std::string&)>& read) {
  const bool init = !options.init_from.empty();
  const Shape flags =
      given_shape(stored, shape_flags(options),
                  options.model_size.empty() || init ? std::nullopt : std::optional(preset()),
                  options.model_size);
  if (!init) return check_shape(stored, flags, run_words(options.shape_from), kRunRemedy);
  const std::string where = "--init-from " + options.init_from + " holds " + model +
                            " of its own shape (config.json): it";
  const std::string remedy = "leave out --model-size and the shape flags";
  if (!options.model_size.empty())
    throw std::invalid_argument(where + " is no preset's: " + remedy);
  check_shape(stored, flags, where, remedy);
  if (!options.shape_from.empty()) {
    check_shape(read(options.shape_from), from_folder(stored, options.init_from),
                run_words(options.shape_from), kRunRemedy);
  }
}

}  // namespace

bool is_hub_model(const std::string& name) { return find_hub_family(name) != nullptr; }

bool is_decoder(const std::string& name) {
  const HubFamily* family = find_hub_family(name);
  return family != nullptr && family->architecture == HubArchitecture::kDecoder;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names{"boring", "mlp", "gpt"};
  for (const auto& family : hub_families()) names.push_back(family.model_type);
  return names;
}

LanguageModelOptions language_model_options(const ModelOptions& options) {
  return LanguageModelOptions()
      .lr(options.lr)
      .weight_decay(options.weight_decay)
      .lr_schedule(options.lr_schedule)
      .warmup_steps(options.warmup_steps)
      .min_lr(options.min_lr)
      .decay_steps(options.decay_steps);
}

nn::DecoderConfig decoder_config(const ModelOptions& options) {
  nn::DecoderConfig config;
  const std::string& folder = !options.init_from.empty() ? options.init_from : options.shape_from;
  if (!folder.empty()) {
    std::string model_type;
    config = read_hf_decoder_config(folder, &model_type);
    if (model_type != options.name) {
      throw std::invalid_argument((options.init_from.empty() ? run_words(folder) + " trained"
                                                             : "--init-from " + folder + " holds") +
                                  " a " + model_type +
                                  " model (config.json's model_type): use --model " + model_type);
    }
    check_folder_shape(
        options, decoder_shape(config), "a model",
        [&] { return decoder_shape(decoder_config(flags_alone(options))); },
        [](const std::string& dir) { return decoder_shape(read_hf_decoder_config(dir)); });
    if (!options.init_from.empty()) check_hf_decoder_weights(options.init_from, config);
  } else {
    const std::string size = !options.model_size.empty()
                                 ? options.model_size
                                 : find_hub_family(options.name)->presets.front();
    if (size.rfind(options.name, 0) != 0) {
      throw std::invalid_argument("--model-size " + size + " is not a " + options.name +
                                  " preset: use " + presets_of(options.name));
    }
    config = nn::decoder_preset(size);
    if (options.n_layer > 0) config.n_layer = options.n_layer;
    if (options.n_head > 0) config.n_head = options.n_head;
    if (options.n_kv_head > 0) config.n_kv_head = options.n_kv_head;
    if (options.n_embd > 0) config.n_embd = options.n_embd;
    if (options.head_dim > 0) config.head_dim = options.head_dim;
    if (options.intermediate_size > 0) config.intermediate_size = options.intermediate_size;
    if (options.vocab_size > 0) config.vocab_size = options.vocab_size;
    if (options.rope_theta > 0) config.rope.theta(options.rope_theta);
    if (options.rms_norm_eps > 0) config.rms_norm_eps = options.rms_norm_eps;
    if (options.tie_word_embeddings) config.tie_word_embeddings = *options.tie_word_embeddings;
  }
  // The sequence length trained on is not a shape: any, up to the model's positions.
  if (options.block_size > 0) {
    if (config.max_position_embeddings > 0 && options.block_size > config.max_position_embeddings) {
      throw std::invalid_argument(
          "--block-size " + std::to_string(options.block_size) +
          " is longer than the model's positions (max_position_embeddings " +
          std::to_string(config.max_position_embeddings) + ")");
    }
    config.block_size = options.block_size;
  }
  nn::check_decoder_config(config);
  return config;
}

bool names_a_shape(const ModelOptions& options) {
  return !options.init_from.empty() || !options.model_size.empty() || options.n_layer > 0 ||
         options.n_head > 0 || options.n_embd > 0 || options.n_kv_head > 0 ||
         options.head_dim > 0 || options.intermediate_size > 0 || options.vocab_size > 0 ||
         options.block_size > 0 || options.rope_theta > 0 || options.rms_norm_eps > 0 ||
         options.tie_word_embeddings.has_value();
}

nn::Gpt2Config gpt2_config(const ModelOptions& options) {
  const std::string& folder = !options.init_from.empty() ? options.init_from : options.shape_from;
  if (!folder.empty()) {
    nn::Gpt2Config stored = read_hf_gpt2_config(folder);
    check_folder_shape(
        options, gpt2_shape(stored), "a GPT-2",
        [&] { return gpt2_shape(gpt2_config(flags_alone(options))); },
        [](const std::string& dir) { return gpt2_shape(read_hf_gpt2_config(dir)); });
    if (!options.init_from.empty()) check_hf_gpt2_weights(options.init_from, stored);
    stored.dropout = options.dropout;
    return stored;
  }
  nn::Gpt2Config config = nn::gpt2_preset(
      options.model_size.empty() ? find_hub_family("gpt2")->presets.front() : options.model_size);
  if (options.n_layer > 0) config.n_layer = options.n_layer;
  if (options.n_head > 0) config.n_head = options.n_head;
  if (options.n_embd > 0) config.n_embd = options.n_embd;
  if (options.block_size > 0) config.block_size = options.block_size;
  if (options.vocab_size > 0) config.vocab_size = options.vocab_size;
  config.dropout = options.dropout;
  return config;
}

ThroughputMonitorOptions throughput_options(const ModelOptions& options) {
  if (options.name == "gpt2") {
    const nn::Gpt2Config config = gpt2_config(options);
    return ThroughputMonitorOptions()
        .items_per_sample(config.block_size)
        .flops_per_sample(nn::gpt2_flops_per_token(config) *
                          static_cast<double>(config.block_size));
  }
  if (is_decoder(options.name)) {
    const nn::DecoderConfig config = decoder_config(options);
    return ThroughputMonitorOptions()
        .items_per_sample(config.block_size)
        .flops_per_sample(nn::decoder_flops_per_token(config) *
                          static_cast<double>(config.block_size));
  }
  if (options.name == "gpt") {
    return ThroughputMonitorOptions().items_per_sample(
        options.block_size > 0 ? options.block_size : GptConfig().block_size);
  }
  return {};
}

namespace {

// A flag a model does not read is refused, never ignored: the run would not be what was asked.
void check_flags_apply(const ModelOptions& options) {
  const ModelOptions defaults;
  std::vector<std::string> ignored;
  const auto unless = [&](bool used, bool given, const std::string& flag) {
    if (!used && given) ignored.push_back(flag);
  };
  const bool decoder = is_decoder(options.name), gpt2 = options.name == "gpt2";
  unless(decoder, options.n_kv_head > 0, "--n-kv-head");
  unless(decoder, options.head_dim > 0, "--head-dim");
  unless(decoder, options.intermediate_size > 0, "--intermediate-size");
  unless(decoder, options.rope_theta > 0, "--rope-theta");
  unless(decoder, options.rms_norm_eps > 0, "--rms-norm-eps");
  unless(decoder, options.tie_word_embeddings.has_value(), "--tie-word-embeddings");
  unless(decoder, options.document_masking, "--document-masking");
  unless(!decoder, options.dropout != defaults.dropout, "--dropout");
  unless(decoder || gpt2, !options.init_from.empty(), "--init-from");
  unless(decoder || gpt2, !options.model_size.empty(), "--model-size");
  const bool recipe = is_hub_model(options.name);
  unless(recipe, options.lr_schedule != defaults.lr_schedule, "--lr-schedule");
  unless(recipe, options.warmup_steps != defaults.warmup_steps, "--warmup-steps");
  unless(recipe, options.min_lr != defaults.min_lr, "--min-lr");
  unless(recipe, options.decay_steps != defaults.decay_steps, "--decay-steps");
  unless(recipe, options.weight_decay != defaults.weight_decay, "--weight-decay");
  if (!ignored.empty()) {
    std::string flags;
    for (const auto& flag : ignored) flags += (flags.empty() ? "" : ", ") + flag;
    throw std::invalid_argument("--model " + options.name + " does not use " + flags + ": leave " +
                                (ignored.size() == 1 ? "it" : "them") + " out");
  }
  // Nor does a constant schedule decay: a --min-lr without --lr-schedule would train at --lr.
  if (recipe && options.lr_schedule == "constant" &&
      (options.min_lr != defaults.min_lr || options.decay_steps != defaults.decay_steps)) {
    throw std::invalid_argument(
        "--min-lr and --decay-steps shape a decaying schedule, and --lr-schedule is constant: "
        "pass --lr-schedule cosine or linear, or leave them out");
  }
}

}  // namespace

BuiltInModel make_model(const ModelOptions& options) {
  check_flags_apply(options);
  torch::NoGradGuard no_grad;
  const bool language_model = options.name == "gpt" || is_hub_model(options.name);
  if (!language_model && !options.train_data.empty()) {
    throw std::invalid_argument(
        "--train-data " + options.train_data +
        ": token files are for the language models (--model gpt, gpt2, llama, qwen3), "
        "not " +
        options.name);
  }
  BuiltInModel built;
  if (options.name == "boring") {
    built.module = std::make_unique<BoringModel>(options.lr);
    auto inputs = torch::randn({128, 32}, data_generator(42));
    const TensorDataset all{inputs, torch::ones({128, 2})};
    built.train = rows(all, 0, 64);
    built.val = rows(all, 64, 128);
  } else if (options.name == "mlp") {
    built.module = std::make_unique<MlpModel>(options.lr, options.dropout);
    auto gen = data_generator(1234);
    auto inputs = torch::randn({5120, kMlpFeatures}, gen);
    auto teacher = torch::randn({kMlpFeatures, kMlpClasses}, gen);
    const TensorDataset all{inputs, inputs.matmul(teacher).argmax(1)};
    built.train = rows(all, 0, 4096);
    built.val = rows(all, 4096, 5120);
  } else if (options.name == "gpt2") {
    if (options.train_data.empty()) {
      throw std::invalid_argument(
          "--model gpt2 trains on token files: pass --train-data FILE (nanoGPT's train.bin, an "
          "llm.c shard, or what `pipetrain prepare-data` makes from any text)");
    }
    const nn::Gpt2Config config = gpt2_config(options);
    // Built per rank: each process reads its own layers' tensors of --init-from.
    auto model = std::make_unique<LanguageModel>(hf_gpt2_layers(config, options.init_from),
                                                 language_model_options(options));
    model->options.masked_targets(
        read_token_files(options, config.block_size, config.vocab_size, built));
    built.module = std::move(model);
  } else if (is_decoder(options.name)) {
    if (options.train_data.empty()) {
      throw std::invalid_argument("--model " + options.name +
                                  " trains on token files: pass --train-data FILE (tokens of the "
                                  "model's vocabulary, 32-bit above 65535 tokens)");
    }
    nn::DecoderConfig config = decoder_config(options);
    auto data = read_token_data(options.train_data, options.val_data, config.block_size,
                                config.vocab_size, options.document_masking);
    config.document_separator = data.document_separator;
    // Built per rank: each process reads its own layers' tensors of --init-from.
    built.module = std::make_unique<LanguageModel>(
        hf_decoder_layers(config, options.init_from),
        language_model_options(options).masked_targets(data.masked));
    built.train = std::move(data.train);
    built.val = std::move(data.val);
  } else if (options.name == "gpt" && !options.train_data.empty()) {
    GptConfig config;
    config.vocab_size = options.vocab_size > 0 ? options.vocab_size : kByteVocabulary;
    if (options.block_size > 0) config.block_size = options.block_size;
    config.dropout = options.dropout;
    built.module = std::make_unique<GptModel>(config, options.lr);
    if (read_token_files(options, config.block_size, config.vocab_size, built)) {
      throw std::invalid_argument("--model gpt does not read loss masks, which lie beside " +
                                  options.train_data +
                                  "'s token files: fine-tune gpt2, llama or qwen3 on them");
    }
    // Byte tokens read back as text: the vocabulary of every byte, in byte order.
    if (config.vocab_size == kByteVocabulary) built.vocabulary = CharVocabulary(all_bytes());
  } else if (options.name == "gpt") {
    if (!options.val_data.empty()) {
      throw std::invalid_argument("--val-data needs --train-data (token files for gpt)");
    }
    auto corpus = load_corpus(options.corpus);
    GptConfig config;
    config.vocab_size = corpus.vocab.size();
    if (options.block_size > 0) config.block_size = options.block_size;
    config.dropout = options.dropout;
    built.module = std::make_unique<GptModel>(config, options.lr);
    built.train = std::make_shared<TensorDataset>(
        make_char_windows(corpus.train_tokens, config.block_size, config.block_size / 2));
    built.val = std::make_shared<TensorDataset>(
        make_char_windows(corpus.val_tokens, config.block_size, config.block_size));
    built.vocabulary = corpus.vocab;
  } else {
    std::string names;
    for (const auto& name : model_names()) names += (names.empty() ? "" : ", ") + name;
    throw std::invalid_argument("unknown model '" + options.name + "': use " + names);
  }
  return built;
}

}  // namespace pipetrain::cli
