// Pipeline schedules as plain data: for each rank, the ordered forwards and backwards of its
// stages in one training step. A backward is either whole (B) or split in two, as zero-bubble
// pipelines split it: the input gradient (I), which the previous stage waits for, then the weight
// gradients (W), which nobody waits for and which fill the bubbles. Keeping them free of torch lets
// the runtime, the CLI and the tests share one definition of GPipe and 1F1B, and lets a cost-model
// simulation check a schedule (bubble, step time, deadlocks) without running it: the Pipe simulates
// every schedule it builds once, with unit costs, so a malformed one fails with its grid instead of
// hanging the ranks.
#ifndef PIPETRAIN_SCHEDULE_H_
#define PIPETRAIN_SCHEDULE_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace pipetrain {

// F, B, I, W in grids and names (torch.distributed.pipelining's letters).
enum class Phase { kForward, kBackward, kInputBackward, kWeightBackward };

struct Action {
  Phase phase;
  int64_t microbatch;
  // The stage it runs on; -1: the stage numbered as its rank (one stage per rank).
  int64_t stage = -1;
  bool operator==(const Action& other) const;
  bool operator!=(const Action& other) const { return !(*this == other); }
};

// Prints "F3" / "B3" / "I3" / "W3"; the stage is not part of an Action, so gtest failures show the
// bare action.
std::ostream& operator<<(std::ostream& os, const Action& a);

// "<stage><F|B|I|W><microbatch>", e.g. "0F3", the notation used in grids and error messages
// (torch.distributed.pipelining's), for an action in rank `rank`'s list.
std::string action_name(int64_t rank, const Action& a);

// schedule[rank] = the actions that rank runs, in order. With one stage per rank (every schedule
// but interleaved1f1b) rank r runs stage r; with V virtual stages per rank over p ranks, the
// Sequential is cut into V x p stages and rank r runs stages r, r + p, ... (loop placement).
using Schedule = std::vector<std::vector<Action>>;

// Every stage runs F0..F(m-1), then B(m-1)..B0. The reverse backward order means the last
// micro-batch's backward directly follows its forward, which is what lets checkpointing keep that
// micro-batch's activations instead of recomputing them.
Schedule gpipe_schedule(int64_t stages, int64_t chunks);

// PipeDream-flush / Megatron / torch.distributed.pipelining Schedule1F1B: stage s runs
// min(stages - s - 1, chunks) warm-up forwards, then alternates one forward and one backward while
// forwards remain, then drains the remaining backwards. Backwards run in order 0..m-1, so stage s
// never holds more than stages - s micro-batches' activations.
Schedule one_f_one_b_schedule(int64_t stages, int64_t chunks);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024): 1F1B's order with each backward
// split into I and W, stage s putting its W's off by s micro-batches. The input gradients then
// travel back without waiting for weight gradients, and the W's put off fill the drain. Every
// stage holds at most `stages` micro-batches' activations, as 1F1B's first stage does; the bubble
// is (stages - 1)(F + B - 2W) against 1F1B's (stages - 1)(F + B), B being the whole backward
// (where W takes no longer than F).
Schedule zbh1_schedule(int64_t stages, int64_t chunks);

// ZB-H2 (Qi et al., 2024): zero-bubble with twice ZB-H1's memory. Every stage may hold up to
// 2 stages - 1 micro-batches' activations, so it runs enough warm-up forwards to stay busy until
// its first input gradient comes back, and keeps enough W's in hand to fill the drain: built as the
// paper's greedy scheduler builds it (input gradients first, then forwards within the memory limit,
// then weight gradients) with unit costs. Its step is then the least any schedule can take,
// (stages - 1) F + chunks (F + B), where W takes as long as I and no longer than F, for chunks
// >= stages, and close to it where I and W differ (where ZB-H1 loses (stages - 1)|I - W| more).
Schedule zbh2_schedule(int64_t stages, int64_t chunks);

// Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM; torch.distributed.pipelining's
// ScheduleInterleaved1F1B): each rank holds `virtual_stages` stages and runs 1F1B over them,
// micro-batches passing its stages in rounds of at most `ranks`; the bubble shrinks to
// (ranks - 1) / (virtual_stages x chunks) of the ideal step for chunks >= ranks. chunks must be a
// multiple of its number of rounds, max(1, chunks / ranks).
Schedule interleaved_1f1b_schedule(int64_t ranks, int64_t virtual_stages, int64_t chunks);

// ZB-V (Qi et al., 2024, section 6; torch.distributed.pipelining's ScheduleZBVZeroBubble): two
// stages per rank in V placement, rank r running stages r and 2 ranks - 1 - r, so the first and
// the last stage are on rank 0; 1F1B-like with split backwards whose W's fill the bubble. With
// F, I and W alike and chunks >= 2 ranks - 1 the only idle time left is the first forward's
// journey to the last rank, (ranks - 1) F.
Schedule zbv_schedule(int64_t ranks, int64_t chunks);

