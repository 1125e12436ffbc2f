// tokenizer.json's "decoder": how tokens become text again (byte-level symbols back to bytes,
// SentencePiece's metaspace back to spaces, <0x..> byte tokens, ...), as Hugging Face's
// tokenizers decode.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::tokenizer {

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  // Rewrites the tokens; decoding joins what the chain leaves.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// The decoder `config` describes (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
// Sequence), or null for a null config. Throws std::invalid_argument naming a type that is not
// implemented.
std::unique_ptr<TokenDecoder> make_token_decoder(const nlohmann::json& config);

}  // namespace pipetrain::tokenizer
