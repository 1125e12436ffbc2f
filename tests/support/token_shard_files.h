// A test's folder of llm.c token shards whose tokens count up from a given first one.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "pipetrain/token_dataset.h"
#include "support/temp_dir.h"

namespace pipetrain::testing {

class TokenShardFiles : public TempDirTest {
 protected:
  // An llm.c shard dir/name of uint16 tokens first, first + 1, ..., first + count - 1.
  std::string shard(const std::string& name, uint16_t first, size_t count) const {
    std::vector<uint16_t> tokens(count);
    std::iota(tokens.begin(), tokens.end(), first);
    write_token_file(path(name), tokens, TokenFileFormat::kLlmc);
    return path(name);
  }
};

}  // namespace pipetrain::testing
