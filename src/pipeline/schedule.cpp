// Builds the schedules (GPipe, 1F1B, the zero-bubble and interleaved ones) and replays any schedule
// against a cost model. The replay is the single place that knows the cross-stage dependencies, so
// it doubles as the checker that turns a hand-made or buggy schedule into a readable error instead
// of a hung multi-process run.
#include "pipetrain/schedule.h"

#include "pipeline/plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pipetrain {
namespace {

constexpr char kGPipe[] = "gpipe";
constexpr char kOneFOneB[] = "1f1b";
constexpr char kZBH1[] = "zbh1";
constexpr char kZBH2[] = "zbh2";
constexpr char kInterleaved[] = "interleaved1f1b";
constexpr char kZBV[] = "zbv";
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

// The stage an action of rank `rank`'s list runs on.
int64_t stage_of(int64_t rank, const Action& a) { return a.stage >= 0 ? a.stage : rank; }

// Whether rank r runs stage r and no other, for every r: the rows of grids and messages are then
// stages, else ranks.
bool one_stage_per_rank(const Schedule& schedule) {
  for (size_t r = 0; r < schedule.size(); ++r) {
    for (const Action& a : schedule[r]) {
      if (stage_of(static_cast<int64_t>(r), a) != static_cast<int64_t>(r)) return false;
    }
  }
  return true;
}

std::string row_word(const Schedule& schedule, int64_t rank) {
  return (one_stage_per_rank(schedule) ? "stage " : "rank ") + std::to_string(rank);
}

// What a valid schedule is made of: its micro-batch count, which rank runs each stage, and for
// each stage and micro-batch whether its backward is whole (B) or split (I then W).
struct Shape {
  int64_t chunks = 0;
  std::vector<int64_t> rank_of;                    // [stage]
  std::vector<std::vector<Phase>> gradient_phase;  // [stage][mb]: kBackward or kInputBackward
  Schedule resolved;  // the schedule with every action's stage filled in
  int64_t stages() const { return static_cast<int64_t>(rank_of.size()); }
  // "stage 1" where rank r runs stage r alone, else "rank 1".
  std::string row(int64_t rank) const { return row_word(resolved, rank); }
};

std::vector<Dependency> dependencies(const Shape& shape, int64_t stage, const Action& a) {
  std::vector<Dependency> deps;
  auto on = [&](int64_t other, Phase phase) {
    deps.push_back(
        {{other, {phase, a.microbatch, other}}, shape.rank_of[other] != shape.rank_of[stage]});
  };
  switch (a.phase) {
    case Phase::kForward:
      if (stage > 0) on(stage - 1, Phase::kForward);
      break;
    case Phase::kBackward:
    case Phase::kInputBackward:
      // The cross-stage gradient is listed first: it is what a stuck backward usually waits for.
      if (stage + 1 < shape.stages()) on(stage + 1, shape.gradient_phase[stage + 1][a.microbatch]);
      on(stage, Phase::kForward);
      break;
    case Phase::kWeightBackward:
      on(stage, Phase::kInputBackward);
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
  std::string row_word = "stage";  // rows are stages, or ranks of several stages each
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
  const size_t label = g.row_word.size() + 1 + digits(stages - 1);

  std::ostringstream out;
  std::string line(label + 1, ' ');
  for (int64_t c = 0; c < g.columns; ++c) line += pad(std::to_string(c), cell);
  if (any_pending) line += "| not run";
  rstrip(&line);
  out << line << '\n';

  for (int64_t s = 0; s < stages; ++s) {
    std::vector<std::string> cells(g.columns, ".");
    for (const auto& p : g.placed[s]) cells[p.first] = p.second;
    line = pad(g.row_word + " " + std::to_string(s), label) + ' ';
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
  g.row_word = one_stage_per_rank(schedule) ? "stage" : "rank";
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
  const int64_t ranks = static_cast<int64_t>(schedule.size());
  int64_t chunks = 0, stages = 0, total = 0;
  size_t longest = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    longest = std::max(longest, schedule[r].size());
    total += static_cast<int64_t>(schedule[r].size());
    for (const Action& a : schedule[r]) {
      if (a.microbatch < 0) {
        malformed(schedule, r,
                  row_word(schedule, r) + " has negative micro-batch in " + action_name(r, a));
      }
      chunks = std::max(chunks, a.microbatch + 1);
      stages = std::max(stages, stage_of(r, a) + 1);
    }
  }
  if (chunks == 0) malformed(schedule, 0, "no stage has any action");
  // Caught before sizing per-micro-batch and per-stage tables, so a stray huge index cannot
  // exhaust memory.
  for (int64_t r = 0; r < ranks; ++r) {
    for (const Action& a : schedule[r]) {
      if (static_cast<uint64_t>(chunks) > longest && a.microbatch + 1 == chunks) {
        malformed(schedule, r,
                  action_name(r, a) + " implies " + std::to_string(chunks) +
                      " micro-batches, more than the longest stage has actions (" +
                      std::to_string(longest) + ")");
      }
      if (stages > total && stage_of(r, a) + 1 == stages) {
        malformed(schedule, r,
                  action_name(r, a) + " implies " + std::to_string(stages) +
                      " stages, more than the schedule has actions");
      }
    }
  }

  Shape shape;
  shape.chunks = chunks;
  shape.rank_of.assign(stages, -1);
  shape.gradient_phase.assign(stages, std::vector<Phase>(chunks, Phase::kBackward));
  shape.resolved = schedule;
  // seen[stage][m][phase]: how often the stage runs that action.
  std::vector<std::vector<std::array<int, 4>>> seen(
      stages, std::vector<std::array<int, 4>>(chunks, std::array<int, 4>{}));
  for (int64_t r = 0; r < ranks; ++r) {
    for (Action& a : shape.resolved[r]) {
      a.stage = stage_of(r, a);
      if (shape.rank_of[a.stage] >= 0 && shape.rank_of[a.stage] != r) {
        malformed(schedule, r,
                  "stage " + std::to_string(a.stage) + " has actions on ranks " +
                      std::to_string(shape.rank_of[a.stage]) + " and " + std::to_string(r) +
                      ": a stage runs on one rank");
      }
      shape.rank_of[a.stage] = r;
      if (++seen[a.stage][a.microbatch][static_cast<int>(a.phase)] > 1) {
        malformed(schedule, r, row_word(schedule, r) + " runs " + action_name(r, a) + " twice");
      }
    }
  }
  for (int64_t st = 0; st < stages; ++st) {
    if (shape.rank_of[st] < 0) {
      malformed(schedule, 0,
                "no rank runs stage " + std::to_string(st) + " of the " + std::to_string(stages) +
                    " the schedule names");
    }
  }
  const std::string uses =
      " although the schedule uses " + std::to_string(chunks) + " micro-batches";
  for (int64_t st = 0; st < stages; ++st) {
    const int64_t r = shape.rank_of[st];
    const std::string where = row_word(schedule, r);
    for (int64_t m = 0; m < chunks; ++m) {
      auto count = [&](Phase ph) { return seen[st][m][static_cast<int>(ph)]; };
      auto name = [&](Phase ph) { return action_name(st, {ph, m, st}); };
      if (count(Phase::kForward) == 0) {
        malformed(schedule, r, where + " has no " + name(Phase::kForward) + uses);
      }
      const bool whole = count(Phase::kBackward) == 1;
      const bool input = count(Phase::kInputBackward) == 1;
      const bool weight = count(Phase::kWeightBackward) == 1;
      if (whole && (input || weight)) {
        malformed(schedule, r,
                  where + " runs both " + name(Phase::kBackward) + " and " +
                      name(input ? Phase::kInputBackward : Phase::kWeightBackward) +
                      ": a backward is either whole (B) or split (I and W)");
      }
      if (!whole && !input && !weight) {
        malformed(schedule, r,
                  where + " has no " + name(Phase::kBackward) + " (nor " +
                      name(Phase::kInputBackward) + " and " + name(Phase::kWeightBackward) + ")" +
                      uses);
      }
      if (input != weight) {
        malformed(schedule, r,
                  where + " has " + name(input ? Phase::kInputBackward : Phase::kWeightBackward) +
                      " but no " + name(input ? Phase::kWeightBackward : Phase::kInputBackward) +
                      ": a split backward needs both halves");
      }
      if (input) shape.gradient_phase[st][m] = Phase::kInputBackward;
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
Replay replay(const Shape& shape, const CostFn& cost, double transfer) {
  const Schedule& schedule = shape.resolved;
  const int64_t ranks = static_cast<int64_t>(schedule.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Replay r;
  r.next.assign(ranks, 0);
  r.start.resize(ranks);
  r.end.assign(shape.stages(),
               std::vector<std::array<double, 4>>(shape.chunks, {nan, nan, nan, nan}));
  std::vector<double> free_at(ranks, 0.0);

  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t rank = 0; rank < ranks; ++rank) {
      while (r.next[rank] < schedule[rank].size()) {
        const Action& a = schedule[rank][r.next[rank]];
        double ready = free_at[rank];
        bool blocked = false;
        for (const Dependency& d : dependencies(shape, a.stage, a)) {
          if (!r.done(d.what)) {
            blocked = true;
            break;
          }
          ready = std::max(ready, r.end_of(d.what) + (d.crosses_stages ? transfer : 0.0));
        }
        if (blocked) break;
        const double end = ready + cost(a.stage, a.phase);
        r.start[rank].push_back(ready);
        r.end[a.stage][a.microbatch][static_cast<int>(a.phase)] = end;
        free_at[rank] = end;
        r.end_time = std::max(r.end_time, end);
        ++r.next[rank];
        progress = true;
      }
    }
  }
  return r;
}

// Picks the rank to blame for a deadlock and explains what it waits for. Blame goes to a rank
// whose next action waits on something it or another rank has scheduled later. Following waits
// from head to head reaches such a rank: with one stage per rank, forwards wait only on lower
// stages and backwards on higher ones, so a chain of heads cannot loop; with several stages per
// rank a loop is possible, and the visited check ends the walk there.
std::string explain_deadlock(const Shape& shape, const Replay& r, int64_t* marked) {
  const Schedule& schedule = shape.resolved;
  const int64_t ranks = static_cast<int64_t>(schedule.size());
  auto head = [&](int64_t rank) {
    const Action& a = schedule[rank][r.next[rank]];
    return StageAction{a.stage, a};
  };
  auto stuck = [&](int64_t rank) { return r.next[rank] < schedule[rank].size(); };
  auto unmet = [&](int64_t rank) {
    std::vector<StageAction> out;
    for (const Dependency& d : dependencies(shape, head(rank).stage, head(rank).action)) {
      if (!r.done(d.what)) out.push_back(d.what);
    }
    return out;
  };
  auto rank_of = [&](const StageAction& sa) { return shape.rank_of[sa.stage]; };

  int64_t blame = -1;
  for (int64_t rank = 0; rank < ranks && blame < 0; ++rank) {
    if (!stuck(rank)) continue;
    for (const StageAction& w : unmet(rank)) {
      if (rank_of(w) == rank) blame = rank;
    }
  }
  if (blame < 0) {
    int64_t cur = 0;
    while (!stuck(cur)) ++cur;
    std::vector<bool> visited(ranks, false);
    while (true) {
      visited[cur] = true;
      const StageAction w = unmet(cur).front();
      if (!(head(rank_of(w)).action == w.action) || visited[rank_of(w)]) {
        blame = cur;
        break;
      }
      cur = rank_of(w);
    }
  }

  std::string msg =
      shape.row(blame) + " is stuck at " + name_of(head(blame)) + ", which waits for ";
  const std::vector<StageAction> waits = unmet(blame);
  for (size_t i = 0; i < waits.size(); ++i) {
    const StageAction& w = waits[i];
    const int64_t other = rank_of(w);
    if (i > 0) msg += " and ";
    msg += name_of(w);
    if (other == blame) {
      msg += " (later in " + shape.row(blame) + "'s own list)";
    } else if (head(other).action == w.action) {
      msg += " (" + shape.row(other) + "'s next action, itself stuck)";
    } else {
      msg += " (" + shape.row(other) + " only gets to it after " + name_of(head(other)) +
             ", which is stuck)";
    }
  }
  *marked = blame;
  return msg;
}

// Grid of a one-slot replay: every start time an integer slot; actions that never ran are listed
// after a "|" in list order.
std::string time_grid(const Shape& shape, const Replay& r, int64_t marked_rank) {
  const Schedule& schedule = shape.resolved;
  Grid g;
  const size_t ranks = schedule.size();
  g.columns = static_cast<int64_t>(std::llround(r.end_time));
  g.placed.resize(ranks);
  g.pending.resize(ranks);
  g.marked_stage = marked_rank;
  g.row_word = one_stage_per_rank(schedule) ? "stage" : "rank";
  for (size_t rank = 0; rank < ranks; ++rank) {
    for (size_t i = 0; i < schedule[rank].size(); ++i) {
      const std::string name = action_name(static_cast<int64_t>(rank), schedule[rank][i]);
      if (i < r.next[rank]) {
        g.placed[rank].emplace_back(std::llround(r.start[rank][i]), name);
      } else {
        g.pending[rank].push_back(name);
      }
    }
  }
  return render(g);
}

[[noreturn]] void deadlock(const Shape& shape) {
  // The one-slot replay gets stuck at the same actions as any other, because which actions can run
  // never depends on durations; it just yields a grid with integer slots.
  const Replay unit = replay(shape, one_slot, 0.0);
  int64_t marked = -1;
  const std::string why = explain_deadlock(shape, unit, &marked);
  throw std::runtime_error(
      "pipeline schedule can never finish: " + why +
      ". Order each stage's actions so that F(s,m) can follow F(s-1,m), B or I (s,m) can follow "
      "F(s,m) and the B or I of (s+1,m), and W(s,m) can follow I(s,m).\n" +
      time_grid(shape, unit, marked));
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
  for (const auto& [value, name] :
       {std::pair{costs.transfer, "transfer"}, std::pair{costs.message, "message"}}) {
    if (!(value >= 0.0) || !std::isfinite(value)) {
      throw std::invalid_argument("ActionCosts." + std::string(name) + " = " +
                                  std::to_string(value) + " is not a finite non-negative time");
    }
  }
}

// A schedule of one stage per rank: stage s runs `stage_actions(s)`.
template <typename StageActions>
Schedule schedule_per_stage(int64_t stages, int64_t chunks, StageActions stage_actions) {
  check_shape(stages, chunks);
  Schedule schedule(stages);
  for (int64_t s = 0; s < stages; ++s) schedule[s] = stage_actions(s);
  return schedule;
}

// 1F1B's order on stage s: min(stages - s - 1, chunks) warm-up forwards, then one forward and one
// backward while forwards remain, then the remaining backwards; `backward(actions)` appends the
// stage's next backward.
template <typename Backward>
std::vector<Action> one_f_one_b_order(int64_t stages, int64_t s, int64_t chunks,
                                      Backward backward) {
  std::vector<Action> actions;
  const int64_t warmup = std::min(stages - s - 1, chunks);
  int64_t f = 0;
  while (f < warmup) actions.push_back({Phase::kForward, f++, s});
  while (f < chunks) {
    actions.push_back({Phase::kForward, f++, s});
    backward(actions);
  }
  for (int64_t b = warmup; b > 0; --b) backward(actions);
  return actions;
}

}  // namespace

bool Action::operator==(const Action& other) const {
  return phase == other.phase && microbatch == other.microbatch && stage == other.stage;
}

std::ostream& operator<<(std::ostream& os, const Action& a) {
  return os << letter(a.phase) << a.microbatch;
}

std::string action_name(int64_t rank, const Action& a) {
  return std::to_string(stage_of(rank, a)) + letter(a.phase) + std::to_string(a.microbatch);
}

Schedule gpipe_schedule(int64_t stages, int64_t chunks) {
  check_shape(stages, chunks);
  std::vector<int64_t> one_per_rank(stages);
  for (int64_t s = 0; s < stages; ++s) one_per_rank[s] = s;
  return gpipe_schedule_placed(one_per_rank, chunks);
}

Schedule one_f_one_b_schedule(int64_t stages, int64_t chunks) {
  return schedule_per_stage(stages, chunks, [&](int64_t s) {
    int64_t b = 0;
    return one_f_one_b_order(stages, s, chunks, [&](std::vector<Action>& actions) {
      actions.push_back({Phase::kBackward, b++, s});
    });
  });
}

Schedule zbh1_schedule(int64_t stages, int64_t chunks) {
  return schedule_per_stage(stages, chunks, [&](int64_t s) {
    int64_t i = 0, w = 0;
    // Each I, followed by the W that is `s` micro-batches behind it, if any.
    auto actions = one_f_one_b_order(stages, s, chunks, [&](std::vector<Action>& order) {
      order.push_back({Phase::kInputBackward, i++, s});
      if (i - w > s) order.push_back({Phase::kWeightBackward, w++, s});
    });
    while (w < chunks) actions.push_back({Phase::kWeightBackward, w++, s});
    return actions;
  });
}

Schedule zbh2_schedule(int64_t stages, int64_t chunks) {
  check_shape(stages, chunks);
  // List scheduling with unit costs: whenever a stage is free, the action it takes is the first of
  // its next I, its next F (while it holds fewer than 2 stages - 1 micro-batches' activations) and
  // its oldest W left that can start then; if none can, the one that can start soonest. Stages
  // are served in the order of when their next action starts, so every dependency is placed first.
  const int64_t limit = 2 * stages - 1;
  Schedule schedule(stages);
  std::vector<double> free_at(stages, 0.0);
  std::vector<int64_t> f(stages, 0), i(stages, 0), w(stages, 0);
  // When each stage's F and I of each micro-batch finish; -1: not placed yet.
  std::vector<std::vector<double>> f_done(stages, std::vector<double>(chunks, -1.0));
  std::vector<std::vector<double>> i_done = f_done;
  struct Choice {
    double start;
    int priority;  // 0 I, 1 F, 2 W
    Phase phase;
  };
  for (int64_t placed = 0; placed < 3 * stages * chunks; ++placed) {
    int64_t chosen_stage = -1;
    Choice chosen{0.0, 0, Phase::kForward};
    for (int64_t s = 0; s < stages; ++s) {
      std::vector<Choice> candidates;
      if (i[s] < chunks && f_done[s][i[s]] >= 0 && (s == stages - 1 || i_done[s + 1][i[s]] >= 0)) {
        const double ready = std::max(f_done[s][i[s]], s == stages - 1 ? 0.0 : i_done[s + 1][i[s]]);
        candidates.push_back({std::max(ready, free_at[s]), 0, Phase::kInputBackward});
      }
      if (f[s] < chunks && f[s] - w[s] < limit && (s == 0 || f_done[s - 1][f[s]] >= 0)) {
        const double ready = s == 0 ? 0.0 : f_done[s - 1][f[s]];
        candidates.push_back({std::max(ready, free_at[s]), 1, Phase::kForward});
      }
      if (w[s] < i[s]) candidates.push_back({free_at[s], 2, Phase::kWeightBackward});
      if (candidates.empty()) continue;
      // What can start as soon as the stage is free, by priority; else what can start soonest.
      const Choice best = *std::min_element(
          candidates.begin(), candidates.end(), [&](const Choice& a, const Choice& b) {
            const bool a_now = a.start <= free_at[s], b_now = b.start <= free_at[s];
            if (a_now != b_now) return a_now;
            return a_now ? a.priority < b.priority
                         : std::tie(a.start, a.priority) < std::tie(b.start, b.priority);
          });
      if (chosen_stage < 0 || best.start < chosen.start) {
        chosen_stage = s;
        chosen = best;
      }
    }
    const int64_t s = chosen_stage;
    free_at[s] = chosen.start + 1.0;
    int64_t& counter = chosen.phase == Phase::kForward         ? f[s]
                       : chosen.phase == Phase::kInputBackward ? i[s]
                                                               : w[s];
    if (chosen.phase == Phase::kForward) f_done[s][counter] = free_at[s];
    if (chosen.phase == Phase::kInputBackward) i_done[s][counter] = free_at[s];
    schedule[s].push_back({chosen.phase, counter++, s});
  }
  return schedule;
}

Schedule interleaved_1f1b_schedule(int64_t ranks, int64_t virtual_stages, int64_t chunks) {
  check_shape(ranks, chunks);
  if (virtual_stages < 1) {
    throw std::invalid_argument("virtual stages (stages per rank) must be >= 1, got " +
                                std::to_string(virtual_stages));
  }
  const int64_t v = virtual_stages;
  // Micro-batches go through a rank's stages in rounds of at most `ranks` each.
  const int64_t rounds = std::max<int64_t>(1, chunks / ranks);
  if (chunks % rounds != 0) {
    throw std::invalid_argument(
        "interleaved1f1b runs the micro-batches in rounds of equal size, at most one per rank: "
        "chunks " +
        std::to_string(chunks) + " over " + std::to_string(ranks) + " ranks makes " +
        std::to_string(rounds) + " rounds, which do not divide it; use a multiple of " +
        std::to_string(ranks) + " or fewer chunks than ranks");
  }
  const int64_t per_round = chunks / rounds;
  Schedule schedule(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    auto& actions = schedule[r];
    const int64_t total = v * chunks;
    const int64_t warmup = std::min((v - 1) * per_round + 2 * (ranks - 1 - r), total);
    // The i-th forward (backward) of this rank runs on local stage forward_stage(i) (...).
    auto forward_stage = [&](int64_t i) { return (i / per_round) % v * ranks + r; };
    auto backward_stage = [&](int64_t i) { return (v - 1 - (i / per_round) % v) * ranks + r; };
    std::vector<int64_t> next_forward(v * ranks, 0), next_backward(v * ranks, 0);
    auto forward = [&](int64_t i) {
      const int64_t st = forward_stage(i);
      actions.push_back({Phase::kForward, next_forward[st]++, st});
    };
    auto backward = [&](int64_t i) {
      const int64_t st = backward_stage(i);
      actions.push_back({Phase::kBackward, next_backward[st]++, st});
    };
    int64_t f = 0, b = 0;
    while (f < warmup) forward(f++);
    while (f < total) {
      forward(f++);
      backward(b++);
    }
    while (b < total) backward(b++);
  }
  return schedule;
}

Schedule zbv_schedule(int64_t ranks, int64_t chunks) {
  check_shape(ranks, chunks);
  // The phases below fill the pipeline for at least 2 ranks - 1 micro-batches; with fewer, the
  // actions of micro-batches that do not exist are dropped.
  const int64_t n = std::max(2 * ranks - 1, chunks);
  // One arm of the V: the rank's stage on it, and how many F, I and W it has taken so far.
  struct Arm {
    int64_t stage;
    int64_t f = 0, i = 0, w = 0;
  };
  // The next micro-batch's `phase` on `arm`.
  struct Step {
    Phase phase;
    Arm& arm;
  };
  constexpr Phase F = Phase::kForward, I = Phase::kInputBackward, W = Phase::kWeightBackward;
  Schedule schedule(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<Action> actions;
    Arm down{r}, up{2 * ranks - 1 - r};  // the rank's stages on the V's two arms
    auto take = [&](std::initializer_list<Step> steps) {
      for (const Step& step : steps) {
        Arm& arm = step.arm;
        int64_t& taken = step.phase == F ? arm.f : step.phase == I ? arm.i : arm.w;
        actions.push_back({step.phase, taken++, arm.stage});
      }
    };
    auto repeat = [&](int64_t times, std::initializer_list<Step> steps) {
      for (int64_t k = 0; k < times; ++k) take(steps);
    };
    // Warm-up: forwards down the V, then alternating with forwards up it, then up-arm
    // micro-batches taken through at once.
    repeat(2 * (ranks - r) - 1, {{F, down}});
    repeat(r, {{F, up}, {F, down}});
    repeat(ranks - r, {{F, up}, {I, up}, {W, up}});
    // Steady state: one micro-batch of each arm through F, I and W.
    while (up.f < down.f || down.f < n) {
      if (down.f < n) take({{F, down}});
      take({{I, down}, {W, down}, {F, up}, {I, up}, {W, up}});
    }
    // Drain: input gradients first, the weight gradients after them.
    repeat(r, {{I, down}, {I, up}});
    repeat(ranks - r, {{I, down}, {W, down}});
    while (up.w < up.i) take({{W, up}});
    while (down.w < down.i) take({{W, down}});
    for (const Action& a : actions) {
      if (a.microbatch < chunks) schedule[r].push_back(a);
    }
  }
  return schedule;
}

Schedule gpipe_schedule_placed(const std::vector<int64_t>& rank_of_stage, int64_t chunks) {
  int64_t ranks = 0;
  for (int64_t rank : rank_of_stage) ranks = std::max(ranks, rank + 1);
  check_shape(ranks, chunks);
  Schedule schedule(ranks);
  const int64_t stages = static_cast<int64_t>(rank_of_stage.size());
  for (int64_t s = 0; s < stages; ++s) {
    for (int64_t m = 0; m < chunks; ++m) {
      schedule[rank_of_stage[s]].push_back({Phase::kForward, m, s});
    }
  }
  for (int64_t s = stages - 1; s >= 0; --s) {
    for (int64_t m = chunks - 1; m >= 0; --m) {
      schedule[rank_of_stage[s]].push_back({Phase::kBackward, m, s});
    }
  }
  return schedule;
}

Schedule parse_schedule_csv(const std::string& text) {
  Schedule schedule;
  std::istringstream lines(text);
  std::string line;
  for (int64_t row = 1; std::getline(lines, line); ++row) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<Action> actions;
    std::istringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) {
      const size_t begin = cell.find_first_not_of(" \t"), end = cell.find_last_not_of(" \t");
      if (begin == std::string::npos) continue;  // an idle slot
      const std::string action = cell.substr(begin, end - begin + 1);
      const size_t letter_at = action.find_first_not_of("0123456789");
      const std::string phases = "FBIW";
      const bool readable =
          letter_at > 0 && letter_at != std::string::npos && letter_at + 1 < action.size() &&
          phases.find(action[letter_at]) != std::string::npos &&
          action.find_first_not_of("0123456789", letter_at + 1) == std::string::npos &&
          letter_at <= 9 && action.size() - letter_at - 1 <= 9;
      if (!readable) {
        throw std::invalid_argument(
            "schedule line " + std::to_string(row) + " (rank " + std::to_string(row - 1) +
            "): cannot read the action '" + action +
            "'; write <stage><F|B|I|W><micro-batch>, e.g. 0F3 (compute-only format)");
      }
      const Phase phase =
          std::array<Phase, 4>{Phase::kForward, Phase::kBackward, Phase::kInputBackward,
                               Phase::kWeightBackward}[phases.find(action[letter_at])];
      actions.push_back({phase, std::stoll(action.substr(letter_at + 1)),
                         std::stoll(action.substr(0, letter_at))});
    }
    schedule.push_back(std::move(actions));
  }
  while (!schedule.empty() && schedule.back().empty()) schedule.pop_back();  // trailing newlines
  return schedule;
}

std::string schedule_csv(const Schedule& schedule) {
  std::string text;
  for (size_t r = 0; r < schedule.size(); ++r) {
    for (size_t i = 0; i < schedule[r].size(); ++i) {
      text += (i > 0 ? "," : "") + action_name(static_cast<int64_t>(r), schedule[r][i]);
    }
    text += '\n';
  }
  return text;
}

std::vector<int64_t> stage_placement(const Schedule& schedule) {
  return validate(schedule).rank_of;
}

std::vector<int64_t> activations_held(const Schedule& schedule) {
  std::vector<int64_t> held(stage_placement(schedule).size(), 0), live(held.size(), 0);
  for (size_t r = 0; r < schedule.size(); ++r) {
    for (const Action& a : schedule[r]) {
      const int64_t s = stage_of(static_cast<int64_t>(r), a);
      if (a.phase == Phase::kForward) held[s] = std::max(held[s], ++live[s]);
      if (a.phase == Phase::kBackward || a.phase == Phase::kWeightBackward) --live[s];
    }
  }
  return held;
}

std::vector<std::string> schedule_names() {
  return {kGPipe, kOneFOneB, kZBH1, kZBH2, kInterleaved, kZBV};
}

Schedule make_schedule(const std::string& name, int64_t ranks, int64_t chunks,
                       int64_t virtual_stages) {
  if (name == kInterleaved) return interleaved_1f1b_schedule(ranks, virtual_stages, chunks);
  if (name == kZBV) {
    if (virtual_stages != 2) {
      throw std::invalid_argument(
          "schedule 'zbv' runs exactly 2 stages per rank (V placement), "
          "but virtual stages " +
          std::to_string(virtual_stages) +
          " were asked for; set virtual stages to 2 (--virtual-stages 2)");
    }
    return zbv_schedule(ranks, chunks);
  }
  if (virtual_stages != 1 &&
      (name == kGPipe || name == kOneFOneB || name == kZBH1 || name == kZBH2)) {
    throw std::invalid_argument("schedule '" + name +
                                "' runs one stage per rank, but virtual stages " +
                                std::to_string(virtual_stages) +
                                " were asked for; use interleaved1f1b, or 1 virtual stage");
  }
  if (name == kGPipe) return gpipe_schedule(ranks, chunks);
  if (name == kOneFOneB) return one_f_one_b_schedule(ranks, chunks);
  if (name == kZBH1) return zbh1_schedule(ranks, chunks);
  if (name == kZBH2) return zbh2_schedule(ranks, chunks);
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
  const int64_t ranks = static_cast<int64_t>(schedule.size());
  check_costs(costs, shape.stages());
  const Replay r = replay(
      shape, [&](int64_t s, Phase ph) { return costs.cost(s, ph); }, costs.transfer);
  if (!r.complete(schedule)) deadlock(shape);

  Simulation sim;
  sim.step_time = r.end_time;
  sim.start_time = r.start;
  sim.busy_time.assign(ranks, 0.0);
  sim.finish_time.assign(ranks, 0.0);
  double busy = 0.0;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    const auto& actions = shape.resolved[rank];
    for (size_t i = 0; i < actions.size(); ++i) {
      const double cost = costs.cost(actions[i].stage, actions[i].phase);
      sim.busy_time[rank] += cost;
      sim.finish_time[rank] = std::max(sim.finish_time[rank], r.start[rank][i] + cost);
    }
    busy += sim.busy_time[rank];
  }
  // A zero-cost step has no idle time to speak of; avoid reporting 0/0.
  sim.bubble_fraction =
      sim.step_time > 0.0 ? 1.0 - busy / (static_cast<double>(ranks) * sim.step_time) : 0.0;
  return sim;
}

