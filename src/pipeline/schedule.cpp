// Builds the GPipe and 1F1B schedules and replays any schedule against a cost model. The replay is
// the single place that knows the cross-stage dependencies, so it doubles as the checker that turns
// a hand-made or buggy schedule into a readable error instead of a hung multi-process run.
#include "pipetrain/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain {
namespace {

constexpr char kGPipe[] = "gpipe";
constexpr char kOneFOneB[] = "1f1b";
constexpr char kErrorMarker[] = "  <-- ERROR HERE";

void check_shape(int64_t stages, int64_t chunks) {
  if (stages < 1) {
    throw std::invalid_argument("pipeline stages must be >= 1, got " + std::to_string(stages) +
                                "; split the model into at least one stage");
  }
  if (chunks < 1) {
    throw std::invalid_argument("pipeline chunks (micro-batches) must be >= 1, got " +
                                std::to_string(chunks) +
                                "; split each batch into at least one micro-batch");
  }
}

// A reference to one action of one stage; used for dependencies and error reports.
struct StageAction {
  int64_t stage;
  Action action;
};

std::string name_of(const StageAction& sa) { return action_name(sa.stage, sa.action); }

// What must have finished before `a` on `stage` may start, with the transfer latency that applies
// on top of that finish time.
struct Dependency {
  StageAction what;
  bool crosses_stages;
};

std::vector<Dependency> dependencies(int64_t stages, int64_t stage, const Action& a) {
  std::vector<Dependency> deps;
  if (a.phase == Phase::kForward) {
    if (stage > 0) deps.push_back({{stage - 1, {Phase::kForward, a.microbatch}}, true});
    return deps;
  }
  // The cross-stage gradient is listed first because it is what a stuck backward usually waits for.
  if (stage + 1 < stages) deps.push_back({{stage + 1, {Phase::kBackward, a.microbatch}}, true});
  deps.push_back({{stage, {Phase::kForward, a.microbatch}}, false});
  return deps;
}

size_t digits(int64_t v) { return std::to_string(v).size(); }

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

void rstrip(std::string* s) {
  while (!s->empty() && s->back() == ' ') s->pop_back();
}

// Layout of one grid: actions placed in numbered columns, optionally followed (after a "|") by
// actions that never ran, and optionally one stage flagged with kErrorMarker.
struct Grid {
  int64_t columns = 0;
  std::vector<std::vector<std::pair<int64_t, std::string>>> placed;  // [stage] -> (column, name)
  std::vector<std::vector<std::string>> pending;                     // [stage] -> names
  int64_t marked_stage = -1;
};

std::string render(const Grid& g) {
  const int64_t stages = static_cast<int64_t>(g.placed.size());
  bool any_pending = false;
  size_t cell = g.columns > 0 ? digits(g.columns - 1) : 1;
  for (int64_t s = 0; s < stages; ++s) {
    for (const auto& p : g.placed[s]) cell = std::max(cell, p.second.size());
    for (const auto& n : g.pending[s]) cell = std::max(cell, n.size());
    any_pending = any_pending || !g.pending[s].empty();
  }
  cell += 2;
  const size_t label = std::string("stage ").size() + digits(stages - 1);

  std::ostringstream out;
  std::string line(label + 1, ' ');
  for (int64_t c = 0; c < g.columns; ++c) line += pad(std::to_string(c), cell);
  if (any_pending) line += "| not run";
  rstrip(&line);
  out << line << '\n';

  for (int64_t s = 0; s < stages; ++s) {
    std::vector<std::string> cells(g.columns, ".");
    for (const auto& p : g.placed[s]) cells[p.first] = p.second;
    line = pad("stage " + std::to_string(s), label) + ' ';
    for (const auto& c : cells) line += pad(c, cell);
    if (any_pending) {
      line += "| ";
      for (const auto& n : g.pending[s]) line += pad(n, cell);
    }
    rstrip(&line);
    if (s == g.marked_stage) line += kErrorMarker;
    out << line << '\n';
  }
  return out.str();
}

// Grid in list order, for schedules too malformed to replay.
std::string order_grid(const Schedule& schedule, int64_t marked_stage) {
  Grid g;
  g.placed.resize(schedule.size());
  g.pending.resize(schedule.size());
  g.marked_stage = marked_stage;
  for (size_t s = 0; s < schedule.size(); ++s) {
    const int64_t n = static_cast<int64_t>(schedule[s].size());
    g.columns = std::max(g.columns, n);
    for (int64_t i = 0; i < n; ++i) {
      g.placed[s].emplace_back(i, action_name(static_cast<int64_t>(s), schedule[s][i]));
    }
  }
  return render(g);
}

[[noreturn]] void malformed(const Schedule& schedule, int64_t stage, const std::string& what) {
  throw std::runtime_error("malformed pipeline schedule: " + what +
                           ". Every stage must run exactly one F and one B for each micro-batch "
                           "0..chunks-1. Actions in list order:\n" +
                           order_grid(schedule, stage));
}

// Checks the per-stage bookkeeping and returns the number of micro-batches.
int64_t validate(const Schedule& schedule) {
  if (schedule.empty()) {
    throw std::invalid_argument(
        "pipeline schedule has 0 stages; build one with make_schedule(name, stages >= 1, chunks)");
  }
  const int64_t stages = static_cast<int64_t>(schedule.size());
  int64_t chunks = 0;
  size_t longest = 0;
  for (int64_t s = 0; s < stages; ++s) {
    longest = std::max(longest, schedule[s].size());
    for (const Action& a : schedule[s]) {
      if (a.microbatch < 0) {
        malformed(
            schedule, s,
            "stage " + std::to_string(s) + " has negative micro-batch in " + action_name(s, a));
      }
      chunks = std::max(chunks, a.microbatch + 1);
    }
  }
  if (chunks == 0) malformed(schedule, 0, "no stage has any action");
  // Caught before sizing per-micro-batch tables, so a stray huge index cannot exhaust memory.
  if (static_cast<uint64_t>(chunks) > longest) {
    for (int64_t s = 0; s < stages; ++s) {
      for (const Action& a : schedule[s]) {
        if (a.microbatch + 1 == chunks) {
          malformed(schedule, s,
                    action_name(s, a) + " implies " + std::to_string(chunks) +
                        " micro-batches, more than the longest stage has actions (" +
                        std::to_string(longest) + ")");
        }
      }
    }
  }

  for (int64_t s = 0; s < stages; ++s) {
    std::vector<int> seen_f(chunks, 0), seen_b(chunks, 0);
    for (const Action& a : schedule[s]) {
      int& count = (a.phase == Phase::kForward ? seen_f : seen_b)[a.microbatch];
      if (++count > 1) {
        malformed(schedule, s,
                  "stage " + std::to_string(s) + " runs " + action_name(s, a) + " twice");
      }
    }
    for (int64_t m = 0; m < chunks; ++m) {
      for (Phase ph : {Phase::kForward, Phase::kBackward}) {
        if ((ph == Phase::kForward ? seen_f : seen_b)[m] == 0) {
          malformed(schedule, s,
                    "stage " + std::to_string(s) + " has no " + action_name(s, {ph, m}) +
                        " although the schedule uses " + std::to_string(chunks) + " micro-batches");
        }
      }
    }
  }
  return chunks;
}

// Result of replaying a schedule as far as its dependencies allow.
struct Replay {
  std::vector<size_t> next;                       // [stage] index of the first action not run
  std::vector<std::vector<double>> start;         // [stage][i] for i < next[stage]
  std::vector<std::vector<double>> end_f, end_b;  // [stage][mb], NaN while not run
  double end_time = 0.0;

