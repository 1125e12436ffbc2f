// Tests of one check on two devices: the CPU, and a CUDA device where the machine has one.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

// Defines TEST(suite, name), `check(torch::Device(torch::kCPU))`, and TEST(suite, Cuda##name), the
// same check on the CUDA device, skipped where there is none.
#define PIPETRAIN_TEST_ON_CPU_AND_CUDA(suite, name, check)                   \
  TEST(suite, name) { check(torch::Device(torch::kCPU)); }                   \
  TEST(suite, Cuda##name) {                                                  \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device"; \
    check(torch::Device(torch::kCUDA));                                      \
  }
