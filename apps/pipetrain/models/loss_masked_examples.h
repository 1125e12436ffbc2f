// The examples of supervised fine-tuning, a JSONL line each, as token ids and a loss mask (1 where
// a token carries loss), for `pipetrain prepare-data --format chat|prompt-completion`:
// - chat: {"messages": [{"role": ..., "content": ...}, ...]}, rendered with the tokenizer's chat
//   template (tokenizer_config.json's) as transformers' apply_chat_template renders it with
//   add_generation_prompt false, and encoded without the post-processor's tokens (the template
//   writes its own BOS). Only the assistant turns carry loss: each from where the template's
//   generation prompt for it ends (messages[:k] rendered with add_generation_prompt true) to where
//   the conversation up to it ends (messages[:k + 1]), so the template's end-of-turn tokens
//   (Qwen's "<|im_end|>\n", Llama 3's "<|eot_id|>") are learnt with the turn and the model learns
//   to stop (and, where the template writes a generation prompt after every rendering, as Llama
//   3's first one does, the last turn's loss takes it in too, as TRL's prompt-completion masks
//   do). No EOS is added: the template ends every turn itself, as TRL's SFTTrainer leaves
//   conversations (it adds an EOS to plain text and prompt-completion examples alone).
// - prompt-completion: {"prompt": ..., "completion": ...}: encode(prompt) with the
//   post-processor's tokens (a BOS where it adds one), then encode(completion) without, then the
//   EOS; the completion's tokens and the EOS carry loss. (TRL encodes prompt + completion at once
//   and warns where its prompt's ids are not a prefix; encoding them apart gives the same ids
//   wherever that holds, and never cuts a token across the boundary.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <pipetrain/tokenizer.h>

namespace pipetrain::cli {

struct LossMaskedIds {
  std::vector<int64_t> ids;
  std::vector<uint8_t> mask;  // one per id: 1 where it carries loss
};

// The formats: "chat" or "prompt-completion".
bool is_loss_masked_format(const std::string& format);

// `line` (JSON, from `where`, "file:line") of `format` as ids and their mask. Throws
// std::invalid_argument starting with `where` for a line that is not a JSON object, lacks a field
// (messages, prompt, completion; a message's role or content) or holds one of another type, and
// for a conversation the masks cannot be cut from exactly: a template that renders the
// conversation up to a turn as other than the start of the whole one (one that rewrites earlier
// turns, as Qwen3's drops the thinking of turns before the last user message, or ends every
// rendering with a generation prompt, as Llama 3's first template), or ids of the
// pieces, encoded apart, other than the whole rendering's. `eos`: prompt-completion's EOS.
LossMaskedIds encode_loss_masked(const Tokenizer& tokenizer, const std::string& format,
                                 const std::string& line, const std::string& where, int64_t eos);

}  // namespace pipetrain::cli