  double end_of(const StageAction& sa) const {
    return (sa.action.phase == Phase::kForward ? end_f : end_b)[sa.stage][sa.action.microbatch];
  }
  bool done(const StageAction& sa) const { return !std::isnan(end_of(sa)); }
  bool complete(const Schedule& schedule) const {
    for (size_t s = 0; s < schedule.size(); ++s) {
      if (next[s] < schedule[s].size()) return false;
    }
    return true;
  }
};

// Each stage starts its next action once its previous one and all dependencies have finished.
// Start times depend only on dependencies, never on the order stages are visited in, so a simple
// sweep until nothing advances gives the same answer as an event queue.
Replay replay(const Schedule& schedule, int64_t chunks, const ActionCosts& costs) {
  const int64_t stages = static_cast<int64_t>(schedule.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Replay r;
  r.next.assign(stages, 0);
  r.start.resize(stages);
  r.end_f.assign(stages, std::vector<double>(chunks, nan));
  r.end_b.assign(stages, std::vector<double>(chunks, nan));
  std::vector<double> free_at(stages, 0.0);

  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      while (r.next[s] < schedule[s].size()) {
        const Action& a = schedule[s][r.next[s]];
        double ready = free_at[s];
        bool blocked = false;
        for (const Dependency& d : dependencies(stages, s, a)) {
          if (!r.done(d.what)) {
            blocked = true;
            break;
          }
          ready = std::max(ready, r.end_of(d.what) + (d.crosses_stages ? costs.transfer : 0.0));
        }
        if (blocked) break;
        const bool fwd = a.phase == Phase::kForward;
        const double end = ready + (fwd ? costs.forward[s] : costs.backward[s]);
        r.start[s].push_back(ready);
        (fwd ? r.end_f : r.end_b)[s][a.microbatch] = end;
        free_at[s] = end;
        r.end_time = std::max(r.end_time, end);
        ++r.next[s];
        progress = true;
      }
    }
  }
  return r;
}

