// A schedule lowered to what each rank does, in order: the schedule's compute actions, with the
// transfers between ranks made explicit (a receive right before the action that takes the
// tensors, a send right after the one that made them) and, where a stage computes its weight
// gradients for the whole batch at once, that joined weight-gradient action placed. The Pipe runs
// exactly this list; check_transfer_order (schedule.h) checks its sends against its receives.
// Between two stages of one rank nothing is sent: the tensors are handed over in memory.
#ifndef PIPETRAIN_PLAN_H_
#define PIPETRAIN_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/schedule.h"

namespace pipetrain {

struct PlannedAction {
  enum class Kind {
    kCompute,  // `action` itself
    kReceive,  // the tensors `action` takes, from `peer`: activations for an F, else gradients
    kSend,     // what `action` made, to `peer`: activations after an F, input gradients after a B/I
    // The fused Linear layers' weight gradients (fused_linear.h), put off from a backward: of
    // `action` (a B) alone, after its send; or joined, of every micro-batch of `action`'s stage.
    kWeightGradients,
    kJoinedWeightGradients,
  };
  Kind kind = Kind::kCompute;
  Action action;      // with its stage filled in
  int64_t peer = -1;  // the other rank of a transfer
  // Whether a transfer carries gradients (else activations).
  bool gradients() const { return action.phase != Phase::kForward; }
  bool operator==(const PlannedAction& other) const;
};

// plan[rank] = what that rank runs, in order.
using Plan = std::vector<std::vector<PlannedAction>>;

// The schedule with its transfers between ranks inserted. Throws like simulate() for a malformed
// schedule.
Plan lower(const Schedule& schedule);

// Whether `rank_actions` lets its stage compute the weight gradients of all micro-batches at once
// after its last backward, each fused Linear layer's in one GEMM: when it keeps every micro-batch's
// activations until then anyway (all its forwards come first, none recomputed: `recomputed`
// micro-batches are) and the schedule does not say where weight gradients go itself (no W).
bool can_join_weight_gradients(const std::vector<PlannedAction>& rank_actions, int64_t recomputed);

// Places that joined action in `rank_actions` after its last backward and that backward's send.
void join_weight_gradients(std::vector<PlannedAction>& rank_actions);

// Places a weight-gradient action after each B of `rank_actions` and that B's send: the previous
// stage gets its gradients before the GEMMs that nobody waits for.
void defer_weight_gradients(std::vector<PlannedAction>& rank_actions);

// Whether `rank`'s fused Linear layers put their weight gradients off under `plan` (lowered, no
// weight-gradient actions placed yet): every rank but one holding the first stage alone, which
// sends no gradient to hurry and puts them off only where it can join two backwards' or more. (Of
// one backward there is nothing to join: put off, each layer's gradient and input would stay
// alive until the backward ends, where autograd lets them go layer by layer.)
bool defers_weight_gradients(const Plan& plan, int64_t rank, int64_t recomputed);

// The plan the ranks run for `schedule`: lowered and, with fused Linear layers (`fused`), their
// weight gradients placed on each rank that defers them: joined where can_join_weight_gradients
// says so, else after each backward's send. (`recomputed`: micro-batches below it recompute.)
Plan executed_plan(const Schedule& schedule, bool fused, int64_t recomputed);

// Runs every rank's plan in order as simulate() runs a schedule: a compute action takes its cost
// (a B whose weight gradients are placed apart takes backward - weight; those actions take
// weight, a joined one weight x the stage's backwards), a send's tensors arrive `costs.transfer`
// after it starts, a receive waits for them, and either takes its rank `costs.message`. So the
// cost model is the program the Pipe runs, weight-gradient placement included; for a plan fresh
// from lower() and no message cost it gives simulate()'s step. Throws std::runtime_error naming
// each rank's first action that can never run when the plan cannot finish (a receive whose send
// never comes, or comes after it on the same rank).
Simulation simulate_plan(const Plan& plan, const ActionCosts& costs);

// "recv 1F0 from 0", "1F0", "send 1B0 to 0", "wgrad 1B0", "wgrad 1*" (joined): one rank's plan,
// one action per line.
std::string format_plan(const std::vector<PlannedAction>& rank_actions);

}  // namespace pipetrain

#endif  // PIPETRAIN_PLAN_H_
