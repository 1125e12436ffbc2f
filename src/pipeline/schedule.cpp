// Builds the GPipe, 1F1B and ZB-H1 schedules and replays any schedule against a cost model. The
// replay is the single place that knows the cross-stage dependencies, so it doubles as the checker
// that turns a hand-made or buggy schedule into a readable error instead of a hung multi-process
// run.
#include "pipetrain/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
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
constexpr char kZBH1[] = "zbh1";
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

char letter(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return 'F';
    case Phase::kBackward:
      return 'B';
    case Phase::kInputBackward:
      return 'I';
    case Phase::kWeightBackward:
      return 'W';
  }
  return '?';
}

// What a valid schedule is made of: its micro-batch count, and for each stage and micro-batch
// whether its backward is whole (B) or split (I then W).
struct Shape {
  int64_t chunks = 0;
  std::vector<std::vector<Phase>> gradient_phase;  // [stage][mb]: kBackward or kInputBackward
};

std::vector<Dependency> dependencies(const Shape& shape, int64_t stage, const Action& a) {
  const int64_t stages = static_cast<int64_t>(shape.gradient_phase.size());
  std::vector<Dependency> deps;
  switch (a.phase) {
    case Phase::kForward:
      if (stage > 0) deps.push_back({{stage - 1, {Phase::kForward, a.microbatch}}, true});
      break;
    case Phase::kBackward:
    case Phase::kInputBackward:
      // The cross-stage gradient is listed first: it is what a stuck backward usually waits for.
      if (stage + 1 < stages) {
        deps.push_back(
            {{stage + 1, {shape.gradient_phase[stage + 1][a.microbatch], a.microbatch}}, true});
      }
      deps.push_back({{stage, {Phase::kForward, a.microbatch}}, false});
      break;
    case Phase::kWeightBackward:
      deps.push_back({{stage, {Phase::kInputBackward, a.microbatch}}, false});
      break;
  }
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
                           ". Every stage must run, for each micro-batch 0..chunks-1, one F and "
                           "either one B or one I followed by one W. Actions in list order:\n" +
                           order_grid(schedule, stage));
}

// Checks the per-stage bookkeeping and returns what the schedule is made of.
Shape validate(const Schedule& schedule) {
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

  Shape shape;
  shape.chunks = chunks;
  shape.gradient_phase.assign(stages, std::vector<Phase>(chunks, Phase::kBackward));
  for (int64_t s = 0; s < stages; ++s) {
    // seen[m][phase]: how often stage s runs that action.
    std::vector<std::array<int, 4>> seen(chunks, std::array<int, 4>{});
    for (const Action& a : schedule[s]) {
      if (++seen[a.microbatch][static_cast<int>(a.phase)] > 1) {
        malformed(schedule, s,
                  "stage " + std::to_string(s) + " runs " + action_name(s, a) + " twice");
      }
    }
    const std::string uses =
        " although the schedule uses " + std::to_string(chunks) + " micro-batches";
    for (int64_t m = 0; m < chunks; ++m) {
      auto count = [&](Phase ph) { return seen[m][static_cast<int>(ph)]; };
      auto name = [&](Phase ph) { return action_name(s, {ph, m}); };
      const std::string stage = "stage " + std::to_string(s);
      if (count(Phase::kForward) == 0) {
        malformed(schedule, s, stage + " has no " + name(Phase::kForward) + uses);
      }
      const bool whole = count(Phase::kBackward) == 1;
      const bool input = count(Phase::kInputBackward) == 1;
      const bool weight = count(Phase::kWeightBackward) == 1;
      if (whole && (input || weight)) {
        malformed(schedule, s,
                  stage + " runs both " + name(Phase::kBackward) + " and " +
                      name(input ? Phase::kInputBackward : Phase::kWeightBackward) +
                      ": a backward is either whole (B) or split (I and W)");
      }
      if (!whole && !input && !weight) {
        malformed(schedule, s,
                  stage + " has no " + name(Phase::kBackward) + " (nor " +
                      name(Phase::kInputBackward) + " and " + name(Phase::kWeightBackward) + ")" +
                      uses);
      }
      if (input != weight) {
        malformed(schedule, s,
                  stage + " has " + name(input ? Phase::kInputBackward : Phase::kWeightBackward) +
                      " but no " + name(input ? Phase::kWeightBackward : Phase::kInputBackward) +
                      ": a split backward needs both halves");
      }
      if (input) shape.gradient_phase[s][m] = Phase::kInputBackward;
    }
  }
  return shape;
}

