// A timeline of a run, for seeing where each stage waits: spans for forward, backward, send,
// receive and the optimizer step on every rank, written as Chrome trace JSON (opens in Perfetto
// or chrome://tracing; one process row per rank). On a GPU the spans are timed with CUDA events on
// the compute stream, so they show when the GPU did the work (a receive spans the time the stream
// waited for its data), not when the CPU issued it, and recording them never waits on the GPU.
//
//   auto trace = std::make_shared<pipetrain::Trace>();
//   PipeOptions().trace(trace);  // the Trainer does this for TrainerOptions().trace("run.json")
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

class World;

class Trace {
 public:
  // Spans beyond this many are dropped (a long run's first steps tell the story).
  static constexpr int64_t kMaxSpans = 200000;

  Trace();
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Sets time zero on every rank of `world` (a collective), on its device's clock.
  void start(const World& world);

  // Ends when it goes out of scope. `microbatch` < 0: none.
  class Span {
   public:
    Span(Trace* trace, const char* name, int64_t microbatch = -1);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Trace* trace_;
    int64_t index_ = -1;
  };
  // A span named `name` from now until the Span is destroyed; does nothing before start().
  Span span(const char* name, int64_t microbatch = -1) { return Span(this, name, microbatch); }

  // Gathers every rank's spans on rank 0, which writes `path` (a collective).
  void write(const World& world, const std::string& path);

  // Milliseconds this rank spent in spans of each name (waits for the GPU to finish them).
  std::map<std::string, double> total_ms();

 private:
  struct Mark;  // a point in time: a CUDA event or a clock reading
  struct Record {
    std::string name;
    int64_t microbatch;
    std::unique_ptr<Mark> begin, end;
  };
  std::unique_ptr<Mark> mark_now();
  // Microseconds from time zero to `mark` (waits for the GPU to reach it).
  double micros(const Mark& mark);
  std::string events_json(int64_t rank);

  bool started_ = false;
  c10::Device device_{c10::DeviceType::CPU};
  std::unique_ptr<Mark> zero_;
  std::vector<Record> records_;
};

}  // namespace pipetrain
