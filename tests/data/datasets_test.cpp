// Data of the user's own through the Trainer, against the same rows as a TensorDataset and against
// `single`: a LibTorch dataset with a transform, per-sample fields beside the target (weights and
// row ids, checked in the step to belong to the target's rows), reads counted per stage,
// prefetching workers, and an exact resume mid-epoch.
// Tolerance: exact where the same arithmetic runs (same data by another route, workers, resume);
// absolute 1e-5 on weights and relative 1e-5 on losses where only the order of sums differs
// (micro-batches, replicas).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "pipetrain/module.h"
#include "pipetrain/torch_dataset.h"
#include "pipetrain/trainer.h"
#include "support/command.h"
#include "support/errors.h"
#include "support/fit_run.h"
#include "support/multiprocess.h"
#include "support/small_models.h"
#include "support/trainer_run.h"

namespace pipetrain::testing::datasets_test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 48;

// Row r: x = (sin r, cos 2r), target (x0 * x1, r), weight 1 + r % 3, id r.
at::Tensor row_inputs() {
  const auto r = torch::arange(kRows, torch::kFloat32);
  return torch::stack({r.sin(), (2 * r).cos()}, 1);
}
at::Tensor row_targets() {
  const auto x = row_inputs();
  return torch::stack({x.select(1, 0) * x.select(1, 1), torch::arange(kRows, torch::kFloat32)}, 1);
}

// The same rows as a LibTorch dataset, its inputs scaled by a transform.
class TorchRows : public torch::data::datasets::Dataset<TorchRows> {
 public:
  torch::data::Example<> get(size_t index) override {
    return {row_inputs()[static_cast<int64_t>(index)] / 2,
            row_targets()[static_cast<int64_t>(index)]};
  }
  torch::optional<size_t> size() const override { return kRows; }
};

// Counts what it is asked for, to show which ranks read.
class CountingRows : public TensorDataset {
 public:
  CountingRows() : TensorDataset(row_inputs(), row_targets()) {}
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override {
    if (wanted.data && wanted.target) {
      ++both_reads;
    } else if (wanted.data) {
      ++data_reads;
    } else if (wanted.target) {
      ++target_reads;
    }
    return TensorDataset::get_batch(indices, wanted);
  }
  mutable std::atomic<int64_t> data_reads{0}, target_reads{0}, both_reads{0};
};

// Failing at row 30, which the second epoch reaches.
class FailingRows : public TensorDataset {
 public:
  FailingRows() : TensorDataset(row_inputs(), row_targets()) {}
  Example get(int64_t index) const override {
    if (index == 30) throw std::runtime_error("row 30 is unreadable");
    return TensorDataset::get(index);
  }
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override {
    return Dataset::get_batch(indices, wanted);
  }
};

class Regression : public SgdModule {
 public:
  Regression() : SgdModule(tanh_mlp({2, 8, 8, 1}), 0.1, 0.9) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    const auto error = (forward(batch.data).squeeze(1) - batch.target.select(1, 0)).pow(2);
    at::Tensor loss;
    if (batch.fields.count("weight") > 0) {
      // The fields must be the target's rows, cut into the same micro-batches.
      if (!torch::equal(batch.field("id").to(torch::kFloat32), batch.target.select(1, 1))) {
        throw std::runtime_error("the fields reached the step beside other rows' targets");
      }
      const auto ids = batch.field("id");
      seen_ids.insert(seen_ids.end(), ids.data_ptr<int64_t>(),
                      ids.data_ptr<int64_t>() + ids.numel());
      const auto weight = batch.field("weight");
      loss = sum_over((weight * error).sum(), weight.sum());
    } else {
      loss = error.mean();
    }
    log("train_loss", loss);
    return loss;
  }
  std::vector<int64_t> seen_ids;  // the rows trained on, in order
};

std::shared_ptr<const Dataset> make_data(const std::string& kind) {
  if (kind == "torch") return from_torch_dataset(TorchRows());
  if (kind == "tensor") return std::make_shared<TensorDataset>(row_inputs() / 2, row_targets());
  if (kind == "counting") return std::make_shared<CountingRows>();
  if (kind == "failing") return std::make_shared<FailingRows>();
  const auto r = torch::arange(kRows);
  return std::make_shared<TensorDataset>(
      row_inputs(), row_targets(),
      std::map<std::string, at::Tensor>{{"weight", (1 + r % 3).to(torch::kFloat32)}, {"id", r}});
}

