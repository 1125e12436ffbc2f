// pipetrain::Tokenizer's speed: encode() on one thread and encode_batch() on every core, in MB of
// text a second, over documents read from files. Compare with Hugging Face's tokenizers on the
// same documents and machine: bench/tokenizer_reference.js (bench/README.md has the commands).
//
//   tokenizer_bench TOKENIZER_DIR_OR_JSON FILE... [--document-bytes N] [--threads N]
#include <pipetrain/tokenizer.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace {

// `text` cut into documents of about `bytes` bytes, at line ends.
std::vector<std::string> documents_of(const std::string& text, size_t bytes) {
  std::vector<std::string> documents;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', std::min(text.size(), begin + bytes));
    end = end == std::string::npos ? text.size() : end + 1;
    documents.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return documents;
}

template <typename Fn>
double best_seconds(Fn&& fn, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: tokenizer_bench TOKENIZER FILE... [--document-bytes N] [--threads N]\n";
    return 2;
  }
  size_t document_bytes = 4096;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::string text;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--document-bytes" && i + 1 < argc) {
      document_bytes = std::stoul(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else {
      std::ifstream in(arg, std::ios::binary);
      text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  const auto tokenizer = pipetrain::Tokenizer::from_file(argv[1]);
  const std::vector<std::string> documents = documents_of(text, document_bytes);
  const double megabytes = static_cast<double>(text.size()) / 1e6;

  size_t tokens = 0;
  // The first pass fills the word cache, as any long run does after its first documents.
  const double one_thread = best_seconds(
      [&] {
        tokens = 0;
        for (const auto& document : documents) tokens += tokenizer.encode(document, false).size();
      },
      3);
  const double batch = best_seconds([&] { tokenizer.encode_batch(documents, false, threads); }, 3);
  std::printf("%s: %.2f MB, %zu documents, %zu tokens\n", tokenizer.path().c_str(), megabytes,
              documents.size(), tokens);
  std::printf("encode, 1 thread:         %8.2f MB/s  %10.0f tokens/s\n", megabytes / one_thread,
              static_cast<double>(tokens) / one_thread);
  std::printf("encode_batch, %2d threads: %8.2f MB/s  %10.0f tokens/s\n", threads,
              megabytes / batch, static_cast<double>(tokens) / batch);
  return 0;
}
