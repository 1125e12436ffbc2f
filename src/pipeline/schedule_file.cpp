#include "schedule_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

// `schedule`, after a unit-cost simulation has shown it runs (every action once, no deadlock) and
// its transfers between ranks come in the order they go: a malformed one fails here, with its
// grid, rather than hanging the ranks or mixing up micro-batches.
Schedule checked(Schedule schedule) {
  simulate(schedule, ActionCosts::uniform(static_cast<int64_t>(stage_placement(schedule).size())));
  check_transfer_order(schedule);
  return schedule;
}

}  // namespace

int64_t max_activations_held(const Schedule& schedule) {
  const std::vector<int64_t> held = activations_held(schedule);
  return *std::max_element(held.begin(), held.end());
}

Schedule checked_schedule(const std::string& name, int64_t ranks, int64_t chunks,
                          int64_t virtual_stages) {
  return checked(make_schedule(name, ranks, chunks, virtual_stages));
}

Schedule read_schedule_file(const std::string& path, int64_t ranks, int64_t stages,
                            int64_t chunks) {
  std::ifstream in(path);
  if (!in) {
    throw std::invalid_argument(
        "cannot read the schedule file '" + path +
        "' (PipeOptions::schedule_file, --schedule-file): " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  Schedule schedule;
  try {
    schedule = checked(parse_schedule_csv(text.str()));
  } catch (const std::exception& e) {
    throw std::invalid_argument("the schedule file '" + path + "': " + error_message(e));
  }
  const auto placement = stage_placement(schedule);
  int64_t microbatches = 0;
  for (const auto& actions : schedule) {
    for (const Action& a : actions) microbatches = std::max(microbatches, a.microbatch + 1);
  }
  const auto says = "the schedule file '" + path + "' ";
  if (static_cast<int64_t>(schedule.size()) != ranks) {
    throw std::invalid_argument(says + "has " + std::to_string(schedule.size()) +
                                " lines (ranks) but " + std::to_string(ranks) +
                                " processes run the pipeline: one line per process");
  }
  if (static_cast<int64_t>(placement.size()) != stages) {
    throw std::invalid_argument(
        says + "runs " + std::to_string(placement.size()) + " stages on " + std::to_string(ranks) +
        " ranks but the pipe has " + std::to_string(stages) +
        ": set the virtual stages (--virtual-stages) to stages / ranks, and the balance to match");
  }
  if (microbatches != chunks) {
    throw std::invalid_argument(says + "runs " + std::to_string(microbatches) +
                                " micro-batches but chunks is " + std::to_string(chunks) +
                                ": set chunks (--chunks) to " + std::to_string(microbatches));
  }
  return schedule;
}

}  // namespace pipetrain