struct DataRun : FitRun {
  std::string data = "tensor";  // make_data's kind
  int64_t batch_size = 8, workers = 1, seed = 11;

  template <typename Visit>
  void fields(Visit&& visit) {
    FitRun::fields(visit);
    PIPETRAIN_VISIT_FIELDS(visit, data, batch_size, workers, seed);
  }
  std::string losses_csv(int64_t version = 0) const { return metrics_csv(root, version); }
};

// Three epochs, shuffled; every rank writes its layers and what it read.
void train(const DataRun& run) {
  Trainer trainer(run.trainer_options().max_epochs(3));
  Regression model;
  const auto data = make_data(run.data);
  const DataLoader loader(data, DataLoaderOptions()
                                    .batch_size(run.batch_size)
                                    .shuffle(true)
                                    .seed(static_cast<uint64_t>(run.seed))
                                    .num_workers(run.workers));
  trainer.fit(model, loader, nullptr, run.resume);
  const std::string rank = std::to_string(worker_rank());
  save_local_tensors(model, run.rank_tensors(worker_rank()));
  std::ofstream ids(run.root + "/ids-" + rank + (run.resume.empty() ? "" : "-resumed") + ".txt");
  for (const int64_t id : model.seen_ids) ids << id << "\n";
  if (const auto* counting = dynamic_cast<const CountingRows*>(data.get())) {
    std::ofstream(run.root + "/reads-" + rank + ".txt")
        << counting->data_reads << " " << counting->target_reads << " " << counting->both_reads;
  }
}

PIPETRAIN_WORKER(data_run_worker) { train_from_env(train); }

class Datasets : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  DataRun run(const std::string& name, const std::string& data,
              const std::string& strategy = "single", int64_t devices = 1,
              int64_t chunks = 1) const {
    DataRun r;
    r.root = dir + "/" + name;
    r.data = data;
    r.strategy = strategy;
    r.devices = devices;
    r.chunks = chunks;
    return r;
  }
  void train_in_ranks(const DataRun& r) const {
    fs::create_directories(r.root);
    ASSERT_EQ(run_ranks(static_cast<int>(r.devices), "data_run_worker", to_env(r)), 0);
  }
  std::string dir = make_temp_dir("datasets");
};

void expect_same_losses(const DataRun& expected, const DataRun& actual, double relative) {
  const auto a = read_csv_column(expected.losses_csv(), "train_loss");
  const auto b = read_csv_column(actual.losses_csv(), "train_loss");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], relative * std::abs(a[i])) << "step " << i;
  }
}

TEST_F(Datasets, ALibTorchDatasetWithATransformTrainsAsTheSameRowsInATensorDataset) {
  for (const std::string strategy : {"single", "pipe", "ddp"}) {
    SCOPED_TRACE(strategy);
    const int64_t devices = strategy == "single" ? 1 : 2;
    const int64_t chunks = strategy == "pipe" ? 2 : 1;
    const auto adapted = run(strategy + "-torch", "torch", strategy, devices, chunks);
    const auto tensors = run(strategy + "-tensor", "tensor", strategy, devices, chunks);
    if (devices == 1) {
      train(adapted);
      train(tensors);
    } else {
      train_in_ranks(adapted);
      train_in_ranks(tensors);
    }
    expect_same_losses(tensors, adapted, 0);
    for (int64_t rank = 0; rank < (strategy == "pipe" ? 2 : 1); ++rank) {
      expect_same_weights(tensors.rank_tensors(rank), adapted.rank_tensors(rank), 0);
    }
  }
}

TEST_F(Datasets, ExtraFieldsReachTheLastStageWithTheirRowsInEveryMicroBatch) {
  const auto single = run("single", "weighted");
  train(single);
  const auto pipe = run("pipe", "weighted", "pipe", 3, 3);
  train_in_ranks(pipe);
  auto ddp = run("ddp", "weighted", "ddp", 2);
  ddp.batch_size = 4;  // per replica: the same global batches as single's
  train_in_ranks(ddp);
  expect_same_losses(single, pipe, 1e-5);
  expect_same_losses(single, ddp, 1e-5);
  expect_same_weights(single.rank_tensors(0), ddp.rank_tensors(0), 1e-5);
}