// Picks the stage to blame for a deadlock and explains what it waits for. Blame goes to a stage
// whose next action waits on something it or its neighbour has scheduled later. Following waits
// from head to head always reaches such a stage: forwards wait only on lower stages and backwards
// on higher ones, so a chain of heads cannot loop; the visited check is only a safety net.
std::string explain_deadlock(const Schedule& schedule, const Replay& r, int64_t* marked) {
  const int64_t stages = static_cast<int64_t>(schedule.size());
  auto head = [&](int64_t s) { return StageAction{s, schedule[s][r.next[s]]}; };
  auto stuck = [&](int64_t s) { return r.next[s] < schedule[s].size(); };
  auto unmet = [&](int64_t s) {
    std::vector<StageAction> out;
    for (const Dependency& d : dependencies(stages, s, head(s).action)) {
      if (!r.done(d.what)) out.push_back(d.what);
    }
    return out;
  };

  int64_t blame = -1;
  for (int64_t s = 0; s < stages && blame < 0; ++s) {
    if (!stuck(s)) continue;
    for (const StageAction& w : unmet(s)) {
      if (w.stage == s) blame = s;
    }
  }
  if (blame < 0) {
    int64_t cur = 0;
    while (!stuck(cur)) ++cur;
    std::vector<bool> visited(stages, false);
    while (true) {
      visited[cur] = true;
      const StageAction w = unmet(cur).front();
      if (!(head(w.stage).action == w.action) || visited[w.stage]) {
        blame = cur;
        break;
      }
      cur = w.stage;
    }
  }

  std::string msg = "stage " + std::to_string(blame) + " is stuck at " + name_of(head(blame)) +
                    ", which waits for ";
  const std::vector<StageAction> waits = unmet(blame);
  for (size_t i = 0; i < waits.size(); ++i) {
    const StageAction& w = waits[i];
    if (i > 0) msg += " and ";
    msg += name_of(w);
    if (w.stage == blame) {
      msg += " (later in stage " + std::to_string(blame) + "'s own list)";
    } else if (head(w.stage).action == w.action) {
      msg += " (stage " + std::to_string(w.stage) + "'s next action, itself stuck)";
    } else {
      msg += " (stage " + std::to_string(w.stage) + " only gets to it after " +
             name_of(head(w.stage)) + ", which is stuck)";
    }
  }
  *marked = blame;
  return msg;
}

// Grid of a unit-cost replay. Unit costs make every start time an integer slot; actions that
// never ran are listed after a "|" in list order.
std::string time_grid(const Schedule& schedule, const Replay& r, int64_t marked_stage) {
  Grid g;
  const size_t stages = schedule.size();
  g.columns = static_cast<int64_t>(std::llround(r.end_time));
  g.placed.resize(stages);
  g.pending.resize(stages);
  g.marked_stage = marked_stage;
  for (size_t s = 0; s < stages; ++s) {
    const int64_t stage = static_cast<int64_t>(s);
    for (size_t i = 0; i < schedule[s].size(); ++i) {
      const std::string name = action_name(stage, schedule[s][i]);
      if (i < r.next[s]) {
        g.placed[s].emplace_back(std::llround(r.start[s][i]), name);
      } else {
        g.pending[s].push_back(name);
      }
    }
  }
  return render(g);
}

[[noreturn]] void deadlock(const Schedule& schedule, int64_t chunks) {
  // The unit-cost replay gets stuck at the same actions as any other, because which actions can run
  // never depends on durations; it just yields a grid with integer slots.
  const Replay unit =
      replay(schedule, chunks, ActionCosts::uniform(static_cast<int64_t>(schedule.size())));
  int64_t marked = -1;
  const std::string why = explain_deadlock(schedule, unit, &marked);
  throw std::runtime_error(
      "pipeline schedule can never finish: " + why +
      ". Order each stage's actions so that F(s,m) can follow F(s-1,m) and B(s,m) can follow "
      "B(s+1,m) and F(s,m).\n" +
      time_grid(schedule, unit, marked));
}