// How long an action takes in a replay.
using CostFn = std::function<double(int64_t stage, Phase phase)>;

// Every action one slot: the grids' time axis.
double one_slot(int64_t, Phase) { return 1.0; }

// Result of replaying a schedule as far as its dependencies allow.
struct Replay {
  std::vector<size_t> next;                             // [stage] index of the first action not run
  std::vector<std::vector<double>> start;               // [stage][i] for i < next[stage]
  std::vector<std::vector<std::array<double, 4>>> end;  // [stage][mb][phase], NaN while not run
  double end_time = 0.0;

  double end_of(const StageAction& sa) const {
    return end[sa.stage][sa.action.microbatch][static_cast<int>(sa.action.phase)];
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
Replay replay(const Schedule& schedule, const Shape& shape, const CostFn& cost, double transfer) {
  const int64_t stages = static_cast<int64_t>(schedule.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Replay r;
  r.next.assign(stages, 0);
  r.start.resize(stages);
  r.end.assign(stages, std::vector<std::array<double, 4>>(shape.chunks, {nan, nan, nan, nan}));
  std::vector<double> free_at(stages, 0.0);

  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      while (r.next[s] < schedule[s].size()) {
        const Action& a = schedule[s][r.next[s]];
        double ready = free_at[s];
        bool blocked = false;
        for (const Dependency& d : dependencies(shape, s, a)) {
          if (!r.done(d.what)) {
            blocked = true;
            break;
          }
          ready = std::max(ready, r.end_of(d.what) + (d.crosses_stages ? transfer : 0.0));
        }
        if (blocked) break;
        const double end = ready + cost(s, a.phase);
        r.start[s].push_back(ready);
        r.end[s][a.microbatch][static_cast<int>(a.phase)] = end;
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
std::string explain_deadlock(const Schedule& schedule, const Shape& shape, const Replay& r,
                             int64_t* marked) {
  const int64_t stages = static_cast<int64_t>(schedule.size());
  auto head = [&](int64_t s) { return StageAction{s, schedule[s][r.next[s]]}; };
  auto stuck = [&](int64_t s) { return r.next[s] < schedule[s].size(); };
  auto unmet = [&](int64_t s) {
    std::vector<StageAction> out;
    for (const Dependency& d : dependencies(shape, s, head(s).action)) {
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

[[noreturn]] void deadlock(const Schedule& schedule, const Shape& shape) {
  // The one-slot replay gets stuck at the same actions as any other, because which actions can run
  // never depends on durations; it just yields a grid with integer slots.
  const Replay unit = replay(schedule, shape, one_slot, 0.0);
  int64_t marked = -1;
  const std::string why = explain_deadlock(schedule, shape, unit, &marked);
  throw std::runtime_error(
      "pipeline schedule can never finish: " + why +
      ". Order each stage's actions so that F(s,m) can follow F(s-1,m), B or I (s,m) can follow "
      "F(s,m) and the B or I of (s+1,m), and W(s,m) can follow I(s,m).\n" +
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
  if (!costs.weight.empty()) {
    check_list(costs.weight, "weight");
    for (int64_t s = 0; s < stages; ++s) {
      if (costs.weight[s] > costs.backward[s]) {
        throw std::invalid_argument(
            "ActionCosts.weight[" + std::to_string(s) + "] = " + std::to_string(costs.weight[s]) +
            " exceeds backward[" + std::to_string(s) + "] = " + std::to_string(costs.backward[s]) +
            ": the weight gradients are part of the backward");
      }
    }
  }
  if (!(costs.transfer >= 0.0) || !std::isfinite(costs.transfer)) {
    throw std::invalid_argument("ActionCosts.transfer = " + std::to_string(costs.transfer) +
                                " is not a finite non-negative time");
  }
}

// 1F1B's order on stage s: min(stages - s - 1, chunks) warm-up forwards, then one forward and one
// backward while forwards remain, then the remaining backwards; `backward()` appends the stage's
// next backward.
template <typename Backward>
void one_f_one_b_order(int64_t stages, int64_t s, int64_t chunks, std::vector<Action>& actions,
                       Backward backward) {
  const int64_t warmup = std::min(stages - s - 1, chunks);
  int64_t f = 0;
  while (f < warmup) actions.push_back({Phase::kForward, f++});
  while (f < chunks) {
    actions.push_back({Phase::kForward, f++});
    backward();
  }
  for (int64_t b = warmup; b > 0; --b) backward();
}

}  // namespace

bool Action::operator==(const Action& other) const {
  return phase == other.phase && microbatch == other.microbatch;
}

std::ostream& operator<<(std::ostream& os, const Action& a) {
  return os << letter(a.phase) << a.microbatch;
}

std::string action_name(int64_t stage, const Action& a) {
  return std::to_string(stage) + letter(a.phase) + std::to_string(a.microbatch);
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
    int64_t b = 0;
    one_f_one_b_order(stages, s, chunks, actions, [&] {
      actions.push_back({Phase::kBackward, b++});
    });
  }
  return schedule;
}

Schedule zbh1_schedule(int64_t stages, int64_t chunks) {
  check_shape(stages, chunks);
  Schedule schedule(stages);
  for (int64_t s = 0; s < stages; ++s) {
    auto& actions = schedule[s];
    actions.reserve(3 * chunks);
    int64_t i = 0, w = 0;
    // Each I, followed by the W that is `s` micro-batches behind it, if any.
    one_f_one_b_order(stages, s, chunks, actions, [&] {
      actions.push_back({Phase::kInputBackward, i++});
      if (i - w > s) actions.push_back({Phase::kWeightBackward, w++});
    });
    while (w < chunks) actions.push_back({Phase::kWeightBackward, w++});
  }
  return schedule;
}

std::vector<std::string> schedule_names() { return {kGPipe, kOneFOneB, kZBH1}; }

Schedule make_schedule(const std::string& name, int64_t stages, int64_t chunks) {
  if (name == kGPipe) return gpipe_schedule(stages, chunks);
  if (name == kOneFOneB) return one_f_one_b_schedule(stages, chunks);
  if (name == kZBH1) return zbh1_schedule(stages, chunks);
  std::string known;
  for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "'; choose one of: " + known);
}

ActionCosts ActionCosts::uniform(int64_t stages, double forward, double backward, double weight) {
  if (stages < 1) {
    throw std::invalid_argument("ActionCosts::uniform needs stages >= 1, got " +
                                std::to_string(stages));
  }
  ActionCosts costs;
  costs.forward.assign(stages, forward);
  costs.backward.assign(stages, backward);
  if (weight != 0.0) costs.weight.assign(stages, weight);
  check_costs(costs, stages);
  return costs;
}

double ActionCosts::cost(int64_t stage, Phase phase) const {
  const double w = weight.empty() ? 0.0 : weight[stage];
  switch (phase) {
    case Phase::kForward:
      return forward[stage];
    case Phase::kBackward:
      return backward[stage];
    case Phase::kInputBackward:
      return backward[stage] - w;
    case Phase::kWeightBackward:
      return w;
  }
  return 0.0;
}

Simulation simulate(const Schedule& schedule, const ActionCosts& costs) {
  const Shape shape = validate(schedule);
  const int64_t stages = static_cast<int64_t>(schedule.size());
  check_costs(costs, stages);
  const Replay r = replay(
      schedule, shape, [&](int64_t s, Phase ph) { return costs.cost(s, ph); }, costs.transfer);
  if (!r.complete(schedule)) deadlock(schedule, shape);

  Simulation sim;
  sim.step_time = r.end_time;
  sim.start_time = r.start;
  sim.busy_time.assign(stages, 0.0);
  double busy = 0.0;
  for (int64_t s = 0; s < stages; ++s) {
    for (const Action& a : schedule[s]) sim.busy_time[s] += costs.cost(s, a.phase);
    busy += sim.busy_time[s];
  }
  // A zero-cost step has no idle time to speak of; avoid reporting 0/0.
  sim.bubble_fraction =
      sim.step_time > 0.0 ? 1.0 - busy / (static_cast<double>(stages) * sim.step_time) : 0.0;
  return sim;
}

std::string format_schedule(const Schedule& schedule) {
  const Shape shape = validate(schedule);
  const Replay r = replay(schedule, shape, one_slot, 0.0);
  if (!r.complete(schedule)) deadlock(schedule, shape);
  return time_grid(schedule, r, -1);
}

}  // namespace pipetrain