TEST_F(Datasets, OnlyTheStagesThatUseAFieldReadIt) {
  const auto pipe = run("pipe", "counting", "pipe", 3, 2);
  train_in_ranks(pipe);
  auto reads = [&](int rank) {
    std::ifstream file(pipe.root + "/reads-" + std::to_string(rank) + ".txt");
    int64_t data = -1, target = -1, both = -1;
    file >> data >> target >> both;
    return std::vector<int64_t>{data, target, both};
  };
  // 6 batches an epoch, 3 epochs: the first stage reads inputs, the last targets, the middle none.
  EXPECT_EQ(reads(0), (std::vector<int64_t>{18, 0, 0}));
  EXPECT_EQ(reads(1), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(reads(2), (std::vector<int64_t>{0, 18, 0}));
}

TEST_F(Datasets, PrefetchingWorkersChangeNothingAndPassOnTheDatasetsErrors) {
  auto synchronous = run("workers-0", "tensor");
  synchronous.workers = 0;
  train(synchronous);
  auto three = run("workers-3", "tensor");
  three.workers = 3;
  train(three);
  expect_same_losses(synchronous, three, 0);
  expect_same_weights(synchronous.rank_tensors(0), three.rank_tensors(0), 0);

  auto failing = run("failing", "failing");
  failing.workers = 2;
  const auto error = error_of<std::runtime_error>([&] { train(failing); });
  EXPECT_NE(error.find("reading example 30 of the dataset failed: row 30 is unreadable"),
            std::string::npos)
      << error;
}

TEST_F(Datasets, AnAdaptedDatasetResumedMidEpochSeesTheBatchesOfAnUninterruptedRun) {
  const auto whole = run("whole", "torch");
  train(whole);
  auto stopped = run("resumed", "torch");
  stopped.max_steps = 8;  // epoch 1, batch 2 of 6
  train(stopped);
  auto resumed = stopped;
  resumed.max_steps = -1;
  resumed.resume = stopped.last_checkpoint();
  train(resumed);
  const auto expected = read_csv_column(whole.losses_csv(), "train_loss");
  EXPECT_EQ(train_losses_in({stopped.losses_csv(0), stopped.losses_csv(1)}), expected);
  expect_same_weights(whole.rank_tensors(0), resumed.rank_tensors(0), 0);
}

std::vector<int64_t> read_ids(const std::string& path) {
  std::ifstream file(path);
  std::vector<int64_t> ids;
  for (int64_t id; file >> id;) ids.push_back(id);
  return ids;
}

// The epoch's order does not depend on the layout: two replicas stopped half-way through an epoch
// resume as one and train on exactly the samples left, in the order an uninterrupted run has.
TEST_F(Datasets, AResumeWithAnotherNumberOfReplicasContinuesAtTheSameSample) {
  auto ddp = run("layout", "weighted", "ddp", 2);
  ddp.batch_size = 4;
  ddp.max_steps = 3;  // 24 of the epoch's 48 samples
  train_in_ranks(ddp);
  auto single = ddp;
  single.strategy = "single";
  single.devices = 1;
  single.max_steps = 9;  // 6 batches of 4: the rest of epoch 0
  single.resume = ddp.last_checkpoint();
  // Resuming where the rest of the epoch cannot be cut the same way, or is ordered otherwise, is
  // refused.
  auto uneven = single;
  uneven.root = dir + "/uneven";
  uneven.batch_size = 5;
  auto reseeded = single;
  reseeded.root = dir + "/reseeded";
  reseeded.seed = 12;
  for (const auto& [bad, message] : std::vector<std::pair<DataRun, std::string>>{
           {uneven,
            "a global batch here is 5 samples (batch size 5 x 1 replicas), which does not "
            "divide it"},
           {reseeded, "shuffle on, seed 11 and this loader's from shuffle on, seed 12"}}) {
    const auto error = error_of<std::invalid_argument>([&run = bad] { train(run); });
    EXPECT_NE(error.find("stopped mid-epoch 0 after 24 samples"), std::string::npos) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
  }
  train(single);

  const DataLoader order(make_data("weighted"),
                         DataLoaderOptions().batch_size(24).shuffle(true).seed(11));
  const auto expected = order.batch(0, 1).field("id");
  const auto resumed = read_ids(single.root + "/ids-0-resumed.txt");
  EXPECT_TRUE(torch::equal(torch::tensor(resumed, torch::kInt64), expected));
  auto all = read_ids(ddp.root + "/ids-0.txt");
  const auto second = read_ids(ddp.root + "/ids-1.txt");
  all.insert(all.end(), second.begin(), second.end());
  all.insert(all.end(), resumed.begin(), resumed.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> every(kRows);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(all, every);
}

}  // namespace
}  // namespace pipetrain::testing::datasets_test
