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

// "recv 1F0 from 0", "1F0", "send 1B0 to 0", "wgrad 1B0", "wgrad 1*" (joined): one rank's plan,
// one action per line.
std::string format_plan(const std::vector<PlannedAction>& rank_actions);

}  // namespace pipetrain

#endif  // PIPETRAIN_PLAN_H_
