// pipetrain: everything a program that trains with it names, in one include.
//
//   #include <pipetrain/pipetrain.h>
//
//   class MyModel : public pipetrain::Module { ... training_step, configure_optimizers ... };
//   int main() {
//     const auto options = pipetrain::TrainerOptions().strategy("pipe").devices(2);
//     if (const auto status = pipetrain::launch_ranks(options)) return *status;
//     pipetrain::Trainer trainer(options);
//     MyModel model;
//     trainer.fit(model, pipetrain::DataLoader(data, pipetrain::DataLoaderOptions()));
//   }
//
// Each header below is one concept (docs/DESIGN.md lists them); including one of them alone also
// works. Nothing here includes c10d's headers, and the library asks no compile definitions of
// its users: pipetrain's internals stay in its sources.
#pragma once

// Training: the Trainer and its options, the user's Module (a Sequential, or layers described to be
// built per rank), strategies by name.
#include "pipetrain/layer_spec.h"
#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/trainer_options.h"

// Data: datasets and the loader; LibTorch datasets and token files (one, or a folder of shards)
// as datasets, with loss masks and packed documents; Hugging Face tokenizers.
#include "pipetrain/data.h"
#include "pipetrain/loss_mask.h"
#include "pipetrain/packed_documents.h"
#include "pipetrain/token_dataset.h"
#include "pipetrain/token_shards.h"
#include "pipetrain/tokenizer.h"
#include "pipetrain/torch_dataset.h"

// Callbacks and loggers.
#include "pipetrain/callback.h"
#include "pipetrain/csv_logger.h"
#include "pipetrain/early_stopping.h"
#include "pipetrain/logger.h"
#include "pipetrain/lr_monitor.h"
#include "pipetrain/model_checkpoint.h"
#include "pipetrain/tensorboard_logger.h"
#include "pipetrain/throughput_monitor.h"

// Optimisation: learning-rate schedules and the fused AdamW.
#include "pipetrain/fused_adamw.h"
#include "pipetrain/lr_scheduler.h"

// A decoder language model's Module: next-token loss, AdamW with decay on matrices, a schedule.
#include "pipetrain/language_model.h"

// Hugging Face Hub models (GPT-2, Llama 3, Qwen3): a folder opened as a model to fine-tune, its
// weights read per rank and written back; each family's names and config.json.
#include "pipetrain/hf_decoder.h"
#include "pipetrain/hf_folder.h"
#include "pipetrain/hf_gpt2.h"
#include "pipetrain/hub_model.h"

// Building blocks a model calls: Linear and LayerNorm the pipe can fuse, chunked cross-entropy,
// and pipetrain::nn's transformer modules (Llama 3 and Qwen3 are decoder() configurations, GPT-2
// is gpt2()).
#include "pipetrain/cross_entropy.h"
#include "pipetrain/layer_norm.h"
#include "pipetrain/linear.h"
#include "pipetrain/nn/attention.h"
#include "pipetrain/nn/decoder.h"
#include "pipetrain/nn/documents.h"
#include "pipetrain/nn/embedding.h"
#include "pipetrain/nn/generate.h"
#include "pipetrain/nn/gpt2.h"
#include "pipetrain/nn/kv_cache.h"
#include "pipetrain/nn/mlp.h"
#include "pipetrain/nn/rms_norm.h"
#include "pipetrain/nn/rotary_embedding.h"

// The pipeline itself, for programs that drive it without a Trainer: how to balance it, and
// schedules as data (built, drawn, read from and written to CSV files, simulated).
#include "pipetrain/balance.h"
#include "pipetrain/pipe.h"
#include "pipetrain/schedule.h"

// Processes: launching ranks, where they come from, the World joining them.
#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/world.h"

// Files: checkpoints (save, load, resume in any layout; "last" and "best") and safetensors.
#include "pipetrain/checkpoint_io.h"
#include "pipetrain/checkpoint_path.h"
#include "pipetrain/safetensors.h"

// Errors: how failures are reported.
#include "pipetrain/error.h"
