// `pipetrain export --output` writes into a folder of its own (new, empty, or an earlier export's):
// not into the checkpoint it reads, whose shards it would delete, nor over other files unless
// --overwrite.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pipetrain/checkpoint_io.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::export_folder_test {
namespace {

namespace fs = std::filesystem;

TEST(ExportFolder, NotTheCheckpointNorAFolderOfOtherFilesUnlessOverwrite) {
  const std::string dir = make_temp_dir("export-folder");
  prepare_license_tokens(dir + "/data");
  run_ok(tiny_gpt2_fit_command(dir + "/run", dir + "/data/train.bin", {"--max-steps", "1"}));
  const std::string checkpoint = dir + "/run/lightning_logs/version_0/checkpoints/last.ckpt";
  const auto trained = read_checkpoint_weights(checkpoint);
  const auto export_to = [&](const std::string& output, const std::vector<std::string>& extra) {
    return run_command(
        pipetrain_command({"export", "--ckpt-path", checkpoint, "--output", output}, extra));
  };

  for (const std::string& own : {checkpoint, checkpoint + "/"}) {
    const auto into_checkpoint = export_to(own, {"--overwrite"});
    EXPECT_EQ(into_checkpoint.exit_code, 2) << into_checkpoint.output;
    EXPECT_NE(into_checkpoint.output.find("is the checkpoint"), std::string::npos)
        << into_checkpoint.output;
  }
  const auto into_run = export_to(dir + "/run/lightning_logs/version_0", {});
  EXPECT_EQ(into_run.exit_code, 2) << into_run.output;
  EXPECT_NE(into_run.output.find("holds what no export writes (checkpoints/, "), std::string::npos)
      << into_run.output;
  // Nothing was touched: the checkpoint reads back as it was.
  const auto after = read_checkpoint_weights(checkpoint);
  ASSERT_EQ(after.size(), trained.size());
  for (const auto& [name, tensor] : trained) EXPECT_TRUE(after.at(name).equal(tensor)) << name;

  fs::create_directories(dir + "/mine");
  std::ofstream(dir + "/mine/notes.txt") << "mine";
  std::ofstream(dir + "/mine/model.safetensors") << "mine too";
  const auto over_notes = export_to(dir + "/mine", {});
  EXPECT_EQ(over_notes.exit_code, 2) << over_notes.output;
  EXPECT_NE(over_notes.output.find("holds what no export writes (notes.txt)"), std::string::npos)
      << over_notes.output;
  EXPECT_EQ(fs::file_size(dir + "/mine/model.safetensors"), 8u);
  EXPECT_EQ(export_to(dir + "/mine", {"--overwrite"}).exit_code, 0);
  EXPECT_TRUE(fs::exists(dir + "/mine/notes.txt"));

  // An earlier export's folder is written again without --overwrite.
  run_ok(pipetrain_command({"export", "--ckpt-path", checkpoint, "--output", dir + "/hf"}));
  run_ok(pipetrain_command({"export", "--ckpt-path", checkpoint, "--output", dir + "/hf"}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::testing::export_folder_test
