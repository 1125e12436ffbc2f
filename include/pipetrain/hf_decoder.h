// Llama 3 and Qwen3 in the layout of Hugging Face's transformers (LlamaForCausalLM,
// Qwen3ForCausalLM), for the Sequential nn::decoder(config) builds: a folder holding config.json
// and the weights in safetensors, one model.safetensors or shards named by
// model.safetensors.index.json (hf_folder.h). Hugging Face's names are pipetrain's below the layer
// index ("model.layers.2.self_attn.q_proj.weight" is "3.self_attn.q_proj.weight";
// "model.embed_tokens", "model.norm" and "lm_head" are layers 0, n_layer + 1 and n_layer + 2), and
// both store Linear weights [out, in], so a tensor moves between the two unchanged. A tied head is
// stored once, under the embedding's name, on both sides.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/hf_folder.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/nn/decoder.h"

namespace pipetrain {

// Every tensor a Hugging Face folder stores for a decoder of shape `config`, pipetrain's name and
// theirs, in transformers' state-dict order (the order save_pretrained fills shards in). A tied
// head is not stored. Pure: no file read.
std::vector<HfTensor> hf_decoder_tensors(const nn::DecoderConfig& config);

// The shape `dir`/config.json describes. model_type must be llama or qwen3 (which sets qk_norm);
// the RoPE may be spelled as transformers 4 does (top-level rope_theta and rope_scaling, its kind
// under "rope_type" or the older "type") or as transformers 5 does (rope_parameters, rope_theta
// inside), of kind default or llama3. Keys a config.json may leave out take transformers' defaults
// for that model_type (Qwen3's head_dim is 128, Llama's hidden_size / num_attention_heads).
// max_position_embeddings is the config's, and block_size DecoderConfig's default cut to it. Fills
// `*model_type` and `*dtype` (torch_dtype, or transformers 5's dtype: "bfloat16", "float32"...;
// "" when absent) when given. Throws std::invalid_argument naming the file and the key: a missing
// or mistyped key, another model_type (mistral, qwen2...) or rope kind (yarn, dynamic, linear,
// longrope), a variant pipetrain does not build (sliding-window layers, an MLP bias, another
// activation, attention dropout).
nn::DecoderConfig read_hf_decoder_config(const std::string& dir, std::string* model_type = nullptr,
                                         std::string* dtype = nullptr);

// The weights in `dir` of a decoder of shape `config` (as read_hf_decoder_config gives it), under
// pipetrain's names and in fp32 whatever the folder stores (fp32, bf16, fp16), ready for
// load_weights. A tied head is not returned: load_weights fills it through "0.weight". Only the
// tensors whose pipetrain name `wanted` accepts are read (all when it is empty; with a tied head,
// "0.weight" when either it or the head is wanted), and of a sharded folder only the shards that
// hold them are opened (each whole: the library reads a safetensors file at once): a rank building
// its stages alone reads theirs (hf_decoder_layers). Throws std::invalid_argument naming the
// tensor, the file and what to do when the folder lacks a tensor of `config`, holds one `config`
// has no place for (a tied folder's lm_head.weight and old files' rotary_emb.inv_freq buffers are
// passed over, as transformers does), or holds one of another shape (naming the shape expected).
std::map<std::string, at::Tensor> read_hf_decoder_weights(
    const std::string& dir, const nn::DecoderConfig& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted = {});
// The same from a folder already opened.
std::map<std::string, at::Tensor> read_hf_decoder_weights(
    const HfFolder& folder, const nn::DecoderConfig& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted = {});

// What read_hf_decoder_weights checks of every tensor, from the files' headers alone (nothing
// read, nothing allocated): run before a model of `config` is built, so that a config.json that
// does not describe its weights (a vocabulary of 1e12) is refused naming the tensor, not met by
// the allocator.
void check_hf_decoder_weights(const std::string& dir, const nn::DecoderConfig& config);
void check_hf_decoder_weights(const HfFolder& folder, const nn::DecoderConfig& config);

// nn::decoder_layers(config), each layer, where `init_from` names a Hugging Face folder, given
// that layer's tensors of it as it is built: each process reads only its own layers'. The folder's
// listing is read once, here, and shared by the layers' builds.
std::vector<LayerSpec> hf_decoder_layers(const nn::DecoderConfig& config,
                                         const std::string& init_from);
// The same from a folder already opened, which the layers' builds share.
std::vector<LayerSpec> hf_decoder_layers(const nn::DecoderConfig& config,
                                         std::shared_ptr<const HfFolder> folder);

// Writes `weights` (pipetrain's names, as in a checkpoint's model.safetensors; a tied head's second
// name may be there or not) of a decoder of shape `config` into `dir` (created if missing), as
// transformers' save_pretrained lays out a `model_type` (llama or qwen3) model: config.json
// (transformers 4's spelling), generation_config.json, and the weights in `dtype` (bf16, fp16 or
// fp32) in one model.safetensors when they fit in `max_shard_bytes`, else in shards
// model-00001-of-0000N.safetensors named by model.safetensors.index.json; weight files of an
// earlier export into `dir` that this one does not write are removed, as save_pretrained does. With
// `tokenizer_from` (a Hugging Face folder of the same vocabulary), the tokenizer files it holds (if
// any) are copied, its generation_config.json replaces the minimal one, and its config.json's
// bos_token_id and eos_token_id are kept. Every file is written atomically. Throws
// std::invalid_argument (before writing anything) naming the tensor or argument that does not fit,
// std::runtime_error naming the file when a write fails.
void export_hf_decoder(const std::map<std::string, at::Tensor>& weights,
                       const nn::DecoderConfig& config, const std::string& model_type,
                       const std::string& dir, int64_t max_shard_bytes = kHfDefaultMaxShardBytes,
                       at::ScalarType dtype = at::kBFloat16,
                       const std::string& tokenizer_from = "");

// The same, reading `weights` one output shard at a time.
void export_hf_decoder(const WeightSource& weights, const nn::DecoderConfig& config,
                       const std::string& model_type, const std::string& dir,
                       int64_t max_shard_bytes = kHfDefaultMaxShardBytes,
                       at::ScalarType dtype = at::kBFloat16,
                       const std::string& tokenizer_from = "");

// `dir`/config.json of a `model_type` decoder of shape `config` (fp32), as export writes it: the
// command keeps one beside a fit's checkpoints, so that export knows what the weights do not say
// (RoPE, eps, positions; with `tokenizer_from`, the folder fit started from, its config.json's
// bos_token_id and eos_token_id, which an export then keeps). Creates `dir`; writes atomically.
void write_hf_decoder_config(const nn::DecoderConfig& config, const std::string& model_type,
                             const std::string& dir, const std::string& tokenizer_from = "");

}  // namespace pipetrain