// GPipe over any placement of stages on ranks (rank_of_stage[stage] = rank): each rank runs its
// stages' forwards in stage order, then their backwards in reverse. What a batch with fewer rows
// than a schedule's chunks runs where that schedule cannot be built for so few.
Schedule gpipe_schedule_placed(const std::vector<int64_t>& rank_of_stage, int64_t chunks);

// A schedule in torch.distributed.pipelining's compute-only CSV format (what its
// PipelineScheduleMulti._dump_csv writes and _load_csv reads): one line per rank, each cell an
// action "<stage><F|B|I|W><micro-batch>" such as "0F3" or "1W2", empty cells (idle slots)
// skipped. Throws std::invalid_argument naming the line and cell it cannot read; whether the
// schedule can run is for simulate() and check_transfer_order() to say.
Schedule parse_schedule_csv(const std::string& text);
// `schedule` in that format, each line the rank's actions in order (no idle slots).
std::string schedule_csv(const Schedule& schedule);

// Which rank runs each stage (result[stage] = rank), as `schedule` places them. Throws like
// simulate() for a malformed schedule.
std::vector<int64_t> stage_placement(const Schedule& schedule);

// The most micro-batches whose activations each stage holds at once (result[stage]): from its
// forward of one to the backward (B or W) that lets it go. What a schedule costs in memory.
std::vector<int64_t> activations_held(const Schedule& schedule);

// name is one of schedule_names(); anything else throws std::invalid_argument listing them.
// interleaved1f1b takes any virtual_stages, zbv exactly 2, the others 1.
Schedule make_schedule(const std::string& name, int64_t ranks, int64_t chunks,
                       int64_t virtual_stages = 1);
std::vector<std::string> schedule_names();

// Cost model, for a schedule of S stages: per stage, the time of one forward and one whole backward
// (B) of one micro-batch, the weight-gradient part of that backward (W; I takes the rest), plus a
// fixed latency for each activation/gradient transfer between neighbouring stages.
struct ActionCosts {
  std::vector<double> forward;   // size == stages
  std::vector<double> backward;  // size == stages
  std::vector<double> weight;    // size == stages, each <= backward; empty: all 0
  double transfer = 0.0;         // from a send to its tensors' arrival
  // What a rank's own thread spends on each transfer it sends or takes (handing tensors to the
  // transport, asking for the next ones), apart from their travel. simulate() leaves it out; a
  // lowered plan (simulate_plan) charges it to each send and receive.
  double message = 0.0;
  static ActionCosts uniform(int64_t stages, double forward = 1.0, double backward = 1.0,
                             double weight = 0.0);
  double cost(int64_t stage, Phase phase) const;
};

struct Simulation {
  double step_time = 0.0;                       // time the last action finishes
  double bubble_fraction = 0.0;                 // 1 - sum(busy) / (ranks * step_time)
  std::vector<double> busy_time;                // per rank
  std::vector<double> finish_time;              // per rank: when its last action ends
  std::vector<std::vector<double>> start_time;  // [rank][action index]
};

// Runs every action as early as its dependencies and its rank's list order allow:
//   F(s,m) after F(s-1,m) (+transfer); B or I (s,m) after F(s,m) and after B or I (s+1,m)
//   (+transfer); W(s,m) after I(s,m), the transfer counted between stages of different ranks.
//   Each micro-batch has on each stage one F, and one B or an I and a W; a stage runs on one rank.
// Throws std::invalid_argument when costs do not match the schedule, and std::runtime_error when
// the schedule is malformed (an action missing or repeated) or can never finish; those messages
// carry the schedule's grid with "<-- ERROR HERE" on the offending row.
Simulation simulate(const Schedule& schedule, const ActionCosts& costs);

// Tensors pass between two ranks in the order they are sent, per direction (activations,
// gradients), so each rank must receive from a neighbour in the order the neighbour sends: else one
// micro-batch's tensors would reach another's action. Throws std::runtime_error, with the grid,
// at the first receive out of order.
void check_transfer_order(const Schedule& schedule);

// One row per stage (per rank, "rank r", where ranks hold several stages), one column per time slot
// of a simulation where every action takes one slot,
// "." for idle slots:
//           0    1    2    3    4    5
//   stage 0 0F0  0F1  .    .    0B1  0B0
//   stage 1 .    1F0  1F1  1B1  1B0  .
// Throws like simulate() for schedules that cannot run.
std::string format_schedule(const Schedule& schedule);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULE_H_
