// A key/value cache for generating from a decoder: the keys and values of the tokens seen so far,
// per attention layer, so that each new token's forward attends to them instead of recomputing
// them (pipetrain/nn/generate.h fills and reads it).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace pipetrain::nn {

struct KVCache {
  // One attention layer's keys and values [B, Hkv, capacity, head_dim], allocated at the layer's
  // first cached forward in its keys' dtype and device.
  struct Layer {
    at::Tensor keys, values;
  };
  std::vector<Layer> layers;
};

// What a forward over new tokens of rows that share one cache needs beside them: every row has
// `start` tokens cached (left padding aligns the rows), the new tokens [B, T] are rotated by
// `positions` [B, T] (a row's own: its padding does not count) and token i may attend to cached
// or new key j (j < start + T) where `allowed` [B, 1, T, start + T] is true. `capacity`: the
// tokens a row's cache holds, allocated at a layer's first step.
struct CachedStep {
  int64_t capacity = 0;
  int64_t start = 0;
  at::Tensor positions;
  at::Tensor allowed;
};

}  // namespace pipetrain::nn