void check_transfer_order(const Schedule& schedule) {
  const Shape shape = validate(schedule);
  // Per (from, to, direction): what travels, named by (stage, micro-batch) of the action that
  // makes it, as the sender sends it and as the receiver expects it.
  using Channel = std::tuple<int64_t, int64_t, bool>;  // gradients: true
  using Made = std::pair<int64_t, int64_t>;
  std::map<Channel, std::vector<Made>> sent, received;
  std::map<std::pair<bool, Made>, Action> maker;  // for the message
  const Plan plan = lower(schedule);
  for (size_t r = 0; r < plan.size(); ++r) {
    const int64_t rank = static_cast<int64_t>(r);
    for (const PlannedAction& p : plan[r]) {
      const Action& a = p.action;
      if (p.kind == PlannedAction::Kind::kSend) {
        sent[{rank, p.peer, p.gradients()}].push_back({a.stage, a.microbatch});
        maker[{p.gradients(), {a.stage, a.microbatch}}] = a;
      } else if (p.kind == PlannedAction::Kind::kReceive) {
        const int64_t from_stage = p.gradients() ? a.stage + 1 : a.stage - 1;
        received[{p.peer, rank, p.gradients()}].push_back({from_stage, a.microbatch});
      }
    }
  }
  for (const auto& [channel, sends] : sent) {
    const auto& [from, to, gradients] = channel;
    const std::vector<Made>& receives = received[channel];
    for (size_t k = 0; k < sends.size() && k < receives.size(); ++k) {
      if (sends[k] == receives[k]) continue;
      auto name = [&, gradients = gradients](const Made& made) {
        const Action& a = maker.at({gradients, made});
        return action_name(a.stage, a);
      };
      throw std::runtime_error(
          "pipeline schedule cannot run: " + shape.row(to) + " receives the " +
          (gradients ? "gradients" : "activations") + " of " + shape.row(from) +
          " in another order than they are sent: its receive number " + std::to_string(k) +
          " expects those of " + name(receives[k]) + ", but " + name(sends[k]) +
          " sends that one; tensors pass between two ranks in order, so order the actions "
          "alike on both. Actions in list order:\n" +
          order_grid(schedule, to));
    }
  }
}

std::string format_schedule(const Schedule& schedule) {
  const Shape shape = validate(schedule);
  const Replay r = replay(shape, one_slot, 0.0);
  if (!r.complete(schedule)) deadlock(shape);
  return time_grid(shape, r, -1);
}

}  // namespace pipetrain
