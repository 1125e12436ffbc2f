// Sizes in bytes as people write them: "40GiB", "512MiB", "5GB", "1000". Units as Hugging Face's
// and Slurm's users write them: KiB, MiB, GiB, TiB in powers of 1024, KB, MB, GB, TB in powers of
// 1000, B or none for bytes, in any case, a space before the unit allowed.
#pragma once

#include <optional>
#include <string>

namespace pipetrain::cli {

// The bytes `text` says, rounded down (infinite where it says so); std::nullopt where it is not a
// size: no number, an unknown unit, a negative number or NaN. Its callers say what range they take.
std::optional<double> byte_count(const std::string& text);

}  // namespace pipetrain::cli
