#include "pipeline/trace.h"

#include <torch/torch.h>

#ifdef PIPETRAIN_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "io/file_writer.h"
#include "pipetrain/world.h"

namespace pipetrain {

struct Trace::Mark {
  std::chrono::steady_clock::time_point time;
#ifdef PIPETRAIN_HAS_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> event;  // timing-enabled
#endif
};

Trace::Trace() = default;
Trace::~Trace() = default;

std::unique_ptr<Trace::Mark> Trace::mark_now() {
  auto mark = std::make_unique<Mark>();
#ifdef PIPETRAIN_HAS_CUDA
  if (device_.is_cuda()) {
    mark->event = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    mark->event->record(at::cuda::getCurrentCUDAStream());
    return mark;
  }
#endif
  mark->time = std::chrono::steady_clock::now();
  return mark;
}

double Trace::micros(const Mark& mark) {
#ifdef PIPETRAIN_HAS_CUDA
  if (mark.event) {
    mark.event->synchronize();
    return 1e3 * zero_->event->elapsed_time(*mark.event);
  }
#endif
  return std::chrono::duration<double, std::micro>(mark.time - zero_->time).count();
}

void Trace::start(const World& world) {
  device_ = world.device();
  if (device_.is_cuda()) torch::cuda::synchronize();
  world.barrier();
  zero_ = mark_now();
  records_.clear();
  started_ = true;
}

Trace::Span::Span(Trace* trace, const char* name, int64_t microbatch) : trace_(trace) {
  if (!trace_ || !trace_->started_ || static_cast<int64_t>(trace_->records_.size()) >= kMaxSpans) {
    trace_ = nullptr;
    return;
  }
  trace_->records_.push_back({name, microbatch, trace_->mark_now(), nullptr});
  index_ = static_cast<int64_t>(trace_->records_.size()) - 1;
}

Trace::Span::~Span() {
  if (trace_) trace_->records_[index_].end = trace_->mark_now();
}

std::string Trace::events_json(int64_t rank) {
  std::ostringstream out;
  out.precision(3);
  out << std::fixed;
  bool first = true;
  for (const Record& record : records_) {
    if (!record.end) continue;
    const double begin = micros(*record.begin);
    out << (first ? "" : ",\n") << "{\"name\": \"" << record.name
        << (record.microbatch >= 0 ? " " + std::to_string(record.microbatch) : "")
        << "\", \"cat\": \"" << record.name << "\", \"ph\": \"X\", \"pid\": " << rank
        << ", \"tid\": 0, \"ts\": " << begin << ", \"dur\": " << micros(*record.end) - begin << "}";
    first = false;
  }
  return out.str();
}

std::map<std::string, double> Trace::total_ms() {
  std::map<std::string, double> totals;
  for (const Record& record : records_) {
    if (record.end) totals[record.name] += (micros(*record.end) - micros(*record.begin)) / 1e3;
  }
  return totals;
}

void Trace::write(const World& world, const std::string& path) {
  if (!started_) return;
  const std::string mine = events_json(world.rank());
  std::vector<std::string> all;
  for (int64_t r = 0; r < world.size(); ++r) all.push_back(world.broadcast(mine, r));
  if (!world.is_global_zero()) return;
  std::ostringstream file;
  file << "{\"traceEvents\": [\n";
  bool first = true;
  for (int64_t r = 0; r < world.size(); ++r) {
    file << (first ? "" : ",\n") << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << r
         << ", \"args\": {\"name\": \"rank " << r << "\"}}";
    first = false;
    if (!all[r].empty()) file << ",\n" << all[r];
  }
  file << "\n], \"displayTimeUnit\": \"ms\"}\n";
  write_file(path, file.str());
}

}  // namespace pipetrain
