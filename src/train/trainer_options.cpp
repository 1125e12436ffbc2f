#include "pipetrain/trainer_options.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace pipetrain {

BatchLimit BatchLimit::fraction(double f) {
  if (!(f >= 0.0 && f <= 1.0)) {
    throw std::invalid_argument("a fraction of batches must be between 0.0 and 1.0 (got " +
                                std::to_string(f) + "); give a whole number for a count");
  }
  BatchLimit limit;
  limit.is_fraction_ = true;
  limit.value_ = f;
  return limit;
}

BatchLimit BatchLimit::count(int64_t n) {
  if (n < 0) {
    throw std::invalid_argument("a number of batches cannot be negative (got " + std::to_string(n) +
                                ")");
  }
  BatchLimit limit;
  limit.is_fraction_ = false;
  limit.value_ = static_cast<double>(n);
  return limit;
}

BatchLimit BatchLimit::parse(const std::string& text) {
  const bool is_fraction = text.find_first_of(".eE") != std::string::npos;
  size_t used = 0;
  double f = 0;
  long long n = 0;
  try {
    if (is_fraction) {
      f = std::stod(text, &used);
    } else {
      n = std::stoll(text, &used);
    }
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw std::invalid_argument("'" + text +
                                "' is neither a count of batches (e.g. 10) nor a fraction (e.g. "
                                "0.25)");
  }
  return is_fraction ? fraction(f) : count(n);
}

int64_t BatchLimit::of(int64_t available, const std::string& option) const {
  if (!is_fraction_) return std::min(available, static_cast<int64_t>(value_));
  const auto batches = static_cast<int64_t>(std::floor(value_ * static_cast<double>(available)));
  if (batches == 0 && value_ > 0.0 && available > 0) {
    std::ostringstream least;
    least << 1.0 / static_cast<double>(available);
    throw std::invalid_argument(option + " " + to_string() + " of the " +
                                std::to_string(available) +
                                " batches there are is none of them: give at least " + least.str() +
                                ", a count of batches, or 0.0 to skip them");
  }
  return batches;
}

std::string BatchLimit::to_string() const {
  std::ostringstream out;
  if (is_fraction_) {
    out << value_;
    if (value_ == std::floor(value_)) out << ".0";
  } else {
    out << static_cast<int64_t>(value_);
  }
  return out.str();
}

}  // namespace pipetrain
