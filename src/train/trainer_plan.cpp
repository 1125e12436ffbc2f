// Trainer::choose_pipeline_plan: the planner (training_plan.h) run on the first training batch by
// rank 0, its plan shared with every rank before any layer is built.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "io/file_writer.h"
#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"
#include "train/layer_profile.h"
#include "train/training_plan.h"
#include "util/usable_cpus.h"

namespace pipetrain {
namespace {

std::string read_plan_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::invalid_argument("cannot read the plan file " + path +
                                " (PlanOptions::file, --plan): give the plan.json of an earlier "
                                "run, or --plan auto to make one");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void Trainer::choose_pipeline_plan(Module& module, const DataLoader& loader) {
  const PlanOptions& plan_options = *options_.plan();
  const std::string& name = options_.strategy();
  if (name != "pipe" && name != "ddp_pipe") {
    throw std::invalid_argument(
        "TrainerOptions::plan (--plan) chooses a pipeline's balance, chunks, schedule and "
        "recompute mode, so it needs strategy pipe or ddp_pipe, not '" +
        name + "'");
  }
  if (!options_.pipe().schedule_file().empty()) {
    throw std::invalid_argument(
        "TrainerOptions::plan (--plan) chooses the schedule among the built-in ones: leave "
        "schedule_file (--schedule-file) empty");
  }
  const int64_t stages = name == "pipe" ? world_->size() : options_.stages();
  if (stages < 1) {
    throw std::invalid_argument(
        "TrainerOptions::plan (--plan) under ddp_pipe needs the stages per pipeline: pass "
        "--stages (TrainerOptions::stages); the plan chooses the balance");
  }
  const int64_t replicas = world_->size() / stages;
  const int64_t max_memory =
      plan_options.max_memory() > 0 ? plan_options.max_memory() : options_.max_memory();

  // Rank 0 plans; every rank gets the plan, or the error that stopped it.
  std::string text, error;
  if (world_->is_global_zero()) {
    try {
      if (!plan_options.file().empty()) {
        text = read_plan_file(plan_options.file());
      } else {
        BatchShard shard;
        shard.replicas = replicas;
        const Batch sample = loader.batch(0, 0, shard);
        const auto profiles =
            profile_module(module, sample.data, world_->device(), options_.precision(),
                           static_cast<int>(plan_options.repeats()));
        PlannerOptions planner;
        planner.stages = stages;
        planner.replicas = replicas;
        planner.max_memory = max_memory;
        planner.schedules = plan_options.schedules();
        planner.link_bytes_per_second = plan_options.link_bandwidth();
        planner.network_bytes_per_second = plan_options.network_bandwidth();
        planner.ranks_per_node = options_.devices();
        if (!world_->device().is_cuda()) {
          // CPU ranks share this machine's cores, each with the threads it was given.
          planner.cores_per_node = usable_cpus();
          planner.threads_per_rank = at::get_num_threads();
        }
        text = plan_to_json(choose_plan(weigh_plans(profiles, planner), planner));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = world_->broadcast(error);
  if (!error.empty()) throw std::invalid_argument(error);
  text = world_->broadcast(text);
  const std::string source = plan_options.file().empty() ? "the plan" : plan_options.file();
  plan_ = std::make_unique<TrainingPlan>(plan_from_json(text, source));
  const auto planned_stages = static_cast<int64_t>(plan_->peak_bytes.size());
  if (planned_stages != stages || plan_->replicas != replicas) {
    throw std::invalid_argument(
        source + " is for " + std::to_string(planned_stages) + " stages x " +
        std::to_string(plan_->replicas) + " replicas, but this run has " + std::to_string(stages) +
        " x " + std::to_string(replicas) +
        ": run it with as many (--strategy ddp_pipe --stages S where it has replicas), or plan "
        "again (--plan auto) for this layout");
  }
  options_.pipe(options_.pipe()
                    .balance(plan_->balance)
                    .chunks(plan_->chunks)
                    .schedule(plan_->schedule)
                    .virtual_stages(plan_->virtual_stages)
                    .checkpoint(checkpoint_mode_names()[static_cast<size_t>(plan_->checkpoint)]));
  options_.zero_stage(plan_->zero_stage);
  strategy_ = create_strategy(name, options_);
  if (world_->is_global_zero()) {
    std::filesystem::create_directories(log_dir_);
    write_file((std::filesystem::path(log_dir_) / "plan.json").string(), text);
  }
  print(plan_table(*plan_) + "\nplan written to " +
        (std::filesystem::path(log_dir_) / "plan.json").string());
}

}  // namespace pipetrain
