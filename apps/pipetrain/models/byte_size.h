// Sizes in bytes as people write them: "40GiB", "512MiB", "5GB", "1000". Units as Hugging Face's
// and Slurm's users write them: KiB, MiB, GiB, TiB in powers of 1024, KB, MB, GB, TB in powers of
// 1000, B or none for bytes, in any case, a space before the unit allowed.
#pragma once

#include <cstdint>
#include <string>

namespace pipetrain::cli {

// The bytes `text` says, rounded down. Throws std::invalid_argument, naming `flag` and `text`, for
// what is not a size (no number, an unknown unit, a negative number, NaN), for one below
// `minimum`, and for one past 2^63 - 1 (inf included), which no count of bytes holds.
int64_t parse_byte_size(const std::string& flag, const std::string& text, int64_t minimum = 0);

}  // namespace pipetrain::cli
