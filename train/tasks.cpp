#include "train/tasks.h"

#include <filesystem>

#include "tensor/error.h"
#include "train/settings.h"

namespace cast::train {

const std::vector<Task>& tasks() {
  static const std::vector<Task> list = {
      //  name               vocab  classes  dual   default data folder
      {"listops-short", 16, 10, false, "data/listops-short"},  // small enough for a 2-core CPU
      {"listops", 16, 10, false, "data/listops-1000"},
      {"text", 257, 2, false, "data/aclImdb"},
      {"retrieval", 257, 2, true, "data/aan"},
      {"image", 256, 10, false, "data/cifar-10-batches-bin"},
      {"pathfinder", 256, 2, false, "data/pathfinder32"},
      {"pathx", 256, 2, false, "data/pathx128"},
      {"fashion-mnist", 256, 10, false, data::default_fashion_mnist_dir()},
      {"fashion-mnist-14", 256, 10, false, data::default_fashion_mnist_dir()},  // 14×14: 196 tokens
      // the image task's configuration (LRA's grey CIFAR-10) on Fashion-MNIST: 784 pixel tokens
      {"fashion-mnist-lra", 256, 10, false, data::default_fashion_mnist_dir()},
  };
  return list;
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Task& t : tasks()) out.push_back(t.name);
    return out;
  }();
  return names;
}

static const Task* task_named(const std::string& name) {
  for (const Task& t : tasks())
    if (t.name == name) return &t;
  return nullptr;
}

const Task& find_task(const std::string& name) {
  const Task* t = task_named(name);
  if (!t) throw UsageError(fmt::format("unknown task '{}' ({})", name, fmt::join(task_names(), ", ")));
  return *t;
}

// The loader of task t on the files in dir.
static data::TaskData load_task_data(const std::string& t, const std::string& dir, int64_t max_len) {
  if (t == "listops-short" || t == "listops") return data::load_listops(dir, max_len);
  if (t == "text") return data::load_imdb(dir, max_len);
  if (t == "retrieval") return data::load_aan(dir, max_len);
  if (t == "image") return data::load_cifar10(dir);
  if (t == "fashion-mnist" || t == "fashion-mnist-14" || t == "fashion-mnist-lra")
    return data::load_fashion_mnist(dir, t == "fashion-mnist-14" ? 2 : 1);
  if (t == "pathfinder" || t == "pathx") return data::load_pathfinder(dir, t);
  throw Error(fmt::format("task '{}' has no loader", t));
}

std::string data_folder(const TrainConfig& c) {
  if (!c.data_dir.empty()) return c.data_dir;
  const Task* task = task_named(c.task);
  return task ? task->data_dir : "";
}

data::TaskData load_task(const TrainConfig& c, bool generate_if_missing) {
  const std::string& t = c.task;
  const Task* task = task_named(t);  // a checkpoint may name a task of the tests ("counting")
  CAST_CHECK(task, "unknown task '{}' ({})", t, fmt::join(task_names(), ", "));
  const std::string dir = data_folder(c);
  const int64_t max_len = c.model.max_len;
  if (t == "listops-short" && generate_if_missing && !std::filesystem::exists(dir + "/basic_train.tsv")) {
    fmt::print("generating short ListOps into {}\n", dir);
    data::generate_listops(dir, data::ListOpsSpec::short_cpu(), 1, false, {},
                           "cast data listops-short");
  }
  data::TaskData loaded = load_task_data(t, dir, max_len);
  loaded.name = t;  // messages name the task the user chose (listops-short, not the loader's listops)
  return loaded;
}

}  // namespace cast::train
