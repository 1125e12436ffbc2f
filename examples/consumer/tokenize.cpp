// Text to ids and back with a Hugging Face model's tokenizer, no Python:
//   tokenize MODEL_DIR_OR_TOKENIZER_JSON "some text"
#include <pipetrain/pipetrain.h>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: tokenize MODEL_DIR_OR_TOKENIZER_JSON TEXT\n";
    return 2;
  }
  const auto tokenizer = pipetrain::Tokenizer::from_file(argv[1]);
  const std::vector<int64_t> ids = tokenizer.encode(argv[2]);
  for (const int64_t id : ids) std::cout << id << ' ';
  std::cout << '\n' << tokenizer.decode(ids) << '\n';
  return 0;
}
