// pipetrain::nn's rotary embeddings and RMSNorm against values computed here independently: the
// frequencies one by one in double precision (Llama 3.1's scaling as Meta's reference code writes
// it, a loop over frequencies), the rotation as complex multiplication of the (i, i + D/2) pairs.
// Tolerance: relative 1e-6 on frequencies and 1e-5 on rotated values (fp32 against double).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <complex>
#include <vector>

#include "pipetrain/nn/rms_norm.h"
#include "pipetrain/nn/rotary_embedding.h"

namespace pipetrain::testing::rotary_embedding_test {
namespace {

std::vector<double> reference_frequencies(int64_t head_dim, double theta, bool llama3,
                                          double factor, double low, double high, double context) {
  std::vector<double> frequencies;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const double frequency = 1.0 / std::pow(theta, static_cast<double>(i) / head_dim);
    if (!llama3) {
      frequencies.push_back(frequency);
      continue;
    }
    const double wavelength = 2 * M_PI / frequency;
    if (wavelength < context / high) {
      frequencies.push_back(frequency);
    } else if (wavelength > context / low) {
      frequencies.push_back(frequency / factor);
    } else {
      const double smooth = (context / wavelength - low) / (high - low);
      frequencies.push_back((1 - smooth) * frequency / factor + smooth * frequency);
    }
  }
  return frequencies;
}

void expect_frequencies(const at::Tensor& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i].item<double>(), expected[i], 1e-6 * expected[i]) << "frequency " << i;
  }
}

TEST(RotaryEmbedding, DefaultFrequenciesAreThetaPowers) {
  expect_frequencies(nn::rotary_inverse_frequencies(nn::RotaryEmbeddingOptions(64).theta(1e6)),
                     reference_frequencies(64, 1e6, false, 1, 1, 4, 8192));
}

TEST(RotaryEmbedding, Llama3ScalingKeepsHighSlowsLowAndBlendsBetween) {
  // Llama 3.2's: theta 500000, factor 32; and Llama 3.1's factor 8 at another width.
  for (const auto& [head_dim, factor] :
       std::vector<std::pair<int64_t, double>>{{64, 32}, {128, 8}}) {
    const auto options = nn::RotaryEmbeddingOptions(head_dim)
                             .theta(500000)
                             .rope_type("llama3")
                             .factor(factor)
                             .low_freq_factor(1)
                             .high_freq_factor(4)
                             .original_max_position_embeddings(8192);
    const auto expected = reference_frequencies(head_dim, 500000, true, factor, 1, 4, 8192);
    expect_frequencies(nn::rotary_inverse_frequencies(options), expected);
    // All three regions occur: kept (the first), slowed by the factor (the last), blended.
    const auto plain = reference_frequencies(head_dim, 500000, false, 1, 1, 4, 8192);
    EXPECT_EQ(expected.front(), plain.front());
    EXPECT_NEAR(expected.back(), plain.back() / factor, 1e-12);
    int blended = 0;
    for (size_t i = 0; i < plain.size(); ++i) {
      blended += expected[i] < plain[i] && expected[i] > plain[i] / factor * (1 + 1e-9);
    }
    EXPECT_GT(blended, 0);
  }
}

TEST(RotaryEmbedding, RotatesEachPairByPositionTimesFrequency) {
  const int64_t head_dim = 8, length = 5;
  nn::RotaryEmbedding rotary(nn::RotaryEmbeddingOptions(head_dim).theta(100));
  torch::manual_seed(6);
  const auto x = torch::randn({1, 2, length, head_dim}, torch::kFloat64);
  const auto rotated = rotary(x);
  ASSERT_EQ(rotated.scalar_type(), torch::kFloat64);
  const auto frequencies = reference_frequencies(head_dim, 100, false, 1, 1, 4, 1);
  for (int64_t head = 0; head < 2; ++head) {
    for (int64_t position = 0; position < length; ++position) {
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const std::complex<double> pair(x[0][head][position][i].item<double>(),
                                        x[0][head][position][i + head_dim / 2].item<double>());
        const auto expected = pair * std::polar(1.0, position * frequencies[i]);
        EXPECT_NEAR(rotated[0][head][position][i].item<double>(), expected.real(), 1e-5);
        EXPECT_NEAR(rotated[0][head][position][i + head_dim / 2].item<double>(), expected.imag(),
                    1e-5);
      }
    }
  }
  // A shorter sequence reads the same table's first rows.
  EXPECT_TRUE(torch::allclose(rotary(x.slice(2, 0, 3)), rotated.slice(2, 0, 3)));
}

TEST(RotaryEmbedding, RefusesWhatItDoesNotImplement) {
  EXPECT_THROW(nn::rotary_inverse_frequencies(nn::RotaryEmbeddingOptions(64).rope_type("yarn")),
               std::invalid_argument);
  EXPECT_THROW(nn::rotary_inverse_frequencies(nn::RotaryEmbeddingOptions(7)),
               std::invalid_argument);
  try {
    nn::RotaryEmbedding(nn::RotaryEmbeddingOptions(64).rope_type("dynamic"));
    FAIL() << "dynamic scaling was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("'dynamic'"), std::string::npos) << error.what();
  }
}

TEST(RMSNorm, NormalisesByTheRootMeanSquareInFp32) {
  torch::manual_seed(7);
  nn::RMSNorm norm(nn::RMSNormOptions(6).eps(1e-6));
  norm->weight.data().uniform_(0.5, 1.5);
  const auto x = torch::randn({3, 6}, torch::kFloat64);
  const auto expected =
      x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6) * norm->weight.to(x.dtype());
  EXPECT_TRUE(
      torch::allclose(norm(x.to(torch::kFloat32)).to(torch::kFloat64), expected, 1e-5, 1e-6));
  // bf16 in, bf16 out (computed in fp32, rounded once).
  EXPECT_EQ(nn::rms_norm(x.to(torch::kBFloat16), norm->weight.to(torch::kBFloat16)).scalar_type(),
            torch::kBFloat16);
}

}  // namespace
}  // namespace pipetrain::testing::rotary_embedding_test
