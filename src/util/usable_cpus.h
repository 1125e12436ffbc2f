// The CPUs this process may run on.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <thread>

namespace pipetrain {

// Respects taskset and cpusets, unlike the number of CPUs in the machine: what processes started
// here share.
inline int64_t usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    return CPU_COUNT(&set);
  }
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

}  // namespace pipetrain
