#include "models/run_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace pipetrain::cli {

namespace fs = std::filesystem;

std::string run_config_dir(const std::string& checkpoint) {
  if (checkpoint.empty()) return "";
  fs::path path = fs::path(checkpoint).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  const auto run = path.parent_path().parent_path();
  if (run.empty() || !fs::is_regular_file(run / "config.json")) return "";
  return run.string();
}

std::string read_model_type(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path + " is not valid JSON (" + e.what() +
                                "): it says the model the run trained; restore it");
  }
  if (!json.is_object() || !json.contains("model_type") || !json.at("model_type").is_string()) {
    throw std::invalid_argument(path +
                                " has no \"model_type\" string: it says the model the run "
                                "trained; restore it");
  }
  return json.at("model_type").get<std::string>();
}

ModelOptions with_run_shape(ModelOptions options, bool name_given, const std::string& checkpoint) {
  const std::string run = run_config_dir(checkpoint);
  if (run.empty()) return options;
  const std::string model_type = read_model_type(run);
  if (name_given && model_type != options.name) {
    throw std::invalid_argument("--model " + options.name + ": " + checkpoint + " is of a " +
                                model_type + " (model_type in " + run +
                                "/config.json, which its run wrote): pass --model " + model_type +
                                ", or leave --model out");
  }
  options.name = model_type;
  options.shape_from = run;
  return options;
}

}  // namespace pipetrain::cli
