// Lowers a schedule's compute actions to each rank's full list: transfers and joined weight
// gradients placed by small passes over the schedule data.
#include "pipetrain/plan.h"

#include <algorithm>

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
