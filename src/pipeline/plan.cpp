// Lowers a schedule's compute actions to each rank's full list: transfers and joined weight
// gradients placed by small passes over the schedule data.
#include "pipeline/plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace pipetrain {
namespace {

using Kind = PlannedAction::Kind;

// Where an action's weight gradients can go: just after it, and after its send if it has one.
std::vector<PlannedAction>::iterator after_send(std::vector<PlannedAction>& rank_actions,
                                                std::vector<PlannedAction>::iterator action) {
  auto at = std::next(action);
  if (at != rank_actions.end() && at->kind == Kind::kSend && at->action == action->action) ++at;
  return at;
}

}  // namespace

bool PlannedAction::operator==(const PlannedAction& other) const {
  return kind == other.kind && action == other.action && peer == other.peer;
}

Plan lower(const Schedule& schedule) {
  const std::vector<int64_t> rank_of = stage_placement(schedule);  // validates it too
  const int64_t last = static_cast<int64_t>(rank_of.size()) - 1;
  Plan plan(schedule.size());
  for (size_t r = 0; r < schedule.size(); ++r) {
    const int64_t rank = static_cast<int64_t>(r);
    for (Action a : schedule[r]) {
      if (a.stage < 0) a.stage = rank;
      // The stage a's input comes from, and the one its output goes to (-1: none): for a forward
      // activations come from the stage before and go to the one after, for a backward gradients
      // the other way round. A weight gradient neither takes nor gives anything.
      int64_t from = -1, to = -1;
      if (a.phase == Phase::kForward) {
        from = a.stage - 1;
        to = a.stage < last ? a.stage + 1 : -1;
      } else if (a.phase != Phase::kWeightBackward) {
        from = a.stage < last ? a.stage + 1 : -1;
        to = a.stage - 1;
      }
      if (from >= 0 && rank_of[from] != rank) plan[r].push_back({Kind::kReceive, a, rank_of[from]});
      plan[r].push_back({Kind::kCompute, a, -1});
      if (to >= 0 && rank_of[to] != rank) plan[r].push_back({Kind::kSend, a, rank_of[to]});
    }
  }
  return plan;
}

bool can_join_weight_gradients(const std::vector<PlannedAction>& rank_actions, int64_t recomputed) {
  if (recomputed > 0) return false;
  bool backward_seen = false;
  for (const PlannedAction& planned : rank_actions) {
    if (planned.kind != PlannedAction::Kind::kCompute) continue;
    const Phase phase = planned.action.phase;
    if (phase == Phase::kWeightBackward) return false;
    if (phase != Phase::kForward) {
      backward_seen = true;
    } else if (backward_seen) {
      return false;
    }
  }
  return backward_seen;
}

void join_weight_gradients(std::vector<PlannedAction>& rank_actions) {
  auto last_backward =
      std::find_if(rank_actions.rbegin(), rank_actions.rend(), [](const PlannedAction& p) {
        return p.kind == Kind::kCompute && p.action.phase != Phase::kForward;
      });
  if (last_backward == rank_actions.rend()) return;
  const Action backward = last_backward->action;
  rank_actions.insert(after_send(rank_actions, std::prev(last_backward.base())),
                      {Kind::kJoinedWeightGradients, backward, -1});
}

void defer_weight_gradients(std::vector<PlannedAction>& rank_actions) {
  for (auto it = rank_actions.begin(); it != rank_actions.end(); ++it) {
    if (it->kind != Kind::kCompute || it->action.phase != Phase::kBackward) continue;
    const Action backward = it->action;
    it = rank_actions.insert(after_send(rank_actions, it), {Kind::kWeightGradients, backward, -1});
  }
}

bool defers_weight_gradients(const Plan& plan, int64_t rank, int64_t recomputed) {
  const std::vector<PlannedAction>& actions = plan.at(rank);
  const bool first_stage_alone =
      !actions.empty() && std::all_of(actions.begin(), actions.end(),
                                      [](const PlannedAction& p) { return p.action.stage == 0; });
  const auto backwards = std::count_if(actions.begin(), actions.end(), [](const PlannedAction& p) {
    return p.kind == Kind::kCompute && p.action.phase != Phase::kForward;
  });
  return !first_stage_alone || (backwards > 1 && can_join_weight_gradients(actions, recomputed));
}

Plan executed_plan(const Schedule& schedule, bool fused, int64_t recomputed) {
  Plan plan = lower(schedule);
  if (!fused) return plan;
  const Plan lowered = plan;
  for (size_t r = 0; r < plan.size(); ++r) {
    if (!defers_weight_gradients(lowered, static_cast<int64_t>(r), recomputed)) continue;
    if (can_join_weight_gradients(plan[r], recomputed)) {
      join_weight_gradients(plan[r]);
    } else {
      defer_weight_gradients(plan[r]);
    }
  }
  return plan;
}