void check_costs(const ActionCosts& costs, int64_t stages) {
  auto check_list = [&](const std::vector<double>& v, const char* what) {
    if (static_cast<int64_t>(v.size()) != stages) {
      throw std::invalid_argument("ActionCosts." + std::string(what) + " has " +
                                  std::to_string(v.size()) + " entries but the schedule has " +
                                  std::to_string(stages) + " stages; give one cost per stage");
    }
    for (size_t s = 0; s < v.size(); ++s) {
      if (!(v[s] >= 0.0) || !std::isfinite(v[s])) {
        throw std::invalid_argument("ActionCosts." + std::string(what) + "[" + std::to_string(s) +
                                    "] = " + std::to_string(v[s]) +
                                    " is not a finite non-negative time");
      }
    }
  };
  check_list(costs.forward, "forward");
  check_list(costs.backward, "backward");
  if (!(costs.transfer >= 0.0) || !std::isfinite(costs.transfer)) {
    throw std::invalid_argument("ActionCosts.transfer = " + std::to_string(costs.transfer) +
                                " is not a finite non-negative time");
  }
}

}  // namespace

bool Action::operator==(const Action& other) const {
  return phase == other.phase && microbatch == other.microbatch;
}

std::ostream& operator<<(std::ostream& os, const Action& a) {
  return os << (a.phase == Phase::kForward ? 'F' : 'B') << a.microbatch;
}

std::string action_name(int64_t stage, const Action& a) {
  return std::to_string(stage) + (a.phase == Phase::kForward ? "F" : "B") +
         std::to_string(a.microbatch);
}

Schedule gpipe_schedule(int64_t stages, int64_t chunks) {
  check_shape(stages, chunks);
  Schedule schedule(stages);
  for (auto& actions : schedule) {
    actions.reserve(2 * chunks);
    for (int64_t m = 0; m < chunks; ++m) actions.push_back({Phase::kForward, m});
    for (int64_t m = chunks - 1; m >= 0; --m) actions.push_back({Phase::kBackward, m});
  }
  return schedule;
}

Schedule one_f_one_b_schedule(int64_t stages, int64_t chunks) {
  check_shape(stages, chunks);
  Schedule schedule(stages);
  for (int64_t s = 0; s < stages; ++s) {
    auto& actions = schedule[s];
    actions.reserve(2 * chunks);
    const int64_t warmup = std::min(stages - s - 1, chunks);
    int64_t f = 0, b = 0;
    while (f < warmup) actions.push_back({Phase::kForward, f++});
    while (f < chunks) {
      actions.push_back({Phase::kForward, f++});
      actions.push_back({Phase::kBackward, b++});
    }
    while (b < chunks) actions.push_back({Phase::kBackward, b++});
  }
  return schedule;
}

std::vector<std::string> schedule_names() { return {kGPipe, kOneFOneB}; }

Schedule make_schedule(const std::string& name, int64_t stages, int64_t chunks) {
  if (name == kGPipe) return gpipe_schedule(stages, chunks);
  if (name == kOneFOneB) return one_f_one_b_schedule(stages, chunks);
  std::string known;
  for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "'; choose one of: " + known);
}

ActionCosts ActionCosts::uniform(int64_t stages, double forward, double backward) {
  if (stages < 1) {
    throw std::invalid_argument("ActionCosts::uniform needs stages >= 1, got " +
                                std::to_string(stages));
  }
  ActionCosts costs;
  costs.forward.assign(stages, forward);
  costs.backward.assign(stages, backward);
  check_costs(costs, stages);
  return costs;
}

Simulation simulate(const Schedule& schedule, const ActionCosts& costs) {
  const int64_t chunks = validate(schedule);
  const int64_t stages = static_cast<int64_t>(schedule.size());
  check_costs(costs, stages);
  const Replay r = replay(schedule, chunks, costs);
  if (!r.complete(schedule)) deadlock(schedule, chunks);

  Simulation sim;
  sim.step_time = r.end_time;
  sim.start_time = r.start;
  sim.busy_time.assign(stages, 0.0);
  double busy = 0.0;
  for (int64_t s = 0; s < stages; ++s) {
    sim.busy_time[s] = static_cast<double>(chunks) * (costs.forward[s] + costs.backward[s]);
    busy += sim.busy_time[s];
  }
  // A zero-cost step has no idle time to speak of; avoid reporting 0/0.
  sim.bubble_fraction =
      sim.step_time > 0.0 ? 1.0 - busy / (static_cast<double>(stages) * sim.step_time) : 0.0;
  return sim;
}

std::string format_schedule(const Schedule& schedule) {
  const int64_t chunks = validate(schedule);
  const Replay r =
      replay(schedule, chunks, ActionCosts::uniform(static_cast<int64_t>(schedule.size())));
  if (!r.complete(schedule)) deadlock(schedule, chunks);
  return time_grid(schedule, r, -1);
}

}  // namespace pipetrain
