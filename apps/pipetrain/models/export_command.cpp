#include "models/export_command.h"

#include <filesystem>
#include <iostream>
#include <set>
#include <stdexcept>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/checkpoint_path.h>
#include <pipetrain/hf_decoder.h>
#include <pipetrain/hf_gpt2.h>

#include "models/byte_size.h"
#include "models/run_config.h"

namespace pipetrain::cli {
namespace {

// "a, b/, c": a folder's entries for a message.
std::string listed(const std::set<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// An export writes into a folder of its own: a new or empty one, or an earlier export's, whose
// weight files it replaces. Into `checkpoint` itself it would delete the shards it reads (taken
// for an earlier export's); into a folder of other files it would replace a config.json and
// delete model*.safetensors that are not its own: refused, the latter unless `overwrite`.
void check_export_folder(const std::string& output, const std::string& checkpoint, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(output, error)) return;
  if (!fs::is_directory(output, error)) {
    throw std::invalid_argument("--output " + output +
                                " is a file: give a folder for the export (a new one)");
  }
  if (fs::equivalent(output, checkpoint, error)) {
    throw std::invalid_argument("--output " + output + " is the checkpoint " + checkpoint +
                                " itself, which the export would overwrite: give another folder");
  }
  if (overwrite) return;
  std::set<std::string> others;  // sorted, for a message that reads the same every time
  for (const auto& entry : fs::directory_iterator(output)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && is_export_file(name)) continue;
    others.insert(name + (entry.is_directory() ? "/" : ""));
  }
  if (!others.empty()) {
    throw std::invalid_argument(
        "--output " + output + " holds what no export writes (" + listed(others) +
        "), whose config.json and weights files the export would replace: give a new or empty "
        "folder, or pass --overwrite");
  }
}

}  // namespace

// `pipetrain export`: a checkpoint's weights as the Hugging Face folder of its model.
void export_checkpoint(const ExportOptions& e) {
  // "last" and "best" as the Trainer resolves them for the other subcommands.
  const std::string checkpoint = resolve_checkpoint_path(e.ckpt_path, e.default_root_dir);
  // The model its run trained, as the config.json fit keeps beside the checkpoints says.
  const auto model = with_run_shape(e.model, e.model_given, checkpoint);
  const std::string& run_dir = model.shape_from;
  const std::string &format = e.format, &dtype = e.dtype, &max_shard_size = e.max_shard_size,
                    &output = e.output;
  const bool gpt2 = model.name == "gpt2";
  if (format != "hf" && !(gpt2 && format == "hf-gpt2")) {
    throw std::invalid_argument("--format " + format + ": use hf" +
                                (gpt2 ? " (or hf-gpt2, its old name)" : ""));
  }
  if (!is_hub_model(model.name)) {
    throw std::invalid_argument("--model " + model.name +
                                ": export writes gpt2, llama and qwen3 checkpoints");
  }
  if (dtype != "bf16" && dtype != "fp32") {
    throw std::invalid_argument("--dtype " + dtype + ": use bf16 or fp32");
  }
  if (gpt2) {
    // GPT-2's shape is its tensors' (n_head aside); its folder is fp32 in one file.
    if (!model.init_from.empty() || !model.model_size.empty() || model.n_layer > 0 ||
        model.n_embd > 0 || model.vocab_size > 0 || model.block_size > 0 || dtype != "bf16" ||
        max_shard_size != "5GB") {
      throw std::invalid_argument(
          "export of --model gpt2 reads its shape from the checkpoint and writes one fp32 file: "
          "of the shape flags give only --n-head, and leave out --init-from, --dtype and "
          "--max-shard-size");
    }
  }
  check_export_folder(output, checkpoint, e.overwrite);
  if (gpt2) {
    int64_t n_head = model.n_head;
    if (!run_dir.empty()) {
      const int64_t run_heads = read_hf_gpt2_config(run_dir).n_head;
      if (n_head > 0 && n_head != run_heads) {
        throw std::invalid_argument("--n-head " + std::to_string(n_head) + ": the run's " +
                                    run_dir + "/config.json says " + std::to_string(run_heads) +
                                    "; leave --n-head out");
      }
      n_head = run_heads;
    }
    const auto weights = read_checkpoint_weights(checkpoint);
    export_hf_gpt2(weights, gpt2_config_of(weights, n_head), output);
    std::cout << "wrote " << output << "/model.safetensors and config.json "
              << "(transformers.GPT2LMHeadModel.from_pretrained(\"" << output << "\"))"
              << std::endl;
    return;
  }
  // The shape is the config.json fit keeps beside its checkpoints; for a checkpoint without one,
  // the flags' (a preset, shape flags, or the --init-from folder trained from), as fit was given
  // them, and never a default: RoPE and the norms' epsilon leave no trace in the tensors. A
  // tensor of another shape is refused, naming it.
  if (run_dir.empty() && !names_a_shape(model)) {
    throw std::invalid_argument(
        "no config.json of the run that wrote " + checkpoint +
        " was found (fit writes one in the run's folder, above checkpoints/): pass the shape fit "
        "was given (--model-size, the shape flags, or --init-from with the folder it started "
        "from)");
  }
  // Where the run's config.json gives the shape, --init-from names the tokenizer alone.
  auto shape = model;
  if (!run_dir.empty()) shape.init_from.clear();
  const auto config = decoder_config(shape);
  // The tokenizer and its bos/eos ids from --init-from; without it, the ids fit kept from the
  // folder it started from (else transformers would take LlamaConfig's 1 and 2).
  const std::string tokenizer_from = !model.init_from.empty() ? model.init_from : run_dir;
  // One output shard's tensors read at a time, from the checkpoint's files that hold them.
  const StoredWeights stored(checkpoint);
  export_hf_decoder(WeightSource::of(stored), config, model.name, output,
                    parse_byte_size("--max-shard-size", max_shard_size, 1),
                    dtype == "bf16" ? at::kBFloat16 : at::kFloat, tokenizer_from);
  std::cout << "wrote " << output << " (transformers.AutoModelForCausalLM.from_pretrained(\""
            << output << "\"))" << std::endl;
}

}  // namespace pipetrain::cli