Simulation simulate_plan(const Plan& plan, const ActionCosts& costs) {
  const auto ranks = static_cast<int64_t>(plan.size());
  const auto weight = [&](int64_t stage) {
    return costs.weight.empty() ? 0.0 : costs.weight[stage];
  };
  // Per rank: the backwards whose weight gradients are placed apart, and each stage's backwards
  // (what a joined action covers).
  std::vector<std::set<std::pair<int64_t, int64_t>>> put_off(ranks);
  std::vector<std::map<int64_t, int64_t>> backwards(ranks);
  std::vector<std::set<int64_t>> joined(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    for (const PlannedAction& p : plan[r]) {
      if (p.kind == Kind::kWeightGradients)
        put_off[r].insert({p.action.stage, p.action.microbatch});
      if (p.kind == Kind::kJoinedWeightGradients) joined[r].insert(p.action.stage);
      if (p.kind == Kind::kCompute && p.action.phase == Phase::kBackward)
        ++backwards[r][p.action.stage];
    }
  }
  const auto duration = [&](int64_t r, const PlannedAction& p) {
    const Action& a = p.action;
    switch (p.kind) {
      case Kind::kCompute:
        if (a.phase == Phase::kBackward &&
            (joined[r].count(a.stage) || put_off[r].count({a.stage, a.microbatch}))) {
          return costs.backward[a.stage] - weight(a.stage);
        }
        return costs.cost(a.stage, a.phase);
      case Kind::kWeightGradients:
        return weight(a.stage);
      case Kind::kJoinedWeightGradients:
        return weight(a.stage) * static_cast<double>(backwards[r][a.stage]);
      case Kind::kReceive:
      case Kind::kSend:
        return costs.message;
    }
    return 0.0;
  };
  // A transfer by (gradients, receiving stage, micro-batch): when its tensors arrive.
  using Message = std::tuple<bool, int64_t, int64_t>;
  const auto message = [](const PlannedAction& p) {
    const int64_t to_stage = p.kind == Kind::kReceive
                                 ? p.action.stage
                                 : (p.gradients() ? p.action.stage - 1 : p.action.stage + 1);
    return Message{p.gradients(), to_stage, p.action.microbatch};
  };
  std::map<Message, double> arrival;
  std::vector<size_t> next(ranks, 0);
  std::vector<double> clock(ranks, 0.0);
  Simulation sim;
  sim.busy_time.assign(ranks, 0.0);
  sim.start_time.resize(ranks);
  for (int64_t r = 0; r < ranks; ++r) sim.start_time[r].assign(plan[r].size(), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < ranks; ++r) {
      for (; next[r] < plan[r].size(); ++next[r]) {
        const PlannedAction& p = plan[r][next[r]];
        if (p.kind == Kind::kReceive) {
          const auto it = arrival.find(message(p));
          if (it == arrival.end()) break;  // its send has not run yet
          clock[r] = std::max(clock[r], it->second);
        }
        sim.start_time[r][next[r]] = clock[r];
        if (p.kind == Kind::kSend) arrival[message(p)] = clock[r] + costs.transfer;
        const double d = duration(r, p);
        clock[r] += d;
        sim.busy_time[r] += d;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int64_t r = 0; r < ranks; ++r) {
    if (next[r] < plan[r].size()) {
      std::string action = format_plan({plan[r][next[r]]});
      action.pop_back();  // its newline
      stuck += "\n  rank " + std::to_string(r) + " waits forever at: " + action;
    }
  }
  if (!stuck.empty()) {
    throw std::runtime_error("pipeline plan cannot run: a receive's send never comes" + stuck);
  }
  double busy = 0.0;
  for (int64_t r = 0; r < ranks; ++r) {
    sim.step_time = std::max(sim.step_time, clock[r]);
    busy += sim.busy_time[r];
    sim.finish_time.push_back(clock[r]);
  }
  sim.bubble_fraction =
      sim.step_time > 0.0 ? 1.0 - busy / (static_cast<double>(ranks) * sim.step_time) : 0.0;
  return sim;
}

std::string format_plan(const std::vector<PlannedAction>& rank_actions) {
  std::string text;
  for (const PlannedAction& p : rank_actions) {
    const std::string name = action_name(p.action.stage, p.action);
    switch (p.kind) {
      case PlannedAction::Kind::kCompute:
        text += name;
        break;
      case PlannedAction::Kind::kReceive:
        text += "recv " + name + " from " + std::to_string(p.peer);
        break;
      case PlannedAction::Kind::kSend:
        text += "send " + name + " to " + std::to_string(p.peer);
        break;
      case PlannedAction::Kind::kWeightGradients:
        text += "wgrad " + name;
        break;
      case PlannedAction::Kind::kJoinedWeightGradients:
        text += "wgrad " + std::to_string(p.action.stage) + "*";
        break;
    }
    text += '\n';
  }
  return text;
}

}  // namespace pipetrain
