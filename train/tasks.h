#pragma once
// The tasks: each one's sizes (vocabulary, classes, one text or two), where its data lives by
// default, and how it is read. Its training settings are in the table of train/settings.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/data.h"

namespace cast::train {

struct TrainConfig;

struct Task {
  std::string name;
  int64_t vocab = 0, classes = 0;
  bool dual = false;     // two texts per example (Retrieval)
  std::string data_dir;  // the default data folder, as `cast data` writes it or LRA ships it
};

// Every task, in the order --help lists them.
const std::vector<Task>& tasks();
const std::vector<std::string>& task_names();
// The task of that name, or a UsageError listing them.
const Task& find_task(const std::string& name);

// Reads the task's data: from the run's data folder, else the task's default one. Short ListOps
// is generated into its default folder when `generate_if_missing` and it is not there yet.
data::TaskData load_task(const TrainConfig& c, bool generate_if_missing);
// The folder load_task reads: --data, else the task's default ("" for a task it does not know).
std::string data_folder(const TrainConfig& c);

}  // namespace cast::train
