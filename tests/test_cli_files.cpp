// Issue 19 through the binary: an output never replaces an input, planted links are never
// followed, every number and file read is checked whole, and messages name the file or setting.
// Every case writes its own inputs in a fresh folder.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <regex>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tensor/safetensors.h"
#include "tests/folder_holder.h"
#include "tests/test_util.h"
#include "train/compare.h"
#include "train/trainer.h"

using cast::testing::slurp;

using namespace cast;
namespace fs = std::filesystem;

namespace {

struct CliRun {
  int code;
  std::string out, err;
};

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The binary with a time limit: a command that hangs on a FIFO fails the test instead of it.
// `cwd`: the folder it runs in (default: the test's).
CliRun run(const std::string& args, const std::string& cwd = "") {
  static int calls = 0;
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(calls++);
  const std::string out = (fs::temp_directory_path() / ("cast_clif_out_" + tag)).string();
  const std::string err = (fs::temp_directory_path() / ("cast_clif_err_" + tag)).string();
  const std::string cmd = (cwd.empty() ? "" : "cd '" + cwd + "' && ") + "timeout 60 " + std::string(CAST_BINARY) + " " +
                          args + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

std::string fresh_dir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("cast_clif_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A finished 3-step run on tiny ListOps, made once per test process: a checkpoint, metrics and a
// summary to point commands at. Tests copy it before changing anything.
const std::string& trained_run() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("trained");
    data::ListOpsSpec s = data::ListOpsSpec::short_cpu();
    s.max_depth = 2, s.max_args = 3, s.min_length = 4, s.max_length = 20, s.train = 64, s.val = 16, s.test = 16;
    data::generate_listops(d + "/data", s, 5);
    train::TrainConfig c = train::preset("listops-short");
    train::apply_overrides(c, {{"data", d + "/data"},
                               {"run", d + "/run"},
                               {"steps", 3},
                               {"batch", 4},
                               {"dim", 8},
                               {"heads", 2},
                               {"mlp-dim", 8},
                               {"layers", 1},
                               {"log-every", 1},
                               {"device", "cpu"},
                               {"attention", "full"}});
    train::run_training(c, "", 0, true);
    return d;
  }();
  return dir;
}

std::string copy_run(const std::string& name) {
  const std::string d = fresh_dir(name);
  fs::copy(trained_run() + "/run", d + "/run", fs::copy_options::recursive);
  return d + "/run";
}

}  // namespace

TEST(CliFiles, AnOutputEqualToAnInputIsRefusedAndTheInputKept) {
  const std::string run_dir = copy_run("out_is_in");
  const std::string ckpt = run_dir + "/checkpoint.safetensors", metrics = run_dir + "/metrics.jsonl";
  const std::string ckpt_bytes = slurp(ckpt), metrics_bytes = slurp(metrics);
  fs::create_symlink(ckpt, run_dir + "/alias.st");  // another name for the same file
  for (const std::string& args :
       {"clusters --checkpoint " + ckpt + " --out " + ckpt,
        "clusters --checkpoint " + ckpt + " --out " + run_dir + "/alias.st",
        "attention --checkpoint " + ckpt + " --out " + ckpt, "plot " + run_dir + " --out " + ckpt,
        "plot " + run_dir + " --out " + metrics, "plot " + run_dir + " --out " + run_dir + "/./metrics.jsonl",
        "layer --in " + ckpt + " --out " + ckpt, "layer --in " + ckpt + " --out " + run_dir + "/alias.st"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("an output never replaces an input"), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_EQ(slurp(ckpt), ckpt_bytes);
  EXPECT_EQ(slurp(metrics), metrics_bytes);
  // the checkpoint named bare, from inside its run folder: its neighbours are inputs too
  for (const std::string& args :
       {"clusters --checkpoint checkpoint.safetensors --out metrics.jsonl",
        "attention --checkpoint checkpoint.safetensors --out metrics.jsonl",
        "eval --checkpoint checkpoint.safetensors --attention clustered --figure metrics.jsonl"}) {
    const CliRun r = run(args, run_dir);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("an output never replaces an input"), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_EQ(slurp(metrics), metrics_bytes);
}

TEST(CliFiles, PlantedLinksInARunFolderAreNeverFollowed) {
  const std::string base = fresh_dir("planted");
  const std::string victim = base + "/victim.txt";
  // where a temporary file goes: written beside the link, which stays; at a run file: refused
  for (const char* planted : {".write_test.tmp", "checkpoint.safetensors.tmp", "metrics.jsonl"}) {
    const std::string run_dir = base + "/run_" + std::string(planted).substr(1, 5);
    fs::create_directories(run_dir);
    put(victim, "precious");
    fs::create_symlink(victim, run_dir + "/" + planted);
    const CliRun r = run("train --data " + trained_run() + "/data --run " + run_dir +
                         " --steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu --attention full");
    const bool run_file = std::string(planted) == "metrics.jsonl";
    EXPECT_EQ(r.code, run_file ? 2 : 0) << planted << ": " << r.err;
    if (run_file) {
      EXPECT_EQ(lines(r.err), 1) << planted << ": " << r.err;
      EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << planted << ": " << r.err;
    }
    EXPECT_EQ(slurp(victim), "precious") << planted;
    EXPECT_TRUE(fs::is_symlink(run_dir + "/" + planted)) << planted;
  }
  // cast data's temporary files: the same
  const std::string data_dir = base + "/data";
  fs::create_directories(data_dir);
  put(data_dir + "/" + data::kDataFolderMark, "");  // a folder cast data made, before digests: replaced when told
  put(victim, "precious");
  fs::create_symlink(victim, data_dir + "/basic_train.tsv.tmp");
  const CliRun r = run("data listops-short --count 10 --out " + data_dir + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_TRUE(fs::is_symlink(data_dir + "/basic_train.tsv.tmp"));
}

TEST(CliFiles, IntegerFlagsAreCheckedWholeAndUsageErrorsExit2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"clusters --checkpoint x.st --scale 4294967300", "--scale is 4294967300: it must be in [1, 64]"},
      {"clusters --checkpoint x.st --index -1", "--index is -1"},
      {"clusters", "--checkpoint is required"},
      {"attention", "--checkpoint is required"},
      {"attention --checkpoint x.st --index -1", "--index is -1"},
      {"eval", "--checkpoint is required"},
      {"eval --checkpoint x.st --eval-limit -3", "--eval-limit is -3"},
      {"data listops --min-length 4294967297", "--min-length is 4294967297: it must be in [0, 100000]"},
      {"data listops --min-length -5", "--min-length is -5"},
      {"data listops --seed -1", "--seed is -1"},
      {"compare --seeds 1,01", "--seeds: seed 1 is listed twice"},
      {"plot", "name at least one run folder"},
      {"layer --in x.st", "--in and --out are required"}};
  for (const auto& [args, message] : cases) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
}

// A path that is no file (a folder, a link chain) is a usage error (exit 2); a read-only folder
// is the machine's (exit 1). Either way before any work.
TEST(CliFiles, BenchJsonToAFolderOrAReadOnlyFolderIsRefusedBeforeAnyWork) {
  const std::string d = fresh_dir("bench_json");
  fs::create_directory(d + "/ro");
  fs::permissions(d + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
  for (const auto& [target, code] :
       std::vector<std::pair<std::string, int>>{{d, 2}, {d + "/ro/b.json", 1}, {"/dev/stdout", 2}}) {
    const CliRun r = run("bench attention --lengths 16 --repeats 1 --warmup 0 --mechanisms full --json " + target);
    EXPECT_EQ(r.code, code) << target << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("cast bench: error: --json " + target + ":", 0), 0u) << r.err;
    EXPECT_EQ(r.out.find("attention benchmark"), std::string::npos) << "work started: " << r.out;
  }
  EXPECT_TRUE(fs::is_empty(d + "/ro"));
  fs::permissions(d + "/ro", fs::perms::owner_all);
  const CliRun ok =
      run("bench attention --lengths 16 --repeats 1 --warmup 0 --mechanisms full --json " + d + "/b.json");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(d + "/b.json"))["mechanism"], "full");
  // every benchmark writes the file it is given (gemm once ignored --json)
  const CliRun gemm = run("bench gemm --repeats 1 --warmup 0 --json " + d + "/g.json");
  EXPECT_EQ(gemm.code, 0) << gemm.err;
  EXPECT_NE(slurp(d + "/g.json").find("\"gemm\":512"), std::string::npos) << slurp(d + "/g.json");
}

TEST(CliFiles, ASummaryIsValidatedByKeyWhenAComparisonReadsIt) {
  const std::string d = fresh_dir("summary");
  train::CompareSpec spec;
  spec.task = "listops-short";
  spec.out_dir = d + "/cmp";
  spec.variants = {{"full", {{"attention", "full"}}}};
  spec.seeds = {1};
  spec.settings = {{"data", trained_run() + "/data"},
                   {"steps", 2},
                   {"batch", 4},
                   {"dim", 8},
                   {"heads", 2},
                   {"mlp-dim", 8},
                   {"layers", 1},
                   {"device", "cpu"}};
  ASSERT_TRUE(train::run_comparison(spec, 0, true).complete);
  const std::string summary = d + "/cmp/full-seed1/summary.json";
  nlohmann::json j = nlohmann::json::parse(slurp(summary));
  j["test_accuracy"] = 7.5;
  put(summary, j.dump());
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "run summary " + summary + ": 'test_accuracy' is 7.5, outside [0, 1]");
  j["test_accuracy"] = "high";
  put(summary, j.dump());
  try {
    train::run_comparison(spec, 0, true);
    ADD_FAILURE() << "a string accuracy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'test_accuracy' is \"high\", not a number"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
  }
  // every key is checked against what cast train writes for this run (eighth attack, H10)
  nlohmann::json written = j;
  written["test_accuracy"] = 0.5;
  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& message) {
    nlohmann::json edited = written;
    if (value.is_null()) edited.erase(key);
    else edited[key] = value;
    put(summary, edited.dump());
    EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true), "run summary " + summary + ": " + message);
  };
  refused("made_by", "me", "'made_by' is \"me\", not cast train");
  refused("val_examples", -1, "'val_examples' is -1, not a whole number from 0 to");
  refused("evaluated", "xx", "'evaluated' is \"xx\", not final or best");
  refused("evaluated_step", 99, "'evaluated_step' is 99, not a whole number from 0 to 2");
  refused("task", "text", "'task' is \"text\", not listops-short");
  refused("attention", "cast", "'attention' is \"cast\", not full");
  refused("colour", "blue", "'colour' is no key of a summary cast train writes");
  refused("steps", 3, "'steps' is 3, not a whole number from 0 to 2");
  // a value changed within its range: the digest tells (twenty-fourth attack); a summary without
  // a digest (written before them) is read
  put(summary, written.dump());
  EXPECT_CAST_ERROR(train::run_comparison(spec, 0, true),
                    "run summary " + summary + ": was changed since cast train wrote it (its digest no longer matches)");
  written.erase("digest");
  put(summary, written.dump());
  EXPECT_TRUE(train::run_comparison(spec, 0, true).complete);
}

TEST(CliFiles, MetricsLinesAreValidatedByKey) {
  const std::string run_dir = copy_run("metrics");
  put(run_dir + "/metrics.jsonl", R"({"step": 1, "split": "train", "loss": "low", "accuracy": 0.5})"
                                  "\n");
  CliRun r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("metrics.jsonl:1: 'loss' is \"low\", not a number"), std::string::npos) << r.err;
  put(run_dir + "/metrics.jsonl", R"({"step": 1, "split": "val", "accuracy": 3})"
                                  "\n");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_NE(r.err.find("metrics.jsonl:1: 'accuracy' is 3, outside [0, 1]"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir + "/c.svg"));
  // keys and step order, as the trainer writes them (eighth attack, H10)
  const std::string train1 = R"({"step": 1, "split": "train", "loss": 1, "accuracy": 0.5})";
  const std::string train2 = R"({"step": 2, "split": "train", "loss": 1, "accuracy": 0.5})";
  put(run_dir + "/metrics.jsonl", train1 + "\n" + R"({"step": 2, "split": "train", "loss": 1, "accuracy": 0.5, "x": 1})");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_NE(r.err.find("metrics.jsonl:2: 'x' is no key of a train record"), std::string::npos) << r.err;
  put(run_dir + "/metrics.jsonl", train2 + "\n" + train1 + "\n");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_NE(r.err.find("metrics.jsonl:2: train step 1 comes after step 2: not in step order"), std::string::npos)
      << r.err;
  put(run_dir + "/metrics.jsonl", train1 + "\n" + train1 + "\n");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_NE(r.err.find("metrics.jsonl:2: train step 1 comes after step 1"), std::string::npos) << r.err;
  put(run_dir + "/metrics.jsonl", train2 + "\n" + R"({"step": 2, "split": "val", "loss": 1, "accuracy": 0.5, "final": 1})");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_NE(r.err.find("metrics.jsonl:2: 'final' is 1, not true"), std::string::npos) << r.err;
  put(run_dir + "/metrics.jsonl", R"({"step": 1e15, "split": "train", "loss": 1, "accuracy": 0.5})");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");  // tenth attack, K11
  EXPECT_NE(r.err.find("'step' is 1e+15, not an integer 0 or more written as one"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir + "/c.svg"));
  // a final evaluation's record of an earlier step (the best model's) is the trainer's own
  put(run_dir + "/metrics.jsonl", train1 + "\n" + R"({"step": 1, "split": "val", "loss": 1, "accuracy": 0.5})" + "\n" +
                                      train2 + "\n" + R"({"step": 2, "split": "val", "loss": 1, "accuracy": 0.5})" +
                                      "\n" + R"({"step": 1, "split": "val", "loss": 1, "accuracy": 0.6, "final": true})");
  r = run("plot " + run_dir + " --out " + run_dir + "/c.svg");
  EXPECT_EQ(r.code, 0) << r.err;
  // files written before the "final" mark repeat the last validation's step unmarked: still read
  put(run_dir + "/metrics.jsonl", train2 + "\n" + R"({"step": 2, "split": "val", "loss": 1, "accuracy": 0.5})" + "\n" +
                                      R"({"step": 2, "split": "val", "loss": 1, "accuracy": 0.6})");
  r = run("plot " + run_dir + " --out " + run_dir + "/c2.svg");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(CliFiles, AReformattedButEqualModelConfigIsAcceptedAndADifferenceNamed) {
  const std::string run_dir = copy_run("reformatted");
  const std::string ckpt = run_dir + "/checkpoint.safetensors";
  TensorFile f = read_safetensors(ckpt);
  nlohmann::json model = nlohmann::json::parse(f.metadata.at("model"));
  f.metadata["model"] = model.dump(4);  // the same values, other whitespace
  write_safetensors(ckpt, f.tensors, f.metadata);
  CliRun r = run("eval --checkpoint " + ckpt + " --data " + trained_run() + "/data");
  EXPECT_EQ(r.code, 0) << r.err;
  // a setting full attention does not read makes no other model
  model["attention"]["topk"] = 7;
  f.metadata["model"] = model.dump();
  write_safetensors(ckpt, f.tensors, f.metadata);
  train::TrainConfig c = train::read_checkpoint_header(ckpt).config;
  c.model.attention.topk = 32;
  nn::Transformer same(c.model, DType::f32, Device::cpu);
  train::load_checkpoint(ckpt, same, nullptr, nullptr);
  // the model config names the differing field; the train config keeps its own (checked) copy
  c.model.attention.mechanism = nn::Mechanism::iclustered;
  model["attention"]["mechanism"] = "iclustered";
  f.metadata["model"] = model.dump();
  write_safetensors(ckpt, f.tensors, f.metadata);
  nn::Transformer other(c.model, DType::f32, Device::cpu);
  EXPECT_CAST_ERROR(train::load_checkpoint(ckpt, other, nullptr, nullptr),
                    "'attention.topk' is 7 in the checkpoint but 32");
}

TEST(CliFiles, AHugeVocabularyInACheckpointIsRefusedBeforeAllocating) {
  const std::string run_dir = copy_run("vocab");
  const std::string ckpt = run_dir + "/checkpoint.safetensors";
  TensorFile f = read_safetensors(ckpt);
  nlohmann::json model = nlohmann::json::parse(f.metadata.at("model"));
  model["vocab"] = int64_t{1} << 40;
  f.metadata["model"] = model.dump();
  write_safetensors(ckpt, f.tensors, f.metadata);
  const CliRun r = run("eval --checkpoint " + ckpt);
  EXPECT_EQ(r.code, 1) << r.err;  // a bad file, not a bad command line
  EXPECT_NE(r.err.find("setting 'vocab' is 1099511627776"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << r.err;
}

TEST(CliFiles, MessagesNameTheFileNotTheLibrary) {
  const std::string d = fresh_dir("messages");
  fs::create_directory(d + "/folder");
  put(d + "/string.json", R"({"steps": "three"})");
  put(d + "/list.json", "[1, 2]");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --config " + d + "/folder", "config file " + d + "/folder: is a folder, not a regular file"},
      {"train --config " + d + "/list.json", "config file " + d + "/list.json: holds array"},
      {"train --config " + d + "/string.json", "config file " + d + "/string.json: setting 'steps'"},
      {"eval --checkpoint " + d + "/folder", "checkpoint " + d + "/folder: is a folder"},
      {"layer --in " + d + "/folder --out " + d + "/o.st", "--in " + d + "/folder: is a folder"}};
  for (const auto& [args, message] : cases) {
    const CliRun r = run(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
    for (const char* internal : {"basic_filebuf", "json.exception", "unexpected error"})
      EXPECT_EQ(r.err.find(internal), std::string::npos) << args << ": " << r.err;
  }
}

TEST(CliFiles, AnOutputReplacesOnlyAFileOfItsOwnKind) {
  const std::string run_dir = copy_run("own_kind");
  const std::string d = fs::path(run_dir).parent_path().string();
  const std::string data_file = d + "/basic_test.tsv", other_ckpt = d + "/other.safetensors", notes = d + "/notes.txt";
  fs::copy_file(trained_run() + "/data/basic_test.tsv", data_file);
  fs::copy_file(run_dir + "/checkpoint.safetensors", other_ckpt);  // a checkpoint that is no input here
  put(notes, "my notes\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plot " + run_dir + " --out " + data_file, "is not a figure drawn by cast; not replacing it (pass --overwrite"},
      {"clusters --checkpoint " + run_dir + "/checkpoint.safetensors --out " + notes, "is not a figure drawn by cast"},
      {"attention --checkpoint " + run_dir + "/checkpoint.safetensors --out " + notes, "is not a figure drawn by cast"},
      {"layer --in " + std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors --out " + other_ckpt,
       "is not an output of cast layer"},
      {"bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --json " + notes,
       "is not rows of cast bench"}};
  const std::string data_bytes = slurp(data_file), ckpt_bytes = slurp(other_ckpt);
  for (const auto& [args, message] : cases) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_EQ(slurp(data_file), data_bytes);
  EXPECT_EQ(slurp(other_ckpt), ckpt_bytes);
  EXPECT_EQ(slurp(notes), "my notes\n");
  // a figure replaces a figure
  EXPECT_EQ(run("plot " + run_dir + " --out " + d + "/fig.svg").code, 0);
  const CliRun again = run("plot " + run_dir + " --out " + d + "/fig.svg");
  EXPECT_EQ(again.code, 0) << again.err;
}

// Each single-file output, written again, replaces its own unchanged file; changed by hand, it
// is kept (its digest no longer matches) unless --overwrite says otherwise (twenty-fourth attack:
// an edited figure, trace, bench rows or layer output was replaced silently).
TEST(CliFiles, AnOutputChangedByHandIsNotReplacedByItsOwnKind) {
  const std::string run_dir = copy_run("changed_by_hand");
  const std::string d = fs::path(run_dir).parent_path().string();
  const std::string layer = "layer --in " + std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors --attention " +
                            "full --heads 2 --out " + d + "/layer.safetensors";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plot " + run_dir + " --out " + d + "/fig.svg", d + "/fig.svg"},
      {"bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --json " + d + "/rows.jsonl",
       d + "/rows.jsonl"},
      {layer, d + "/layer.safetensors"},
      {layer + "2 --trace " + d + "/trace.jsonl", d + "/trace.jsonl"},
      {"plot " + run_dir, run_dir + "/curves.svg"}};
  for (const auto& [args, file] : cases) {
    ASSERT_EQ(run(args).code, 0) << args;
    const CliRun again = run(args);
    ASSERT_EQ(again.code, 0) << args << ": " << again.err;
    std::string edited = slurp(file);
    ASSERT_GT(edited.size(), 8u) << file;
    edited[edited.size() - 3] ^= 1;  // the last number of a row, a tensor's last byte, a figure's end tag
    put(file, edited);
    const CliRun refused = run(args);
    EXPECT_EQ(refused.code, 2) << args << ": " << refused.err;
    EXPECT_NE(refused.err.find("changed since cast wrote it (its digest no longer matches)"), std::string::npos)
        << args << ": " << refused.err;
    EXPECT_EQ(slurp(file), edited) << args;
    const CliRun overwritten = run(args + " --overwrite");
    EXPECT_EQ(overwritten.code, 0) << args << ": " << overwritten.err;
    EXPECT_NE(slurp(file), edited) << args;
  }
}

TEST(CliFiles, TrainNeverWritesOverItsOwnConfigFile) {
  const std::string run_dir = copy_run("config_in_run");
  const std::string cfg = run_dir + "/summary.json";  // a settings file kept where the run writes
  put(cfg, R"({"steps": 2, "batch": 4, "dim": 8, "heads": 2, "mlp-dim": 8, "layers": 1, "device": "cpu"})");
  const CliRun r =
      run("train --config " + cfg + " --data " + trained_run() + "/data --run " + run_dir + " --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("run file " + run_dir + "/summary.json is the input"), std::string::npos) << r.err;
  EXPECT_NE(slurp(cfg).find("\"steps\": 2"), std::string::npos);
}

TEST(CliFiles, AnOddRunFileIsRefusedBeforeAnyStep) {
  const std::string run_dir = copy_run("odd_run_file");
  fs::remove(run_dir + "/summary.json");
  ASSERT_EQ(::mkfifo((run_dir + "/summary.json").c_str(), 0644), 0);
  const CliRun r =
      run("train --data " + trained_run() + "/data --run " + run_dir +
          " --overwrite --steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu --attention full");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("run file " + run_dir + "/summary.json: exists and is a FIFO"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << "a step was spent: " << r.out;
  EXPECT_TRUE(fs::is_fifo(run_dir + "/summary.json"));
}

TEST(CliFiles, AttentionDrawsAFullModelsWeightsAgainstTheApproximations) {
  const std::string run_dir = copy_run("attention");
  const std::string ckpt = run_dir + "/checkpoint.safetensors", out = run_dir + "/../attention.svg";
  const CliRun r = run("attention --checkpoint " + ckpt + " --clusters 2 --topk 2 --queries 0,1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want : {"weight moved from full attention", "clustered, C 2", "improved, C 2, top 2"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << ":\n" << r.out;
  const std::string svg = slurp(out);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find(">query 0<"), std::string::npos);
  EXPECT_NE(svg.find(">query 1<"), std::string::npos);
  EXPECT_EQ(svg.find(">query 2<"), std::string::npos);
  for (const auto& [queries, message] : std::vector<std::pair<std::string, std::string>>{
           {"0,x", "--queries: 'x' is not a whole number"}, {"999", "--queries: 999 is outside the input's"}}) {
    const CliRun bad = run("attention --checkpoint " + ckpt + " --queries " + queries + " --out " + out);
    EXPECT_EQ(bad.code, 2) << queries;
    EXPECT_NE(bad.err.find(message), std::string::npos) << bad.err;
  }
}

TEST(CliFiles, EvalSweepsMechanismsAndClusterCountsIntoOneTableAndFigure) {
  const std::string run_dir = copy_run("eval_sweep");
  const std::string ckpt = run_dir + "/checkpoint.safetensors", out = run_dir + "/../sweep.svg";
  const CliRun r = run("eval --checkpoint " + ckpt + " --attention clustered,iclustered --clusters 2,4 --topk 2,3" +
                       " --eval-limit 8 --figure " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  // the trained model, then clustered at C 2 and 4, then improved clustered with 2 and 3 top keys at each C
  for (const char* row :
       {"| full (trained) |", "| clustered | 2 |  |", "| clustered | 4 |  |", "| iclustered | 2 | 2 |",
        "| iclustered | 4 | 2 |", "| iclustered | 2 | 3 |", "| iclustered | 4 | 3 |"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << ":\n" << r.out;
  const std::string svg = slurp(out);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 4u);  // clustered, improved with 2 and with 3 top keys, the trained model
  const CliRun bad = run("eval --checkpoint " + ckpt + " --attention clustered --clusters 2,x");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--clusters: 'x' is not a whole number"), std::string::npos) << bad.err;
}

// ---------------------------------------------------------------- issue 41: settings checked for what they mean
namespace {
const std::string kTiny = " --steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu";
}

TEST(CliSettings, ARepeatedOrEmptyOptionIsAUsageError) {
  const std::string d = fresh_dir("repeated");
  const std::string data = " --data " + trained_run() + "/data";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"train" + data + " --run " + d + "/r --steps 3" + kTiny, "--steps is given twice"},
           {"train" + data + " --run ''" + kTiny, "--run is given an empty value"},
           {"train --data '' --run " + d + "/r2" + kTiny, "--data is given an empty value"},
           {"data listops-short --task listops --out " + d + "/data", "--task is given twice"},
           {"compare --vary lr=0.1 --vary lr=0.2 --out " + d + "/c" + data + kTiny, "--vary is given twice"},
           {"train" + data + " --run " + d + "/r3 --lr 1e-320" + kTiny,
            "--lr is 1e-320: beyond the range of a double"}}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_TRUE(fs::is_empty(d)) << "nothing was written";
  put(d + "/empty_run.json", R"({"run": ""})");
  const CliRun file = run("train --config " + d + "/empty_run.json" + data + kTiny);
  EXPECT_EQ(file.code, 2) << file.err;
  EXPECT_NE(file.err.find("setting 'run' is empty"), std::string::npos) << file.err;
}

TEST(CliSettings, CompareAppliesOrRefusesEachKeyOfItsConfig) {
  const std::string d = fresh_dir("compare_config");
  put(d + "/full.json", R"({"attention": "full"})");
  const CliRun r = run("compare --config " + d + "/full.json --data " + trained_run() + "/data --out " + d + "/c" +
                       kTiny + " --eval-limit 8");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto results = nlohmann::json::parse(slurp(d + "/c/results.json"));
  ASSERT_EQ(results["variants"].size(), 1u) << results.dump();  // all four mechanisms trained before
  EXPECT_EQ(results["variants"][0]["variant"], "full");
  put(d + "/seed.json", R"({"seed": 3})");
  const CliRun seed = run("compare --config " + d + "/seed.json --out " + d + "/c2" + kTiny);
  EXPECT_EQ(seed.code, 2) << seed.err;
  EXPECT_NE(seed.err.find(d + "/seed.json: setting 'seed' is cast compare's to choose"), std::string::npos) << seed.err;
  put(d + "/unknown.json", R"({"stpes": 3})");
  const CliRun unknown = run("compare --config " + d + "/unknown.json --out " + d + "/c3" + kTiny);
  EXPECT_EQ(unknown.code, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("config file " + d + "/unknown.json: unknown setting 'stpes'"), std::string::npos)
      << unknown.err;
}

TEST(CliSettings, MeaninglessOrOutOfRangeValuesAreRefusedByName) {
  const std::string run_dir = copy_run("meaning");
  const std::string ckpt = run_dir + "/checkpoint.safetensors";
  // an option the mechanism does not read is refused, not printed as if it applied
  const CliRun eval = run("eval --checkpoint " + ckpt + " --attention full --clusters 8");
  EXPECT_EQ(eval.code, 2) << eval.err;
  EXPECT_NE(eval.err.find("--clusters is an option of --attention clustered and iclustered, not of full"),
            std::string::npos)
      << eval.err;
  // a mask of 0.5 is neither a token nor padding
  TensorFile layer = read_safetensors(std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors");
  ASSERT_TRUE(layer.tensors.count("x"));
  const Tensor& x = layer.tensors.at("x");
  std::vector<double> mask(static_cast<size_t>(x.dim(0) * x.dim(1)), 1.0);
  mask[1] = 0.5;
  layer.tensors["mask"] = Tensor::from_vector<double>(mask, {x.dim(0), x.dim(1)}).to(x.dtype());
  const std::string half = fs::path(run_dir).parent_path().string() + "/half_mask.safetensors";
  write_safetensors(half, layer.tensors, layer.metadata);
  const CliRun masked = run("layer --in " + half + " --out " + half + ".out");
  EXPECT_EQ(masked.code, 1) << masked.err;
  EXPECT_NE(masked.err.find("tensor 'mask' holds 0.5"), std::string::npos) << masked.err;
  // more clusters than tokens
  const CliRun clusters = run("attention --checkpoint " + ckpt + " --clusters 65536 --out " + run_dir + "/a.svg");
  EXPECT_EQ(clusters.code, 2) << clusters.err;
  EXPECT_NE(clusters.err.find("--clusters 65536 is more than the"), std::string::npos) << clusters.err;
  // the bound counts the class token, and says so: the input's tokens are those --queries counts
  const CliRun queries = run("attention --checkpoint " + ckpt + " --queries 65536 --out " + run_dir + "/a.svg");
  std::smatch counted;
  ASSERT_TRUE(std::regex_search(queries.err, counted, std::regex("outside the input's ([0-9]+) tokens"))) << queries.err;
  EXPECT_NE(clusters.err.find(fmt::format("tokens the attention sees (the input's {} and the class token)",
                                          counted[1].str())),
            std::string::npos)
      << clusters.err;
  // a file given where a run folder belongs is named as such, a usage error as every path of the
  // wrong kind is (tenth attack, K10: a FIFO was exit 2 for --config and 1 elsewhere)
  const CliRun plot = run("plot " + ckpt);
  EXPECT_EQ(plot.code, 2) << plot.err;
  EXPECT_NE(plot.err.find("run folder " + ckpt), std::string::npos) << plot.err;
  // a resumed setting that differs past the printed digits prints enough of them
  const CliRun lr = run("train --resume " + ckpt + " --lr 0.00200000001 --steps 5");
  EXPECT_EQ(lr.code, 2) << lr.err;
  EXPECT_NE(lr.err.find("not 0.00200000001"), std::string::npos) << lr.err;
}

TEST(CliSettings, TruncationByMaxLenIsNoted) {
  const std::string d = fresh_dir("max_len");
  const CliRun r =
      run("train --data " + trained_run() + "/data --run " + d + "/r --max-len 4 --attention full" + kTiny);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("note: --max-len 4 cuts"), std::string::npos) << r.out;
}

TEST(CliFiles, AFileLargerThanTheMemoryIsRefusedByName) {
  const std::string d = fresh_dir("sparse");
  const std::string huge = d + "/huge.safetensors";
  { std::ofstream(huge) << ""; }
  fs::resize_file(huge, uintmax_t{1} << 39);  // 512 GiB, sparse: no disk is spent
  const CliRun r = run("eval --checkpoint " + huge);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(huge), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("out of memory ("), std::string::npos) << r.err;
  fs::remove(huge);
}

// The second attack's defects (issue 41), one case each: each fails without its fix.
TEST(CliAttack, ANewRunReplacesOnlyWhatACastRunLeft) {
  const std::string d = fresh_dir("user_files"), data = trained_run() + "/data";
  fs::create_directories(d + "/mine");
  for (const char* name : {"metrics.jsonl", "summary.json", "curves.svg"}) {
    put(d + "/mine/" + name, "my notes");
    const CliRun r = run("train --data " + data + " --run " + d + "/mine --attention full" + kTiny);
    EXPECT_EQ(r.code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find("not replacing it"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(d + "/mine/" + name), "my notes") << name;
    fs::remove(d + "/mine/" + name);
  }
  // --overwrite over a run: the old checkpoint goes too, so a new run that fails at once names none
  const std::string old_run = copy_run("overwritten");
  const CliRun nan =
      run("train --data " + data + " --run " + old_run + " --overwrite --lr 1e300 --weight-decay 0 --attention full" +
          kTiny);
  EXPECT_EQ(nan.code, 1) << nan.err;
  EXPECT_EQ(nan.err.find("The last good checkpoint is"), std::string::npos) << nan.err;
}

TEST(CliAttack, AnOutputNeverGoesIntoTheDataItReads) {
  const std::string d = fresh_dir("into_data");
  fs::copy(trained_run() + "/data", d + "/data", fs::copy_options::recursive);
  const std::string run_dir = copy_run("into_data_run"), ckpt = run_dir + "/checkpoint.safetensors";
  const std::string test_file = d + "/data/basic_test.tsv", bytes = slurp(test_file);
  // with or without --overwrite, the refusal names the data folder (no --overwrite can allow it)
  for (const std::string overwrite : {" --overwrite", ""})
    for (const std::string& args :
         {"eval --checkpoint " + ckpt + " --data " + d + "/data --attention clustered --figure " + test_file + overwrite,
          "attention --checkpoint " + ckpt + " --data " + d + "/data --out " + test_file + overwrite,
          "train --data " + d + "/data --run " + d + "/r --attention full --trace " + test_file + overwrite + kTiny}) {
      const CliRun r = run(args);
      EXPECT_EQ(r.code, 2) << args << ": " << r.err;
      EXPECT_NE(r.err.find("inside the data folder"), std::string::npos) << args << ": " << r.err;
      EXPECT_EQ(r.err.find("--overwrite"), std::string::npos) << args << ": " << r.err;
      EXPECT_EQ(slurp(test_file), bytes) << args;
    }
  // train's --overwrite replaces its run, never another run's file through --trace
  const std::string other = copy_run("other_run") + "/summary.json", summary = slurp(other);
  const CliRun trace =
      run("train --data " + d + "/data --run " + d + "/r2 --attention full --overwrite --trace " + other + kTiny);
  EXPECT_EQ(trace.code, 2) << trace.err;
  EXPECT_EQ(slurp(other), summary);
}

TEST(CliAttack, MoreClustersThanTokensAreRefusedEverywhere) {
  const std::string ckpt = copy_run("clusters_eval") + "/checkpoint.safetensors";
  const CliRun eval = run("eval --checkpoint " + ckpt + " --attention clustered --clusters 65536 --eval-limit 4");
  EXPECT_EQ(eval.code, 2) << eval.err;
  EXPECT_NE(eval.err.find("--clusters 65536 is more than the"), std::string::npos) << eval.err;
  const CliRun bench = run("bench attention --lengths 64 --mechanisms clustered --clusters 100 --device cpu");
  EXPECT_EQ(bench.code, 2) << bench.err;
  // an option the benchmark does not read is refused, not ignored
  const CliRun unread = run("bench train --task listops-short --mechanisms clustered --clusters 8 --device cpu");
  EXPECT_EQ(unread.code, 2) << unread.err;
  const CliRun layer = run("layer --in " + std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors --out " +
                           fresh_dir("clusters_layer") + "/out.safetensors --attention clustered --clusters 4096");
  EXPECT_EQ(layer.code, 2) << layer.err;
  EXPECT_NE(layer.err.find("--clusters 4096 is more than the"), std::string::npos) << layer.err;
}

TEST(CliAttack, SettingsFilesAndFlagsSayWhatTheyRefuse) {
  const std::string d = fresh_dir("settings2"), data = trained_run() + "/data";
  put(d + "/nul.json", std::string("{\"steps\": 2}") + '\0' + "{\"lr\": -5");
  put(d + "/nul_value.json", R"({"task": "listops-short\u0000x"})");
  put(d + "/subnormal.json", R"({"lr": 1e-320})");
  put(d + "/subnormal_dropout.json", R"({"dropout": 4.9e-324})");  // a fraction too (tenth attack, K4)
  for (const char* file : {"nul.json", "nul_value.json", "subnormal.json", "subnormal_dropout.json"}) {
    const CliRun r = run("train --config " + d + "/" + file + " --data " + data + " --run " + d + "/r" + kTiny);
    EXPECT_NE(r.code, 0) << file;
    EXPECT_NE(r.err.find(file), std::string::npos) << file << ": " << r.err;
    EXPECT_FALSE(fs::exists(d + "/r/checkpoint.safetensors")) << file;
  }
  // a value that is an option: the value was forgotten
  const CliRun forgot = run("data listops-short --out --seed 3");
  EXPECT_EQ(forgot.code, 2) << forgot.err;
  EXPECT_FALSE(fs::exists("--seed"));
  // a --vary setting given as a flag too
  const CliRun twice = run("compare --task listops-short --steps 3 --vary steps=2,3 --out " + d + "/c");
  EXPECT_EQ(twice.code, 2) << twice.err;
  EXPECT_NE(twice.err.find("--vary steps"), std::string::npos) << twice.err;
  // the top-level usage to a full device
  EXPECT_EQ(std::system((std::string(CAST_BINARY) + " --help > /dev/full 2> /dev/null").c_str()) >> 8, 1);
  // a mis-cased optional tensor of cast layer
  TensorFile layer = read_safetensors(std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors");
  const Tensor& x = layer.tensors.at("x");
  layer.tensors["Mask"] = Tensor::full({x.dim(0), x.dim(1)}, 1.0, x.dtype());
  write_safetensors(d + "/mask.safetensors", layer.tensors, layer.metadata);
  const CliRun masked = run("layer --in " + d + "/mask.safetensors --out " + d + "/out.safetensors");
  EXPECT_EQ(masked.code, 1) << masked.err;
  EXPECT_NE(masked.err.find("did you mean 'mask'"), std::string::npos) << masked.err;
}

TEST(CliAttack, FiguresAreWellFormedAndWaitForTheirFolder) {
  const std::string run_dir = copy_run("figures");
  // a run folder named with a control byte: the SVG stays XML; a title in UTF-8 is kept
  const std::string odd = fs::path(run_dir).parent_path().string() + "/e\x01x";
  fs::copy(run_dir, odd, fs::copy_options::recursive);
  const CliRun titled = run("plot \"$(printf '" + fs::path(run_dir).parent_path().string() + "/e\\001x')\" --out " +
                            run_dir + "/../t.svg --title \"$(printf 'a\\342\\202\\254b')\"");
  ASSERT_EQ(titled.code, 0) << titled.err;
  const std::string svg = slurp(run_dir + "/../t.svg");
  for (unsigned char c : svg) EXPECT_FALSE(c < 0x20 && c != '\n' && c != '\t' && c != '\r') << int(c);
  EXPECT_NE(svg.find("a\xE2\x82\xAC"
                     "b"),
            std::string::npos);  // UTF-8 text kept as it is
  // a control character in an option's value is refused: it would break the messages that repeat it
  const CliRun control = run("plot " + run_dir + " --out " + run_dir + "/../t2.svg --title \"$(printf 'a\\033b')\"");
  EXPECT_EQ(control.code, 2) << control.err;
  EXPECT_NE(control.err.find("control character \\x1B"), std::string::npos) << control.err;
  const CliRun latin1 = run("plot " + run_dir + " --out " + run_dir + "/../t3.svg --title \"$(printf 'a\\377b')\"");
  EXPECT_EQ(latin1.code, 2) << latin1.err;
  EXPECT_NE(latin1.err.find("not UTF-8"), std::string::npos) << latin1.err;
  // a training holds the run folder: plot does not write into it meanwhile
  {
    files::FolderLock held(run_dir, "run folder");
    const std::string before = slurp(run_dir + "/curves.svg");
    const CliRun r = run("plot " + run_dir);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("in use by another cast process"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(run_dir + "/curves.svg"), before);
  }
}

TEST(CliAttack, DataTooSmallOrTheWrongSizeIsRefusedBeforeTraining) {
  const std::string d = fresh_dir("small_data");
  const CliRun tiny = run("data pathfinder --count 3 --out " + d + "/pf3");  // cast data makes no such set
  EXPECT_EQ(tiny.code, 2) << tiny.err;
  ASSERT_EQ(run("data pathfinder --count 10 --out " + d + "/pf3").code, 0);
  {  // a hand-cut set of 3 images: the reader says which split is empty
    std::istringstream meta(slurp(d + "/pf3/metadata/0.npy"));
    std::string kept, line;
    for (int i = 0; i < 3 && std::getline(meta, line); ++i) kept += line + "\n";
    put(d + "/pf3/metadata/0.npy", kept);
  }
  const CliRun empty = run("train --task pathfinder --data " + d + "/pf3 --run " + d + "/r1 --attention full" + kTiny);
  EXPECT_EQ(empty.code, 1) << empty.err;
  EXPECT_NE(empty.err.find("split has no examples"), std::string::npos) << empty.err;
  ASSERT_EQ(run("data pathfinder --count 20 --out " + d + "/pf20").code, 0);
  const CliRun wrong = run("train --task pathx --data " + d + "/pf20 --run " + d + "/r2 --attention full" + kTiny);
  EXPECT_EQ(wrong.code, 2) << wrong.err;
  EXPECT_NE(wrong.err.find("32 x 32"), std::string::npos) << wrong.err;
}

TEST(CliAttack, CheckpointsAndResumesAreReadStrictly) {
  // a checkpoint copied under another name into a folder without the run's own
  const std::string d = fresh_dir("renamed");
  fs::copy(copy_run("renamed_src") + "/checkpoint.safetensors", d + "/my.safetensors");
  const CliRun renamed = run("train --resume " + d + "/my.safetensors --steps 5 --device cpu");
  EXPECT_EQ(renamed.code, 2) << renamed.err;
  EXPECT_NE(renamed.err.find("holds no checkpoint.safetensors"), std::string::npos) << renamed.err;
  // a negative second moment
  const std::string run_dir = copy_run("negative_v"), ckpt = run_dir + "/checkpoint.safetensors";
  TensorFile f = read_safetensors(ckpt);
  for (auto& [name, t] : f.tensors)
    if (name.rfind("adam.v/", 0) == 0) {
      std::vector<double> v = t.to_double_vector();
      v[0] = -1.0;
      t = Tensor::from_vector<double>(v, t.shape()).to(t.dtype());
      break;
    }
  write_safetensors(ckpt, f.tensors, f.metadata);
  const CliRun negative = run("train --resume " + ckpt + " --steps 5 --device cpu");
  EXPECT_EQ(negative.code, 1) << negative.err;
  EXPECT_NE(negative.err.find("second moment is never negative"), std::string::npos) << negative.err;
}

// The third attack's defects (issue 41), one case each.
TEST(CliAttack, InputsNamedLikeATemporaryOrLockFileAreKept) {
  const std::string d = fresh_dir("tmp_inputs"), ckpt = copy_run("tmp_inputs_run") + "/checkpoint.safetensors";
  fs::copy(ckpt, d + "/e.svg.tmp");
  const CliRun eval =
      run("eval --checkpoint " + d + "/e.svg.tmp --attention clustered --eval-limit 4 --figure " + d + "/e.svg");
  EXPECT_EQ(eval.code, 0) << eval.err;
  EXPECT_EQ(slurp(d + "/e.svg.tmp"), slurp(ckpt));
  fs::create_directories(d + "/k");
  fs::copy(ckpt, d + "/k/.cast.lock");
  run("train --resume " + d + "/k/.cast.lock --steps 9 --device cpu");
  EXPECT_EQ(slurp(d + "/k/.cast.lock"), slurp(ckpt));
  // a best checkpoint without the run's own is no run's: not replaced
  fs::create_directories(d + "/ub");
  put(d + "/ub/best.safetensors", "mine");
  const CliRun best =
      run("train --data " + trained_run() + "/data --run " + d + "/ub --attention full --eval-every 1" + kTiny);
  EXPECT_EQ(best.code, 2) << best.err;
  EXPECT_EQ(slurp(d + "/ub/best.safetensors"), "mine");
}

TEST(CliAttack, SettingsFilesAreReadWhole) {
  const std::string d = fresh_dir("settings3"), data = trained_run() + "/data";
  put(d + "/task.json", R"({"task": "fashion-mnist-14", "steps": 1})");
  const CliRun task =
      run("train --config " + d + "/task.json --task listops-short --data " + data + " --run " + d + "/r1" + kTiny);
  EXPECT_EQ(task.code, 2) << task.err;
  EXPECT_NE(task.err.find("names task 'fashion-mnist-14'"), std::string::npos) << task.err;
  put(d + "/bel.json", R"({"run": "r/x\u0007y"})");
  const CliRun bel = run("train --config " + d + "/bel.json --data " + data + kTiny, d);
  EXPECT_EQ(bel.code, 2) << bel.err;
  EXPECT_FALSE(fs::exists(d + "/r"));
  const CliRun empty_trace = run("train --data " + data + " --run " + d + "/r2 --attention full --trace ''" + kTiny);
  EXPECT_EQ(empty_trace.code, 2) << empty_trace.err;
  put(d + "/bad.json", R"({"stepz": 3})");
  const CliRun resume =
      run("train --resume " + copy_run("settings3_run") + "/checkpoint.safetensors --config " + d + "/bad.json");
  EXPECT_EQ(resume.code, 2) << resume.err;
  EXPECT_NE(resume.err.find("bad.json"), std::string::npos) << resume.err;
  // a trace of ours is ours to replace
  ASSERT_EQ(run("train --data " + data + " --run " + d + "/t1 --attention full --trace " + d + "/t.jsonl" + kTiny).code,
            0);
  EXPECT_EQ(run("train --data " + data + " --run " + d + "/t2 --attention full --trace " + d + "/t.jsonl" + kTiny).code,
            0);
}

TEST(CliAttack, AComparisonRefusesWhatItCanTellBeforeItsFirstRun) {
  const std::string d = fresh_dir("compare3"), data = trained_run() + "/data";
  const CliRun clusters = run("compare --data " + data + " --attention cast --vary clusters=4,1000 --out " + d + "/c1" +
                              " --steps 1 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu");
  EXPECT_EQ(clusters.code, 2) << clusters.err;
  EXPECT_FALSE(fs::exists(d + "/c1/cast-seed1"));
  fs::copy(data, d + "/d-ls", fs::copy_options::recursive);
  fs::create_directories(d + "/d");
  fs::copy(data, d + "/d/ls", fs::copy_options::recursive);
  const CliRun same =
      run("compare --attention full --vary data=d/ls,d-ls --out c2 --steps 1 --batch 4 --dim 8 "
          "--heads 2 --mlp-dim 8 --layers 1 --device cpu",
          d);
  EXPECT_EQ(same.code, 2) << same.err;
  EXPECT_NE(same.err.find("would share the run folder"), std::string::npos) << same.err;
}

TEST(CliAttack, AnEmptyBatchOrATinySequenceIsHandled) {
  TensorFile layer = read_safetensors(std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors");
  const int64_t D = layer.tensors.at("x").dim(2);
  layer.tensors["x"] = Tensor::zeros({0, 4, D}, layer.tensors.at("x").dtype());
  layer.tensors["dout"] = Tensor::zeros({0, 4, D}, layer.tensors.at("x").dtype());
  layer.tensors.erase("mask");
  const std::string d = fresh_dir("empty_batch");
  write_safetensors(d + "/b0.safetensors", layer.tensors, layer.metadata);
  const CliRun r = run("layer --in " + d + "/b0.safetensors --out " + d + "/o.safetensors");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("at least one sequence"), std::string::npos) << r.err;
  // a run folder with no step yet: nothing to plot, said so
  fs::create_directories(d + "/no_steps");
  put(d + "/no_steps/metrics.jsonl", "");
  const CliRun empty_plot = run("plot " + d + "/no_steps --out " + d + "/e.svg");
  EXPECT_EQ(empty_plot.code, 1) << empty_plot.err;
  EXPECT_NE(empty_plot.err.find("holds no step yet"), std::string::npos) << empty_plot.err;
  EXPECT_FALSE(fs::exists(d + "/e.svg"));
  // the default cluster count of a 2-token sequence (CLS included) is 2, not 8
  EXPECT_EQ(nn::default_clusters(2), 2);
  EXPECT_EQ(nn::default_clusters(49), 8);
}

// The fourth attack's defects (issue 41), one case each.
TEST(CliAttack, LocksSeedsAndListsAreReadForWhatTheyMean) {
  const std::string d = fresh_dir("attack4"), data = trained_run() + "/data", run_dir = copy_run("attack4_run");
  // no output replaces a folder's lock file, --overwrite or not
  put(run_dir + "/.cast.lock", "12345");
  const CliRun lock = run("bench attention --device cpu --repeats 1 --warmup 0 --lengths 16 --mechanisms full --json " +
                          run_dir + "/.cast.lock --overwrite");
  EXPECT_EQ(lock.code, 2) << lock.err;
  EXPECT_EQ(slurp(run_dir + "/.cast.lock"), "12345");
  // a flag only another mechanism reads
  const CliRun other = run("train --data " + data + " --run " + d + "/r1 --attention full --clustering satopk" + kTiny);
  EXPECT_EQ(other.code, 2) << other.err;
  EXPECT_NE(other.err.find("--clustering is an option of --attention cast"), std::string::npos) << other.err;
  // one value listed twice under two spellings
  const CliRun twice =
      run("compare --data " + data + " --attention full --vary lr=0.001,1e-3 --out " + d + "/c" + kTiny);
  EXPECT_EQ(twice.code, 2) << twice.err;
  // the run's own seed on resume, and a trace that is a folder before any step
  const CliRun seed = run("train --resume " + run_dir + "/checkpoint.safetensors --steps 4 --seed 1");
  EXPECT_EQ(seed.code, 0) << seed.err;
  const CliRun folder = run("train --data " + data + " --run " + d + "/r2 --attention full --trace " + d + kTiny);
  EXPECT_EQ(folder.code, 2) << folder.err;
  EXPECT_FALSE(fs::exists(d + "/r2/metrics.jsonl"));
  // a log window larger than the run allocates only what the run's steps need
  const CliRun log =
      run("train --data " + data + " --run " + d + "/r3 --attention full --log-every 1099511627776" + kTiny);
  EXPECT_EQ(log.code, 0) << log.err;
  EXPECT_EQ(run("train --help=x").code, 2);
  // more OpenMP threads than a process may start: one line, not death by signal
  EXPECT_EQ(std::system(("OMP_NUM_THREADS=100000 " + std::string(CAST_BINARY) + " info > /dev/null 2>&1").c_str()) >> 8,
            2);
  // an OpenMP setting the runtime cannot read: cast's one line once, not the runtime's warning
  // twice and a run with other settings than asked (seventh attack)
  for (const char* env : {"OMP_NUM_THREADS=abc", "OMP_NUM_THREADS=0", "OMP_WAIT_POLICY=bogus", "GOMP_SPINCOUNT=lots",
                          "OMP_STACKSIZE=999999G", "OMP_STACKSIZE=1", "OPENBLAS_CORETYPE=bogus"}) {
    const std::string err = d + "/omp.err";
    const int status = std::system(fmt::format("{} {} info > /dev/null 2> {}", env, CAST_BINARY, err).c_str());
    EXPECT_EQ(status >> 8, 2) << env;
    const std::string text = slurp(err);
    EXPECT_NE(text.find(std::string("cast: error: ") + env + ": "), std::string::npos) << env << "\n" << text;
    size_t runtime_lines = 0;  // the runtime's warning (after a blank line of its own), at most once
    for (size_t at = text.find("libgomp:"); at != std::string::npos; at = text.find("libgomp:", at + 1)) ++runtime_lines;
    EXPECT_LE(runtime_lines, 1u) << env << "\n" << text;
  }
  // the runtime's warning about a variable cast does not read is printed once, not again by the
  // restarted process (ninth attack, J12), and the command runs
  for (const char* env : {"OMP_PROC_BIND=bogus", "OMP_DYNAMIC=maybe"}) {
    const std::string err = d + "/omp.err";
    const int status =
        std::system(fmt::format("env -u CAST_RUNTIME_SET {} {} info > /dev/null 2> {}", env, CAST_BINARY, err).c_str());
    EXPECT_EQ(status >> 8, 0) << env;
    const std::string text = slurp(err);
    size_t runtime_lines = 0;
    for (size_t at = text.find("libgomp:"); at != std::string::npos; at = text.find("libgomp:", at + 1)) ++runtime_lines;
    EXPECT_EQ(runtime_lines, 1u) << env << "\n" << text;
  }
}

// The fourth attack's leftovers (issue 41).
TEST(CliAttack, ASmallerPathfinderSetLeavesNoImageOfTheLargerOne) {
  const std::string d = fresh_dir("pf_stale");
  ASSERT_EQ(run("data pathfinder --count 17 --out " + d + "/pf").code, 0);
  ASSERT_TRUE(fs::exists(d + "/pf/imgs/0/sample_16.png"));
  fs::copy_file(d + "/pf/imgs/0/sample_0.png", d + "/pf/imgs/0/mine.png");  // not the set's: kept
  const CliRun again = run("data pathfinder --count 10 --overwrite --out " + d + "/pf");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(fs::exists(d + "/pf/imgs/0/sample_9.png"));
  for (int i = 10; i < 17; ++i) EXPECT_FALSE(fs::exists(d + "/pf/imgs/0/sample_" + std::to_string(i) + ".png")) << i;
  EXPECT_TRUE(fs::exists(d + "/pf/imgs/0/mine.png"));
}

// Resuming rewrites metrics.jsonl up to the checkpoint's step: a line in it that is not a record
// is refused (naming its line), not dropped; a last line cut short by a kill is left behind.
TEST(CliAttack, AResumeKeepsOrRefusesEveryMetricsLine) {
  const std::string run_dir = copy_run("metrics_garbage"), metrics = run_dir + "/metrics.jsonl";
  const std::string original = slurp(metrics);
  {
    std::ofstream f(metrics, std::ios::trunc);
    f << "my note about this run\n" << original;
  }
  const std::string with_note = slurp(metrics);
  const CliRun refused = run("train --resume " + run_dir + "/checkpoint.safetensors --steps 5 --device cpu");
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_NE(refused.err.find("line 1 is not JSON (a number such as NaN, or a line cut or edited), so it is no metrics "
                             "record"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(slurp(metrics), with_note);
  {
    std::ofstream f(metrics, std::ios::trunc);
    f << original << "{\"step\": 3, \"spl";  // killed mid-line
  }
  const CliRun resumed = run("train --resume " + run_dir + "/checkpoint.safetensors --steps 5 --device cpu");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(slurp(metrics).find("\"spl\n"), std::string::npos);
}

// The fifth attack's defects (issue 41), one case each.
TEST(CliAttack, AValueNestedTooDeepIsRefusedNotACrash) {
  const std::string d = fresh_dir("deep_json");
  {
    std::ofstream f(d + "/deep.json");
    f << "{\"steps\":" << std::string(70000, '[') << std::string(70000, ']') << "}";
  }
  const CliRun r = run("train --data " + trained_run() + "/data --run " + d + "/r --config " + d + "/deep.json" + kTiny);
  EXPECT_EQ(r.code, 2) << r.err;  // a settings file's mistake is a usage error
  EXPECT_NE(r.err.find("a value nested more than 32 levels deep"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
}

TEST(CliAttack, ADataSetCutShortIsRefusedAndItsTemporariesGo) {
  const std::string d = fresh_dir("unfinished"), pf = d + "/pf";
  ASSERT_EQ(run("data pathfinder --count 20 --out " + pf).code, 0);
  // as a signal or a full disk leaves it: the mark still there, a temporary image
  put(pf + "/" + data::kDataUnfinishedMark, "");
  put(pf + "/imgs/0/sample_3.png.tmp", "x");
  put(pf + "/imgs/0/sample_4.png.2.tmp", "x");
  put(pf + "/imgs/0/notes.tmp", "mine");
  const CliRun refused = run("train --task pathfinder --data " + pf + " --run " + d + "/r --attention full" + kTiny);
  EXPECT_EQ(refused.code, 1) << refused.err;
  EXPECT_NE(refused.err.find("did not finish"), std::string::npos) << refused.err;
  const CliRun again = run("data pathfinder --count 20 --out " + pf);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_FALSE(fs::exists(pf + "/" + data::kDataUnfinishedMark));
  EXPECT_FALSE(fs::exists(pf + "/imgs/0/sample_3.png.tmp"));
  EXPECT_FALSE(fs::exists(pf + "/imgs/0/sample_4.png.2.tmp"));
  EXPECT_EQ(slurp(pf + "/imgs/0/notes.tmp"), "mine");
}

TEST(CliAttack, OutputsNeverGoIntoTheDataAndFlagsNoMechanismReadsAreRefused) {
  const std::string d = fresh_dir("attack5"), data = trained_run() + "/data";
  const std::string layer_in = std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"train --data " + data + " --run " + data + kTiny, "run folder " + data + " is inside the data folder"},
           {"compare --data " + data + " --out " + data + " --attention full" + kTiny, "is the data set " + data + ", whose files only cast data writes"},
           {"compare --data " + data + " --out " + d + "/c --attention full,cast --topk 3" + kTiny,
            "--topk is an option of --attention iclustered, not of full, cast"},
           {"layer --in " + layer_in + " --out " + d + "/o.st --attention full --heads 2 --clusters 3",
            "--clusters is an option of --attention cast and clustered and iclustered, not of full"},
           {"layer --in " + layer_in + " --out " + d + "/o.st --attention full --heads 2 --seed 3",
            "--seed draws the LSH planes and k-means of --attention clustered and iclustered, not of full"},
           {"bench attention --device cpu --lengths 16 --dim 16 --heads 2 --mechanisms full --clusters 4",
            "--clusters is an option of --mechanisms cast-topk, cast-satopk and clustered and iclustered, not of full"},
           {"train --data " + data + " --run " + d + "/t --attention iclustered --topk 1000" + kTiny,
            "setting 'topk' is 1000: more than the"},
           {"train --data " + data + " --run " + d + "/w --weight-decay 1e3" + kTiny,
            "setting 'weight-decay' is 1000: with 'lr' "},
           {"train --data " + data + " --run " + d + "/n --lr 0x10" + kTiny, "--lr expects a number, got '0x10'"},
           {"train --data " + data + " --run " + d + "/n --lr inf" + kTiny, "--lr expects a number, got 'inf'"},
           {"train --data " + data + " --run " + d + "/n --batch ' 4' --steps 2 --device cpu",
            "--batch expects an integer, got ' 4'"},
           // a checkpoint or a flag the command cannot use is a usage error, as a wrong flag is
           {"clusters --checkpoint " + trained_run() + "/run/checkpoint.safetensors --out " + d + "/c.svg",
            "the model uses full attention; cast clusters draws the clusters of a CAST model"},
           {"layer --in " + layer_in + " --out " + d + "/o.st --attention full --heads 5", "--heads 5 must divide"},
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(data + "/checkpoint.safetensors"));
  // cast train's --overwrite replaces a run, not another file: its refusal does not offer it
  fs::copy_file(copy_run("attack5_trace") + "/checkpoint.safetensors", d + "/ck.safetensors");
  const CliRun trace = run("train --data " + data + " --run " + d + "/tr --trace " + d + "/ck.safetensors --overwrite" + kTiny);
  EXPECT_EQ(trace.code, 2) << trace.err;
  EXPECT_NE(trace.err.find("choose another path: --overwrite replaces a run, not another file"), std::string::npos)
      << trace.err;
}

// A run's own files are never another command's output, --overwrite or not (sixth attack): a
// layer output, a figure, bench rows or a trace named like a run's checkpoint, metrics, summary
// or curves once replaced them with exit 0.
TEST(CliAttack, NoOtherCommandReplacesARunsFiles) {
  const std::string run_dir = copy_run("held_run"), d = fresh_dir("held_out");
  ASSERT_TRUE(fs::exists(run_dir + "/.cast.lock"));
  const std::string layer_in = std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors";
  const std::string ckpt = run_dir + "/checkpoint.safetensors", other = d + "/ck.safetensors";
  fs::copy_file(ckpt, other);
  std::map<std::string, std::string> before;
  for (const auto& entry : fs::directory_iterator(run_dir)) before[entry.path().string()] = slurp(entry.path().string());
  for (const std::string& args : {
           "layer --in " + layer_in + " --out " + ckpt + " --attention full --heads 2 --overwrite",
           "eval --checkpoint " + other + " --attention clustered --clusters 2 --figure " + run_dir +
               "/best.safetensors --overwrite",
           "eval --checkpoint " + other + " --attention clustered --clusters 2 --figure " + run_dir + "/curves.svg",
           "attention --checkpoint " + other + " --out " + run_dir + "/metrics.jsonl --overwrite",
           "bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --json " + run_dir +
               "/metrics.jsonl --overwrite",
           "bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full --trace " + run_dir +
               "/summary.json --overwrite",
           "plot " + run_dir + " --out " + run_dir + "/results.md --overwrite",
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("a folder cast holds for a run, a comparison or a data set"), std::string::npos)
        << args << "\n" << r.err;
    for (const auto& [path, bytes] : before) EXPECT_EQ(slurp(path), bytes) << args << ": " << path << " changed";
  }
  // the run's own figure is still redrawn by cast plot
  const CliRun plot = run("plot " + run_dir);
  EXPECT_EQ(plot.code, 0) << plot.err;
}

// A comparison whose variants could not differ is refused (sixth attack): --vary of a setting the
// mechanism never reads, and an empty 'attention' in --config, once trained and tabled anyway.
TEST(CliAttack, AComparisonOfVariantsThatCannotDifferIsRefused) {
  const std::string d = fresh_dir("vary_unread"), data = trained_run() + "/data";
  put(d + "/empty.json", "{\"attention\": \"\"}");
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"compare --data " + data + " --out " + d + "/a --attention full --vary clustering=topk,satopk" + kTiny,
            "--vary clustering: --clustering is an option of --attention cast, not of full"},
           {"compare --data " + data + " --out " + d + "/b --attention cast --vary bits=4,8" + kTiny,
            "--vary bits: --bits is an option of --attention clustered and iclustered, not of cast"},
           {"compare --data " + data + " --out " + d + "/c --config " + d + "/empty.json" + kTiny,
            "empty.json: setting 'attention' is empty"},
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_FALSE(fs::exists(d + "/a") || fs::exists(d + "/b") || fs::exists(d + "/c")) << args;
  }
}

// Refusals the sixth attack found missing or unclear: each a usage error that names the setting.
TEST(CliAttack, ListsCountsAndHintsAreCheckedForWhatTheyMean) {
  const std::string d = fresh_dir("attack6"), ckpt = copy_run("attack6_run") + "/checkpoint.safetensors";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"bench attention --lengths 8 --repeats 1 --warmup 0 --mechanisms full,full --device cpu",
            "--mechanisms: 'full' is listed twice"},
           {"data pathfinder --count 3 --out " + d + "/pf", "--count 3: a pathfinder set is split 80/10/10"},
           {"eval --checkpoint " + ckpt + " --eval-limit 2 --overwrite",
            "--overwrite replaces an existing --figure, and none is given"},
           {"eval --checkpoint " + ckpt + " --eval-limit 2 --attention clustered --clusters 0,0",
            "--clusters: '0' is listed twice"},
           {"data listops-short --max-length 2 --min-length 1 --out " + d + "/l",
            "give --min-length at least 1 and --max-length at least 2 above it"},
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(d + "/pf/metadata"));
  // missing ListOps files: the hint names the command that makes this folder's task
  fs::create_directories(d + "/empty");
  const CliRun missing = run("train --task listops-short --data " + d + "/empty --steps 1 --device cpu --eval-limit 2");
  EXPECT_EQ(missing.code, 1) << missing.err;
  EXPECT_NE(missing.err.find("`cast data listops-short --out " + d + "/empty`"), std::string::npos) << missing.err;
}

// Hand-edited checkpoint metadata is named, not described in the JSON library's words; a data
// folder that is a link to nowhere is called that (sixth attack).
TEST(CliAttack, EditedMetadataAndDanglingFoldersAreNamed) {
  const std::string run_dir = copy_run("edited_meta"), ckpt = run_dir + "/checkpoint.safetensors";
  const TensorFile original = read_safetensors(ckpt);
  for (const auto& [train_json, message] : std::vector<std::pair<std::string, std::string>>{
           {"[1,2]", "'train' metadata is array, not a JSON object of settings"},
           {"{\"task\": 5}", "'train' metadata: 'task' is missing or not a string"}}) {
    std::map<std::string, std::string> meta = original.metadata;
    meta["train"] = train_json;
    write_safetensors(ckpt, original.tensors, meta);
    const CliRun r = run("eval --checkpoint " + ckpt + " --eval-limit 2");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  const std::string d = fresh_dir("dangling_data");
  fs::create_symlink(d + "/nowhere", d + "/link");
  const CliRun dangling = run("data listops-short --count 10 --out " + d + "/link");
  EXPECT_EQ(dangling.code, 2) << dangling.err;
  EXPECT_NE(dangling.err.find("a symbolic link to " + d + "/nowhere, which does not exist"), std::string::npos)
      << dangling.err;
  EXPECT_FALSE(fs::exists(d + "/nowhere"));
}

// CAST's weights in a layer file read under another mechanism are named as unread (sixth attack).
TEST(CliAttack, ALayerFileWithCastWeightsUnderAnotherMechanismSaysTheyAreUnread) {
  const std::string d = fresh_dir("layer_unread");
  const CliRun r = run("layer --in " + std::string(CAST_TEST_DATA_DIR) + "/layer_cast.safetensors --out " + d +
                       "/o.safetensors --attention full --heads 2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("'surrogates' (read by --attention cast)"), std::string::npos) << r.out;
}

// Advice that works (sixth attack): a compare run's foreign file is not answered with an
// --overwrite compare cannot pass on; --overwrite leaves no foreign best checkpoint beside a new
// run; the missing-GPU line of eval advises the CPU (eval computes a GPU run's checkpoint in fp32
// there by itself), not what a resume would need.
TEST(CliAttack, AdviceOnForeignRunFilesAndMissingGpusWorks) {
  const std::string d = fresh_dir("advice"), data = trained_run() + "/data";
  fs::create_directories(d + "/cmp/full-seed1");
  put(d + "/cmp/full-seed1/metrics.jsonl", "my metrics\n");
  const CliRun compare = run("compare --data " + data + " --out " + d + "/cmp --attention full" + kTiny);
  EXPECT_EQ(compare.code, 2) << compare.err;
  EXPECT_NE(compare.err.find("move it away or choose another folder"), std::string::npos) << compare.err;
  EXPECT_EQ(slurp(d + "/cmp/full-seed1/metrics.jsonl"), "my metrics\n");
  fs::create_directories(d + "/r");
  put(d + "/r/best.safetensors", "not a run's\n");
  const CliRun train = run("train --data " + data + " --run " + d + "/r --overwrite --attention full" + kTiny);
  EXPECT_EQ(train.code, 0) << train.err;
  if (fs::exists(d + "/r/best.safetensors")) EXPECT_NE(slurp(d + "/r/best.safetensors"), "not a run's\n");
  if (!cast::device_memory::cuda_available()) {
    const CliRun gpu = run("eval --checkpoint " + d + "/r/checkpoint.safetensors --device cuda --eval-limit 2");
    EXPECT_EQ(gpu.code, 1) << gpu.err;
    EXPECT_NE(gpu.err.find("pass --device cpu"), std::string::npos) << gpu.err;
    EXPECT_EQ(gpu.err.find("resumed"), std::string::npos) << gpu.err;  // eval resumes nothing
  }
}

// The seventh attack: the rule of held folders applies to the file written, not to the name given
// (a link straight to a run's or a data set's file), and at any depth of a data set (a Pathfinder
// set's images and metadata sit in subfolders).
TEST(CliAttack, OutputsThroughLinksOrDeepInADataSetAreRefused) {
  const std::string run_dir = copy_run("linked_run"), d = fresh_dir("linked_out"), data = trained_run() + "/data";
  const std::string source = copy_run("linked_source");  // the run the figures are drawn from
  ASSERT_EQ(run("data pathfinder --count 10 --out " + d + "/pf").code, 0);
  fs::create_symlink(run_dir + "/curves.svg", d + "/to_curves.svg");
  fs::create_symlink(run_dir + "/checkpoint.safetensors", d + "/to_checkpoint.safetensors");
  fs::create_symlink(data + "/basic_test.tsv", d + "/to_data.tsv");
  std::map<std::string, std::string> before;
  for (const std::string& folder : {run_dir, data, d + "/pf/metadata", d + "/pf/imgs/0"})
    for (const auto& entry : fs::directory_iterator(folder)) before[entry.path().string()] = slurp(entry.path().string());
  const std::string layer_in = std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors";
  for (const std::string& args : {
           "plot " + source + " --out " + d + "/to_curves.svg",
           "layer --in " + layer_in + " --out " + d + "/to_checkpoint.safetensors --attention full --heads 2 --overwrite",
           "plot " + source + " --out " + d + "/to_data.tsv --overwrite",
           "plot " + source + " --out " + d + "/pf/metadata/1.npy",
           "plot " + source + " --out " + d + "/pf/metadata/0.npy --overwrite",
           "plot " + source + " --out " + d + "/pf/imgs/0/sample_1.png --overwrite",
           "plot " + source + " --out " + d + "/pf/imgs/0/new.svg",
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("a folder cast holds for a run, a comparison or a data set"), std::string::npos)
        << args << "\n" << r.err;
    for (const auto& [path, bytes] : before) EXPECT_TRUE(slurp(path) == bytes) << args << ": " << path << " changed";
    EXPECT_FALSE(fs::exists(d + "/pf/metadata/1.npy") || fs::exists(d + "/pf/imgs/0/new.svg")) << args;
  }
}

// The seventh attack: a comparison inside the data it reads is refused before anything is made
// there; a comparison folder is no run folder; cast data over a hand-made Pathfinder set leaves
// none of its metadata, which the readers would take as part of the new set.
TEST(CliAttack, ComparisonsAndPathfinderSetsKeepTheirOwnFolders) {
  const std::string d = fresh_dir("own_folders"), data = d + "/data";
  fs::copy(trained_run() + "/data", data, fs::copy_options::recursive);
  const CliRun inside = run("compare --data " + data + " --out " + data + "/cmp --attention full" + kTiny);
  EXPECT_EQ(inside.code, 2) << inside.err;
  EXPECT_NE(inside.err.find("is inside the data set " + data + ", whose files only cast data writes: choose another "
                            "--out"),
            std::string::npos)
      << inside.err;
  EXPECT_FALSE(fs::exists(data + "/cmp"));
  ASSERT_EQ(run("compare --data " + data + " --out " + d + "/cmp --attention full" + kTiny).code, 0);
  const CliRun as_run = run("train --data " + data + " --run " + d + "/cmp --attention full" + kTiny);
  EXPECT_EQ(as_run.code, 2) << as_run.err;
  EXPECT_NE(as_run.err.find("is a comparison folder"), std::string::npos) << as_run.err;
  EXPECT_FALSE(fs::exists(d + "/cmp/checkpoint.safetensors"));
  // a hand-made set: one image, listed in metadata/7.npy
  ASSERT_EQ(run("data pathfinder --count 10 --out " + d + "/made").code, 0);
  fs::create_directories(d + "/pf/imgs/old");
  fs::create_directories(d + "/pf/metadata");
  fs::copy_file(d + "/made/imgs/0/sample_0.png", d + "/pf/imgs/old/a.png");
  put(d + "/pf/metadata/7.npy", "imgs/old a.png 0 1\n");
  const CliRun over = run("data pathfinder --count 10 --out " + d + "/pf --overwrite");
  EXPECT_EQ(over.code, 0) << over.err;
  EXPECT_TRUE(fs::exists(d + "/pf/metadata/0.npy"));
  EXPECT_FALSE(fs::exists(d + "/pf/metadata/7.npy"));
  // a set of another kind in a set's folder would lie beside its files, --overwrite or not
  const CliRun mixed = run("data listops-short --count 40 --out " + d + "/made --overwrite");
  EXPECT_EQ(mixed.code, 2) << mixed.err;
  EXPECT_NE(mixed.err.find("holds a Pathfinder set made by cast data; a ListOps set there"), std::string::npos)
      << mixed.err;
  EXPECT_FALSE(fs::exists(d + "/made/basic_train.tsv"));
  // a ListOps model pointed at a Pathfinder set is told so, not to generate ListOps there
  const CliRun eval = run("eval --checkpoint " + trained_run() + "/run/checkpoint.safetensors --data " + d + "/made");
  EXPECT_EQ(eval.code, 1) << eval.err;
  EXPECT_NE(eval.err.find("holds a Pathfinder set made by cast data, not ListOps"), std::string::npos) << eval.err;
}

// A schedule that never reaches --lr, or one step at the cosine schedule's end (learning rate 0),
// is noted rather than run silently (seventh attack).
TEST(CliAttack, SchedulesThatNeverReachTheirRateAreNoted) {
  const std::string d = fresh_dir("schedules"), data = trained_run() + "/data";
  const CliRun one = run("train --data " + data + " --run " + d + "/one --attention full --steps 1 --warmup 0 --batch 4"
                         " --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu --eval-limit 4");
  EXPECT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("note: the cosine schedule reaches 0 at the last step"), std::string::npos) << one.out;
  const CliRun warm = run("train --data " + data + " --run " + d + "/warm --attention full --warmup 5 --eval-limit 4" +
                          kTiny);
  EXPECT_EQ(warm.code, 0) << warm.err;
  EXPECT_NE(warm.out.find("note: --warmup 5 is above --steps 2"), std::string::npos) << warm.out;
}

// A checkpoint keeps the fingerprint of the set it trained on: evaluating or resuming it on
// another set (its folder regenerated since, or a relative --data read from another working
// folder) is said (sixth attack: the data folder was read relative to wherever the command ran).
TEST(CliAttack, ACheckpointReadWithAnotherSetSaysSo) {
  const std::string d = fresh_dir("other_set");
  ASSERT_EQ(run("data listops-short --count 60 --out " + d + "/data").code, 0);
  ASSERT_EQ(run("train --data " + d + "/data --run " + d + "/r --attention full --eval-limit 4" + kTiny).code, 0);
  const std::string ckpt = d + "/r/checkpoint.safetensors";
  const CliRun same = run("eval --checkpoint " + ckpt + " --eval-limit 4");
  EXPECT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(same.out.find("note: data folder"), std::string::npos) << same.out;
  // another set under the run's data: refused unless said (the run would find other examples)
  const CliRun refused = run("data listops-short --count 80 --out " + d + "/data");
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("holds a ListOps set cast data made with other settings (60 training"), std::string::npos)
      << refused.err;
  ASSERT_EQ(run("data listops-short --count 80 --overwrite --out " + d + "/data").code, 0);
  for (const std::string& args : {"eval --checkpoint " + ckpt + " --eval-limit 4",
                                  "train --resume " + ckpt + " --steps 3"}) {
    const CliRun other = run(args);
    EXPECT_EQ(other.code, 0) << args << "\n" << other.err;
    EXPECT_NE(other.out.find("note: data folder " + d + "/data holds another set than the run trained on (train 60 "),
              std::string::npos)
        << args << "\n" << other.out;
  }
}

// cast data's refusals advise the command that was given, with --overwrite, and that advice works
// (twenty-third attack: "cast data --out X --overwrite" had no task, and was refused again).
TEST(CliAttack, CastDataAdvisesItsOwnCommandWithOverwrite) {
  const std::string d = fresh_dir("data_advice");
  fs::create_directories(d + "/X");
  put(d + "/X/notes.txt", "mine\n");
  const std::string command = "data listops-short --count 40 --out " + d + "/X";
  const CliRun refused = run(command);
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("holds files that cast did not generate; not writing into it (`cast " + command +
                             " --overwrite` replaces them"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(run(command + " --overwrite").code, 0);
  // a split gone: the advice is the command that made the set (its mark keeps it), and it works
  fs::remove(d + "/X/basic_val.tsv");
  const CliRun missing = run("train --task listops-short --data " + d + "/X --run " + d + "/r" + kTiny);
  const std::string again = "cast data listops-short --count 40 --out " + d + "/X --overwrite";
  EXPECT_NE(missing.err.find("generate it again with `" + again + "`"), std::string::npos) << missing.err;
  EXPECT_EQ(run(again.substr(5)).code, 0);
  EXPECT_TRUE(fs::exists(d + "/X/basic_val.tsv"));
  const CliRun other = run("data listops-short --count 50 --out " + d + "/X");
  EXPECT_NE(other.err.find("(`cast data listops-short --count 50 --out " + d + "/X --overwrite` replaces it)"),
            std::string::npos)
      << other.err;
  const CliRun none = run("data --out " + d + "/X --overwrite");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("no task given: cast data <task> [options]"), std::string::npos) << none.err;
}

// The eighth attack: runs, comparisons and data sets keep to their own folders, and a comparison
// refuses what its later runs would refuse before its first run trains.
TEST(CliAttack, RunsComparisonsAndDataSetsKeepToTheirOwnFolders) {
  const std::string d = fresh_dir("own_kinds"), data = trained_run() + "/data", run_dir = copy_run("own_kinds_run");
  ASSERT_EQ(run("data pathfinder --count 10 --out " + d + "/pf").code, 0);
  fs::create_directories(d + "/hand");
  put(d + "/hand/basic_train.tsv", "mine\n");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"plot " + run_dir + " --out " + d + "/hand/.made-by-cast", "is the name of a data set's mark"},
           {"compare --data " + data + " --out " + run_dir + " --attention full" + kTiny, "holds a run"},
           {"train --data " + data + " --run " + d + "/pf/imgs --attention full" + kTiny, "is inside the data set"},
           {"data listops-short --count 40 --out " + run_dir + " --overwrite", "holds a run's or a comparison's files"},
           {"train --data " + data + " --run " + d + "/fifo --attention full" + kTiny, "is a FIFO (named pipe), not a folder"},
           {"compare --data " + data + " --out " + d + "/cmp --attention full --vary precision=fp32,bf16" + kTiny,
            "the CPU computes in fp32 only"},
           {"compare --data " + data + " --out " + d + "/cmp --attention full --vary eval-best=false,true" + kTiny,
            "setting 'eval-best' needs 'eval-every' above 0"},
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(d + "/hand/.made-by-cast"));
  EXPECT_FALSE(fs::exists(d + "/cmp"));  // refused before the comparison's folder was made
  EXPECT_FALSE(fs::exists(run_dir + "/results.md") || fs::exists(run_dir + "/basic_train.tsv"));
  // a foreign file in a later run's folder: refused before the first run trains
  fs::create_directories(d + "/cmp2/cast-seed1");
  put(d + "/cmp2/cast-seed1/metrics.jsonl", "my metrics\n");
  const CliRun late = run("compare --data " + data + " --out " + d + "/cmp2 --attention full,cast" + kTiny);
  EXPECT_EQ(late.code, 2) << late.err;
  EXPECT_FALSE(fs::exists(d + "/cmp2/full-seed1")) << "a run trained before the refusal";
  EXPECT_EQ(slurp(d + "/cmp2/cast-seed1/metrics.jsonl"), "my metrics\n");
}

// --trace's lines to a standard output that fails mid-step: the last whole step's checkpoint is
// written and the resume said, as a failed progress line does (eighth attack: nothing was saved).
TEST(CliAttack, ATraceToAFullStandardOutputSavesTheLastStep) {
  const std::string d = fresh_dir("trace_full");
  const std::string err = d + "/err";
  const int status = std::system(fmt::format("{} train --data {}/data --run {}/r --attention full --trace{} > /dev/full "
                                             "2> {}",
                                             CAST_BINARY, trained_run(), d, kTiny, err)
                                     .c_str());
  EXPECT_EQ(status >> 8, 1) << slurp(err);
  EXPECT_NE(slurp(err).find("checkpoint " + d + "/r/checkpoint.safetensors written at step 0; resume with"),
            std::string::npos)
      << slurp(err);
  EXPECT_EQ(run("train --resume " + d + "/r/checkpoint.safetensors").code, 0);
}

// Lists and flags read for what they mean (eighth attack): one folder under two spellings in
// --vary data, cast train's flags that are no run settings in --vary, two tables asked of info.
TEST(CliAttack, VaryAndInfoAreReadForWhatTheyMean) {
  const std::string d = fresh_dir("vary_paths"), data = trained_run() + "/data";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"compare --out " + d + "/c --attention full --vary data=" + data + "," + data + "/." + kTiny,
            "is the value of 'data=" + data + "' again"},
           {"compare --data " + data + " --out " + d + "/c --attention full --vary task=listops,text" + kTiny,
            "--vary task: a comparison is of one task"},
           {"info --kernels --fast-paths", "--fast-paths and --kernels print different tables"},
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(d + "/c"));
}

// An evaluation across cluster counts shows full attention once, with no count: it reads none
// (eighth attack: a row per count, each with a count full attention never used).
TEST(CliAttack, AnEvaluationSweepShowsFullAttentionOnce) {
  const CliRun r = run("eval --checkpoint " + trained_run() + "/run/checkpoint.safetensors --attention full,clustered "
                       "--clusters 2,4 --eval-limit 4");
  EXPECT_EQ(r.code, 0) << r.err;
  size_t full_rows = 0;
  for (size_t at = r.out.find("\n| full |"); at != std::string::npos; at = r.out.find("\n| full |", at + 1)) ++full_rows;
  EXPECT_EQ(full_rows, 1u) << r.out;
  EXPECT_NE(r.out.find("\n| full |  |  |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n| clustered | 4 |"), std::string::npos) << r.out;
}

// A refused run prints no settings line (its values were never used), and a data set missing
// from a folder is advised into a folder cast data may write: a run's folder, or one holding
// files cast data did not make, gets the command with a folder of its own.
TEST(CliAttack, ARefusedRunPrintsNoSettingsLineAndTheDataHintNamesAWritableFolder) {
  const std::string run_dir = copy_run("hint_run");
  const std::string tiny = " --steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu";
  CliRun r = run("train --data " + run_dir + " --run " + fresh_dir("hint_out") + "/r" + tiny);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(run_dir + " holds a run's or a comparison's files, where cast data writes nothing: generate "
                                 "the data with `cast data listops-short --out FOLDER`"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("cast train: task"), std::string::npos) << r.out;
  const std::string hand = fresh_dir("hint_hand");
  put(hand + "/notes.txt", "mine\n");
  r = run("train --data " + hand + " --run " + fresh_dir("hint_out2") + "/r" + tiny);
  EXPECT_NE(r.err.find(hand + " holds files cast data did not make: generate the data with"), std::string::npos)
      << r.err;
  r = run("train --task pathfinder --data " + run_dir + " --run " + fresh_dir("hint_out3") + "/r" + tiny);
  EXPECT_NE(r.err.find("it has no metadata folder (" + run_dir + " holds a run's or a comparison's files"),
            std::string::npos)
      << r.err;
  // where cast data may write, the hint names the folder itself; a run that starts prints its line
  const std::string empty = fresh_dir("hint_empty");
  r = run("train --data " + empty + " --run " + fresh_dir("hint_out4") + "/r" + tiny);
  EXPECT_NE(r.err.find("generate it with `cast data listops-short --out " + empty + "`"), std::string::npos) << r.err;
  r = run("train --data " + trained_run() + "/data --run " + fresh_dir("hint_out5") + "/r" + tiny + " --recompute");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("cast train: task listops-short, attention cast"), 0u) << r.out;
  EXPECT_NE(r.out.find("each block recomputed in its backward"), std::string::npos) << r.out;
}

// A comparison folder that is a file, a FIFO or a dangling link is a usage error naming what it
// is, as a run folder is (ninth attack, J10: exit 1 and a message about results.md in it).
TEST(CliAttack, ACompareFolderThatIsNoFolderIsAUsageError) {
  const std::string d = fresh_dir("cmp_not_folder");
  put(d + "/afile", "mine\n");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  fs::create_symlink(d + "/nowhere", d + "/dangling");
  const std::string tiny = " --steps 2 --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu --attention full";
  for (const auto& [name, says] : std::vector<std::pair<std::string, std::string>>{
           {"afile", "is a file, not a folder"}, {"fifo", "is a FIFO (named pipe), not a folder"}, {"dangling", "a symbolic link to"}}) {
    const CliRun r = run("compare --data " + trained_run() + "/data --out " + d + "/" + name + tiny);
    EXPECT_EQ(r.code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find("comparison folder " + d + "/" + name + ": " + says), std::string::npos) << r.err;
  }
  EXPECT_EQ(slurp(d + "/afile"), "mine\n");
  // an input of the wrong kind: exit 2 whichever option names it (tenth attack, K10)
  fs::create_symlink(d + "/loop", d + "/loop");
  for (const std::string& args : {"eval --checkpoint " + d + "/fifo", "layer --in " + d + "/fifo --out " + d + "/o.st",
                                  "train --resume " + d + "/fifo", "eval --checkpoint " + d + "/loop",
                                  "train --config " + d + "/fifo"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
  }
}

// --changes counts test images: its bound is said as that count, not as a range that reads like
// a fraction ("[0, 1]" on a set of one test image, nineteenth attack).
TEST(CliAttack, TheChangesBoundIsSaidAsTheTestImages) {
  const std::string d = fresh_dir("changes_bound");
  ASSERT_EQ(run("data pathfinder --count 10 --out " + d + "/pf").code, 0);
  const CliRun trained = run("train --task pathfinder --data " + d + "/pf --run " + d + "/r --eval-limit 2" + kTiny);
  ASSERT_EQ(trained.code, 0) << trained.err;
  const CliRun r = run("clusters --checkpoint " + d + "/r/checkpoint.safetensors --out " + d + "/c.svg --changes 50");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--changes 50 is more than the"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("test examples to compare (0 turns it off)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d + "/c.svg"));
}

// A finished cosine run resumed for more steps jumps from learning rate 0 back up the new
// schedule: said, since its curves and summary.json show the new schedule alone (nineteenth
// attack). A constant schedule does not depend on the run's length: nothing to say.
TEST(CliAttack, AResumeThatChangesTheScheduleSaysSo) {
  const std::string d = fresh_dir("longer_schedule"), data = trained_run() + "/data";
  const std::string tiny = " --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu --eval-limit 4 --warmup 1";
  ASSERT_EQ(run("train --data " + data + " --run " + d + "/cos --steps 4" + tiny).code, 0);
  const CliRun longer = run("train --resume " + d + "/cos/checkpoint.safetensors --steps 8");
  EXPECT_EQ(longer.code, 0) << longer.err;
  EXPECT_NE(longer.out.find("note: the cosine schedule now spans 8 steps, not the checkpoint's 4: the learning rate at "
                            "step 4 is"),
            std::string::npos)
      << longer.out;
  EXPECT_NE(longer.out.find("under it, 0 under the old one"), std::string::npos) << longer.out;
  // a resume refused (into another run's folder) says nothing of a schedule it never runs
  ASSERT_EQ(run("train --data " + data + " --run " + d + "/taken --steps 4" + tiny).code, 0);
  const CliRun into_other = run("train --resume " + d + "/cos/checkpoint.safetensors --steps 12 --run " + d + "/taken");
  EXPECT_EQ(into_other.code, 2) << into_other.err;
  EXPECT_EQ(into_other.out.find("schedule now spans"), std::string::npos) << into_other.out;
  ASSERT_EQ(run("train --data " + data + " --run " + d + "/flat --steps 4 --schedule constant" + tiny).code, 0);
  const CliRun flat = run("train --resume " + d + "/flat/checkpoint.safetensors --steps 8");
  EXPECT_EQ(flat.code, 0) << flat.err;
  EXPECT_EQ(flat.out.find("schedule now spans"), std::string::npos) << flat.out;
}

// Temporary files a killed write left in a run folder are said with their size when the run is
// next taken up (nineteenth attack: 141 MB of them stayed through resumes and --overwrite without
// a word); they are the user's to delete, since a file of such a name may be their own.
TEST(CliAttack, TemporariesAKilledWriteLeftAreSaid) {
  const std::string d = fresh_dir("left_temporaries"), data = trained_run() + "/data";
  ASSERT_EQ(run("train --data " + data + " --run " + d + "/r --eval-limit 4" + kTiny).code, 0);
  put(d + "/r/checkpoint.safetensors.tmp", std::string(1000, 'x'));
  put(d + "/r/best.safetensors.3.tmp", "partial");
  put(d + "/r/notes.tmp", "mine");                // no run file's temporary
  put(d + "/r/metrics.jsonl.x.tmp", "mine too");  // nor this
  const CliRun again = run("train --resume " + d + "/r/checkpoint.safetensors --steps 3");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("holds best.safetensors.3.tmp (7 B), checkpoint.safetensors.tmp (1000 B), left by a write "
                           "that was cut short"),
            std::string::npos)
      << again.out;
  EXPECT_EQ(again.out.find("notes.tmp"), std::string::npos) << again.out;
  EXPECT_EQ(again.out.find("metrics.jsonl.x.tmp"), std::string::npos) << again.out;
  EXPECT_EQ(slurp(d + "/r/checkpoint.safetensors.tmp"), std::string(1000, 'x'));
}

// A cast layer input of one sequence of 4 tokens of width 4 for 2 heads, with `assignment`.
static std::map<std::string, Tensor> clustered_layer_inputs(const Tensor& assignment) {
  return {{"x", Tensor::uniform({1, 4, 4}, 1, 0)}, {"dout", Tensor::uniform({1, 4, 4}, 2, 0)},
          {"wq", Tensor::uniform({4, 4}, 3, 0)},   {"wk", Tensor::uniform({4, 4}, 4, 0)},
          {"wv", Tensor::uniform({4, 4}, 5, 0)},   {"wo", Tensor::uniform({4, 4}, 6, 0)},
          {"assignment", assignment}};
}

// An assignment of -1 (a padding token's) for real tokens gives them zero outputs: said, naming
// how many, where a file of all -1 ran silently (twentieth attack). Padding given -1 is no news.
TEST(CliAttack, RealTokensInNoClusterAreNoted) {
  const std::string d = fresh_dir("no_cluster");
  std::map<std::string, Tensor> t = clustered_layer_inputs(Tensor::full({1, 2, 4}, -1, DType::i32));
  write_safetensors(d + "/none.safetensors", t);
  const std::string options = " --attention clustered --heads 2 --clusters 3";
  const CliRun none = run("layer --in " + d + "/none.safetensors --out " + d + "/o1.safetensors" + options);
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_NE(none.out.find("tensor 'assignment' puts 4 of the 4 real tokens (mask 1, as no mask is given) in no "
                          "cluster (-1)"),
            std::string::npos)
      << none.out;
  // the last token padding: its -1 is said by no note
  t["mask"] = Tensor::from_vector(std::vector<float>{1, 1, 1, 0}, {1, 4});
  std::vector<int32_t> ids = {0, 1, 2, -1, 0, 1, 2, -1};
  Tensor assignment = Tensor::zeros({1, 2, 4}, DType::i32);
  std::copy(ids.begin(), ids.end(), assignment.data<int32_t>());
  t["assignment"] = assignment;
  write_safetensors(d + "/padded.safetensors", t);
  const CliRun padded = run("layer --in " + d + "/padded.safetensors --out " + d + "/o2.safetensors" + options);
  EXPECT_EQ(padded.code, 0) << padded.err;
  EXPECT_EQ(padded.out.find("no cluster"), std::string::npos) << padded.out;
}

// A cluster id beyond what the tokens can fill, with no --clusters, is said with the file and the
// tensor, as it is with --clusters (twenty-first attack: "attention: assignment names cluster 99").
TEST(CliAttack, AnAssignmentBeyondTheTokensNamesTheFile) {
  const std::string d = fresh_dir("assignment_bound");
  Tensor assignment = Tensor::zeros({1, 2, 4}, DType::i32);
  assignment.data<int32_t>()[3] = 99;
  write_safetensors(d + "/far.safetensors", clustered_layer_inputs(assignment));
  const CliRun r = run("layer --in " + d + "/far.safetensors --out " + d + "/o.safetensors --attention clustered "
                       "--heads 2");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(d + "/far.safetensors: tensor 'assignment' holds 99: ids are -1 (no cluster) or 0 to 3 (its 4 "
                           "tokens fill at most 4 clusters)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(d + "/o.safetensors"));
}

// The twenty-fifth attack's resumes, one case each: a finished run's summary.json edited by hand
// is kept (the resume is refused); a metrics line the run's figure would refuse at its end is
// refused before any step (it left a finished run without its summary); and the advice after a
// failed checkpoint write of a run resumed for more steps repeats them.
TEST(CliAttack, AResumeKeepsEditsChecksItsMetricsFirstAndAdvisesItsSteps) {
  const std::string edited = copy_run("edited_summary");
  std::string summary = slurp(edited + "/summary.json");
  summary.insert(summary.find('{') + 1, "\n  \"my_note\": \"baseline for the paper\",");
  put(edited + "/summary.json", summary);
  const CliRun kept = run("train --resume " + edited + "/checkpoint.safetensors --steps 5");
  EXPECT_EQ(kept.code, 2) << kept.err;
  EXPECT_NE(kept.err.find("summary.json: is a cast run's summary, changed since cast wrote it"), std::string::npos)
      << kept.err;
  EXPECT_EQ(slurp(edited + "/summary.json"), summary);

  for (const std::string line : {R"({"step":2,"split":"note","text":"lr looked low"})", R"({"step":2})",
                                 R"({"step":2,"split":"val","accuracy":2,"loss":1})"}) {
    const std::string noted = copy_run("noted_metrics");
    const std::string ckpt = slurp(noted + "/checkpoint.safetensors");
    std::ofstream(noted + "/metrics.jsonl", std::ios::app) << line << "\n";
    const CliRun r = run("train --resume " + noted + "/checkpoint.safetensors --steps 5");
    EXPECT_EQ(r.code, 2) << line << ": " << r.err;
    EXPECT_NE(r.err.find("metrics.jsonl:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the resumed run would fail on it at its end: fix or remove that line"), std::string::npos)
        << r.err;
    EXPECT_EQ(slurp(noted + "/checkpoint.safetensors"), ckpt) << line;  // no step was spent
    EXPECT_TRUE(fs::exists(noted + "/summary.json")) << line;
  }

  const std::string limited = copy_run("size_limited");
  const std::string ckpt = limited + "/checkpoint.safetensors", err = limited + "/../err";
  const auto limit_kib = fs::file_size(ckpt) / 2 / 1024;  // below a checkpoint, above the metrics
  ASSERT_GT(limit_kib, 2u);
  const std::string cmd = "bash -c 'ulimit -f " + std::to_string(limit_kib) + "; timeout 60 " +
                          std::string(CAST_BINARY) + " train --resume " + ckpt + " --steps 5 --checkpoint-every 1' > " +
                          "/dev/null 2> " + err;
  EXPECT_EQ(std::system(cmd.c_str()) >> 8, 1) << slurp(err);
  EXPECT_NE(slurp(err).find("resume with: cast train --resume " + ckpt + " --steps 5"), std::string::npos)
      << slurp(err);
  const CliRun advised = run("train --resume " + ckpt + " --steps 5");  // the advice, followed
  EXPECT_EQ(advised.code, 0) << advised.err;
}

// The twenty-sixth attack's, one case each: a summary whose digest was cut out, and a last
// metrics line without its newline that is whole (no record cut short), are kept by a resume
// (refused); a comparison inside a data set is refused before its first run; plotting a run still
// training says that --out draws it elsewhere.
TEST(CliAttack, NoDigestNoCutLineAComparisonInADataSetAndAPlotOfARunningRun) {
  const std::string stripped = copy_run("stripped_summary");
  nlohmann::json summary = nlohmann::json::parse(slurp(stripped + "/summary.json"));
  summary.erase("digest");
  summary["note"] = "mine";
  put(stripped + "/summary.json", summary.dump(2));
  const CliRun kept = run("train --resume " + stripped + "/checkpoint.safetensors --steps 5");
  EXPECT_EQ(kept.code, 2) << kept.err;
  EXPECT_NE(kept.err.find("is a cast run's summary without its digest"), std::string::npos) << kept.err;
  EXPECT_EQ(slurp(stripped + "/summary.json"), summary.dump(2));

  for (const std::string tail : {R"({"note":"mine"})", "my note"}) {
    const std::string noted = copy_run("uncut_last_line");
    fs::remove(noted + "/summary.json");  // the run's only obstacle is the line
    std::ofstream(noted + "/metrics.jsonl", std::ios::app) << tail;
    const CliRun r = run("train --resume " + noted + "/checkpoint.safetensors --steps 5");
    EXPECT_EQ(r.code, 2) << tail << ": " << r.err;
    EXPECT_NE(r.err.find(tail[0] == '{' ? "has no \"step\", so it is no metrics record" : "is not JSON"),
              std::string::npos)
        << r.err;
    EXPECT_NE(slurp(noted + "/metrics.jsonl").find(tail), std::string::npos) << tail;
  }
  const std::string cut = copy_run("cut_last_line");  // a record cut short is still left behind
  fs::remove(cut + "/summary.json");
  std::ofstream(cut + "/metrics.jsonl", std::ios::app) << R"({"step":3,"split":"tr)";
  const CliRun resumed = run("train --resume " + cut + "/checkpoint.safetensors --steps 5");
  EXPECT_EQ(resumed.code, 0) << resumed.err;

  const std::string d = fresh_dir("compare_in_data");
  fs::copy(trained_run() + "/data", d + "/set", fs::copy_options::recursive);
  const CliRun inside = run("compare --data " + trained_run() + "/data --out " + d + "/set/cmp --attention full" + kTiny);
  EXPECT_EQ(inside.code, 2) << inside.err;
  EXPECT_NE(inside.err.find("comparison folder " + d + "/set/cmp: is inside the data set " + d +
                            "/set, whose files only cast data writes: choose another --out"),
            std::string::npos)
      << inside.err;
  EXPECT_EQ(inside.out.find("steps"), std::string::npos) << inside.out;  // no run began

  const std::string running = copy_run("plot_running");
  const cast::testing::FolderHeldElsewhere training(running, "run folder");
  const CliRun plot = run("plot " + running);
  EXPECT_EQ(plot.code, 1) << plot.err;
  EXPECT_NE(plot.err.find("or draw its figure now elsewhere with --out FILE.svg"), std::string::npos) << plot.err;
  EXPECT_EQ(run("plot " + running + " --out " + d + "/now.svg").code, 0);
}

// ---- the twenty-seventh attack

namespace {
// Runs `commands` (shell lines, in folder `d`) while another process holds `held` (a folder or a
// file in `d`) as cast's locks do: alone as a FolderLock, or shared as a command writing an output
// there; the holder is gone when it returns. Its exit status.
enum class Hold { alone, shared };
int while_held(const std::string& d, const std::string& held, Hold hold, const std::string& commands) {
  const std::string lock = hold == Hold::alone ? "-x" : "-s", probe = hold == Hold::alone ? "-s" : "-x";
  const std::string hold_it = "cd '" + d + "' && flock " + lock + " " + held + " sleep 30 & holder=$!\n";
  // until a lock the holder's conflicts with is refused: the holder holds it
  const std::string wait_for_it =
      "cd '" + d + "'; for i in $(seq 200); do flock -n " + probe + " " + held + " true || break; sleep 0.05; done\n";
  put(d + "/held.sh", hold_it + wait_for_it + commands + "pkill -P $holder; kill $holder 2> /dev/null; wait\n");
  return std::system(("bash '" + d + "/held.sh'").c_str());
}

// A tiny model's flags without a step count, and a ListOps set of 200 training examples (500
// validation and test) made once per test process.
const std::string kTinyModel = " --batch 4 --dim 8 --heads 2 --mlp-dim 8 --layers 1 --device cpu";
const std::string& attack27_data() {
  static const std::string data = [] {
    const std::string d = fresh_dir("attack27_set") + "/set";
    EXPECT_EQ(run("data listops-short --count 200 --out " + d).code, 0);
    return d;
  }();
  return data;
}
}  // namespace

// Bounds that hold fewer trees than asked for: 501 000 examples from the some 432 000 trees of
// length 7 drew new ones ever more seldom and ran on for hours. Refused, and the folders the
// command made are gone with the refusal (exit 2 changes nothing), as is its lock file in a
// folder that was there.
TEST(CliAttack, DataBoundsTooTightForTheCountAreRefusedAndLeaveNothing) {
  const std::string d = fresh_dir("attack27_tight"), err = d + "/err";
  // about 20 s on an idle core (the tests' 60 s limit is too near on a loaded machine): 150 s
  const int status = std::system(("timeout 150 " + std::string(CAST_BINARY) +
                                  " data listops-short --count 500000 --max-length 8 --out " + d +
                                  "/a/b/set > /dev/null 2> " + err)
                                     .c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2) << slurp(err);
  EXPECT_NE(slurp(err).find("are too tight to fill 501000 distinct examples"), std::string::npos) << slurp(err);
  EXPECT_FALSE(fs::exists(d + "/a"));
  fs::create_directories(d + "/there");
  const CliRun small = run("data listops-short --count 20 --max-length 5 --out " + d + "/there");
  EXPECT_EQ(small.code, 2) << small.err;
  EXPECT_TRUE(fs::exists(d + "/there"));
  EXPECT_TRUE(fs::is_empty(d + "/there"));
}

// An older checkpoint put back into a run that went on past it (stopped later, no summary):
// continuing from it dropped the records of every step after it. Records further past the
// checkpoint than --checkpoint-every mean a newer checkpoint was written: refused. Records
// within that reach are a run killed before its next checkpoint: left out, with a note.
TEST(CliAttack, AnOlderCheckpointPutBackIntoAnUnfinishedRunIsRefused) {
  const std::string d = fresh_dir("attack27_rewind"), r = d + "/r", ckpt = r + "/checkpoint.safetensors";
  const std::string every = " --checkpoint-every 10 --log-every 10";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 20 --run " + r).code, 0);
  fs::copy_file(ckpt, d + "/step20.safetensors");
  ASSERT_EQ(run("train --resume " + ckpt + " --steps 40").code, 0);
  fs::remove(r + "/summary.json");  // as a run stopped at step 40 leaves it
  fs::copy_file(d + "/step20.safetensors", ckpt, fs::copy_options::overwrite_existing);
  const std::string records = slurp(r + "/metrics.jsonl");
  const CliRun rewind = run("train --resume " + ckpt + " --steps 60");
  EXPECT_EQ(rewind.code, 2) << rewind.err;
  EXPECT_NE(rewind.err.find("is of step 20, but run " + r + " has records up to step 40"), std::string::npos)
      << rewind.err;
  EXPECT_EQ(slurp(r + "/metrics.jsonl"), records);
  // the resume's own --checkpoint-every is for the steps to come: it widens no reach (thirty-second
  // attack: --checkpoint-every 100000 let the same rewind through)
  const CliRun wider = run("train --resume " + ckpt + " --steps 60 --checkpoint-every 100000");
  EXPECT_EQ(wider.code, 2) << wider.err;
  EXPECT_EQ(slurp(r + "/metrics.jsonl"), records);
  // the records of a run killed at step 35, before its checkpoint at 40: within reach
  std::istringstream in(records);
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::parse(line)["step"].get<int64_t>() <= 30) kept += line + "\n";
  put(r + "/metrics.jsonl", kept);
  const CliRun killed = run("train --resume " + ckpt + " --steps 60");
  EXPECT_EQ(killed.code, 0) << killed.err;
  EXPECT_NE(killed.out.find("after step 20 (the checkpoint's) is left out"), std::string::npos) << killed.out;
}

// A sweep row is the single evaluation of the same settings: each starts from the checkpoint's
// draws (the rows after the trained model's drew other LSH hashes, and other accuracies).
TEST(CliAttack, AnEvaluationSweepRowEqualsTheSingleEvaluation) {
  const std::string d = fresh_dir("attack27_sweep"), r = d + "/r";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + " --steps 6 --attention full --run " + r).code, 0);
  const std::string ckpt = r + "/checkpoint.safetensors";
  const CliRun single = run("eval --checkpoint " + ckpt + " --attention clustered");
  const CliRun sweep = run("eval --checkpoint " + ckpt + " --attention clustered --figure " + d + "/f.svg");
  ASSERT_EQ(single.code, 0) << single.err;
  ASSERT_EQ(sweep.code, 0) << sweep.err;
  const auto percent = [](const std::string& out, const std::string& label) {
    const size_t at = out.find(label);
    return at == std::string::npos ? std::string() : out.substr(at + label.size(), out.find('%', at) - at - label.size());
  };
  const std::string val = percent(single.out, "validation accuracy "), test = percent(single.out, "test accuracy ");
  ASSERT_FALSE(val.empty() || test.empty()) << single.out;
  const auto strip = [](std::string s) { return s.erase(0, s.find_first_not_of(' ')); };
  EXPECT_NE(sweep.out.find("| clustered | 8 |  | " + strip(test) + " | " + strip(val) + " |"), std::string::npos)
      << single.out << sweep.out;
}

// Settings and messages of the attack: one CAST cluster is noted; a cost field of a checkpoint is
// named; a folder above a data set, and a run folder that is a data set, are said as such.
TEST(CliAttack, OneClusterAndDataFolderMixUpsAreSaid) {
  const std::string d = fresh_dir("attack27_said");
  const CliRun one = run("train --data " + attack27_data() + kTinyModel + " --steps 1 --clusters 1 --run " + d + "/k1");
  EXPECT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("note: CAST with one cluster: every token's affinity to it is 1, so the cluster is chosen by "
                         "position"),
            std::string::npos)
      << one.out;
  const std::string parent = fs::path(attack27_data()).parent_path().string();
  const CliRun above = run("eval --checkpoint " + d + "/k1/checkpoint.safetensors --data " + parent);
  EXPECT_EQ(above.code, 1) << above.err;
  EXPECT_NE(above.err.find(parent + " is no data set but holds one made by cast data, the ListOps set " +
                           attack27_data() + ": give --data the set's own folder"),
            std::string::npos)
      << above.err;
  const CliRun is_set = run("train --data " + trained_run() + "/data --run " + attack27_data() + kTinyModel);
  EXPECT_EQ(is_set.code, 2) << is_set.err;
  EXPECT_NE(is_set.err.find("run folder " + attack27_data() + ": is the data set " + attack27_data()), std::string::npos)
      << is_set.err;
}

// ---- the twenty-eighth attack

// A name longer than the file system holds, in --trace, compare's --out, or a run folder a --vary
// value spells: refused before any work with a line naming the setting (the library's "status:
// File name too long" came after the first variant had trained).
TEST(CliAttack, NamesTooLongAreRefusedByTheirSettingBeforeAnyWork) {
  const std::string d = fresh_dir("attack28_long");
  const std::string model = kTinyModel + " --data " + attack27_data();
  const CliRun trace = run("train" + model + " --steps 1 --run " + d + "/r --trace " + d + "/" + std::string(252, 'd') + ".jsonl");
  EXPECT_EQ(trace.code, 2) << trace.err;
  EXPECT_NE(trace.err.find("--trace " + d + "/" + std::string(252, 'd') + ".jsonl: the name is too long"),
            std::string::npos)
      << trace.err;
  const std::string long_out = d + "/" + std::string(256, 'f');
  const CliRun out = run("compare" + model + " --steps 1 --attention full --out " + long_out);
  EXPECT_EQ(out.code, 2) << out.err;
  EXPECT_NE(out.err.find("comparison folder " + long_out + ": the name is too long"), std::string::npos) << out.err;
  const std::string long_data = d + "/" + std::string(250, 'g');
  fs::copy(attack27_data(), long_data, fs::copy_options::recursive);
  const CliRun vary = run("compare" + kTinyModel + " --steps 1 --attention cast --vary data=" + attack27_data() + "," +
                          long_data + " --out " + d + "/v");
  EXPECT_EQ(vary.code, 2) << vary.err;
  EXPECT_NE(vary.err.find(": run folder " + d + "/v/data-"), std::string::npos) << vary.err;
  EXPECT_NE(vary.err.find("the name is too long"), std::string::npos) << vary.err;
  EXPECT_FALSE(fs::exists(d + "/v"));  // nothing trained, nothing made
}

// A clustered model evaluated with --attention clustered (or iclustered) keeps its own hash bits,
// iterations and cluster count where none are given: the plain evaluation's figures, said in the
// header (it ran with the options' defaults, other figures under the same name).
TEST(CliAttack, ASwapToTheTrainedMechanismKeepsItsOwnOptions) {
  const std::string d = fresh_dir("attack28_swap");
  ASSERT_EQ(run("train" + kTinyModel + " --data " + attack27_data() +
                " --steps 2 --attention clustered --bits 1 --iterations 0 --run " + d + "/r")
                .code,
            0);
  const std::string ckpt = d + "/r/checkpoint.safetensors";
  const CliRun plain = run("eval --checkpoint " + ckpt + " --eval-limit 50");
  const CliRun swapped = run("eval --checkpoint " + ckpt + " --eval-limit 50 --attention clustered");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(swapped.code, 0) << swapped.err;
  const auto from = [](const std::string& out, const char* label) {
    const size_t at = out.find(label);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_EQ(from(swapped.out, "validation accuracy"), from(plain.out, "validation accuracy")) << swapped.out;
  EXPECT_EQ(from(swapped.out, "test accuracy"), from(plain.out, "test accuracy")) << swapped.out;
  EXPECT_NE(swapped.out.find("1 hash bits, 0 iterations"), std::string::npos) << swapped.out;
}

// --vary values that train one run twice: a default spelled as its value (clusters=0,8 where 0 is
// 8 clusters) is refused; a value's '+' sign is not spelled as '-' in its folder's name.
TEST(CliAttack, VaryValuesAreReadForWhatTheyMean) {
  const std::string d = fresh_dir("attack28_vary");
  const std::string model = kTinyModel + " --data " + attack27_data();
  const CliRun same = run("compare" + model + " --steps 1 --attention cast --vary clusters=0,8 --out " + d + "/c");
  EXPECT_EQ(same.code, 2) << same.err;
  EXPECT_NE(same.err.find("the variants 'clusters=0' and 'clusters=8' train the same run"), std::string::npos)
      << same.err;
  EXPECT_FALSE(fs::exists(d + "/c"));
  const CliRun plus = run("compare" + model + " --attention full --vary steps=1,+2 --out " + d + "/p");
  EXPECT_EQ(plus.code, 0) << plus.err;
  EXPECT_TRUE(fs::exists(d + "/p/steps-2-seed1/summary.json"));
  EXPECT_FALSE(fs::exists(d + "/p/steps--2-seed1"));
}

// ---- the twenty-ninth attack

// Figures of values cast may write: losses in a range of 1e-20 (the ticks were summed by a step
// of 1e-21 against a slack of 1e-9: no end, and 296 MB at 1e-15), a diverging run's finite loss
// of 8e30 and learning rate of 1e31 (refused as outside [0, 1e30] after the run had finished,
// so it could never end), and steps near 2^63 (compared as doubles, two steps were one).
TEST(CliAttack, FiguresTakeEveryValueARunMayWrite) {
  const std::string d = fresh_dir("attack29_plot");
  const auto plot = [&](const std::string& name, const std::string& lines) {
    fs::create_directories(d + "/" + name);
    put(d + "/" + name + "/metrics.jsonl", lines);
    return run("plot " + d + "/" + name);
  };
  const std::string train = R"({"accuracy":0.5,"lr":0.001,"split":"train","tokens_per_s":10,)";
  for (const char* loss : {"1e-20", "1e-15", "1e-300"}) {
    const CliRun tiny = plot(std::string("tiny") + loss, train + R"("loss":0,"step":1})" + "\n" + train +
                                                             R"("loss":)" + loss + R"(,"step":2})" + "\n");
    EXPECT_EQ(tiny.code, 0) << loss << ": " << tiny.err;
    EXPECT_LT(fs::file_size(d + "/tiny" + std::string(loss) + "/curves.svg"), 100000u) << loss;
  }
  const CliRun huge = plot("huge", R"({"accuracy":0.1,"loss":8e30,"lr":1e31,"split":"train","step":1,"tokens_per_s":9})"
                                   "\n"
                                   R"({"accuracy":0.1,"loss":8e30,"split":"val","step":1})"
                                   "\n");
  EXPECT_EQ(huge.code, 0) << huge.err;
  const CliRun late = plot("late", train + R"("loss":1,"step":9223372036854775806})" + "\n" + train +
                                       R"("loss":1,"step":9223372036854775807})" + "\n");
  EXPECT_EQ(late.code, 0) << late.err;
  const CliRun beyond = plot("beyond", train + R"("loss":1,"step":18446744073709551615})" + "\n");
  EXPECT_EQ(beyond.code, 1) << beyond.err;
  EXPECT_NE(beyond.err.find("'step' is 18446744073709551615: out of range"), std::string::npos) << beyond.err;
}

// A validation whose loss is no number stops the run before its record: JSON would hold null.
// A run with no checkpoint of its own yet names the best validation's checkpoint as the last good
// model ("No checkpoint was written yet" said there was none). --warmup equal to --steps reaches
// the peak at the last step: no note.
TEST(CliAttack, ARunThatDivergesWritesNoNonNumberAndNamesItsBestModel) {
  const std::string d = fresh_dir("attack29_nan");
  const CliRun nan = run("train" + kTinyModel + " --data " + attack27_data() +
                         " --steps 1 --lr 1e39 --warmup 0 --schedule constant --weight-decay 0 --eval-every 1 --run " +
                         d + "/r");
  EXPECT_EQ(nan.code, 1) << nan.err;
  EXPECT_NE(nan.err.find("step 1: the validation loss is nan"), std::string::npos) << nan.err;
  EXPECT_EQ(slurp(d + "/r/metrics.jsonl").find("null"), std::string::npos) << slurp(d + "/r/metrics.jsonl");
  const std::string best_only = copy_run("attack29_best");
  fs::rename(best_only + "/checkpoint.safetensors", best_only + "/best.safetensors");
  EXPECT_EQ(train::last_good_checkpoint(best_only + "/checkpoint.safetensors"),
            "No checkpoint.safetensors was written yet; the best validation's " + best_only +
                "/best.safetensors (step 3, every value checked finite) is the last good model");
  const CliRun warm = run("train" + kTinyModel + " --data " + attack27_data() + " --steps 2 --warmup 2 --run " + d + "/w");
  EXPECT_EQ(warm.code, 0) << warm.err;
  EXPECT_EQ(warm.out.find("note: --warmup"), std::string::npos) << warm.out;
}

// ---- the thirtieth attack

// A best checkpoint of a step after the run's checkpoint (an older cast saved only the best, and
// the process was killed before its next checkpoint): the resume trained every step, then failed
// at the end. Refused before the first step, naming what to do.
TEST(CliAttack, ABestCheckpointNewerThanTheRunsIsRefusedBeforeTheFirstStep) {
  const std::string d = fresh_dir("attack30_best"), r = d + "/r", ckpt = r + "/checkpoint.safetensors";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + " --steps 2 --run " + r).code, 0);
  fs::copy_file(ckpt, d + "/step2.safetensors");
  ASSERT_EQ(run("train --resume " + ckpt + " --steps 4").code, 0);
  fs::copy_file(ckpt, r + "/best.safetensors");  // of step 4
  fs::copy_file(d + "/step2.safetensors", ckpt, fs::copy_options::overwrite_existing);
  fs::remove(r + "/summary.json");
  const CliRun resumed = run("train --resume " + ckpt + " --steps 6");
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_NE(resumed.err.find(r + "/best.safetensors is of step 4, after the checkpoint's step 2"), std::string::npos)
      << resumed.err;
  EXPECT_EQ(resumed.out.find("step 3"), std::string::npos) << resumed.out;  // no step trained
}

// The image tasks' advice for a missing set or file names the task's generator, with --overwrite
// where cast data made the set; a branch from a best checkpoint takes the run's history, not the
// evaluation the run did at its end; the rsqrt schedule's peak is its own, not --lr.
TEST(CliAttack, AdviceAndRecordsOfTheMainPathsHoldWhenFollowed) {
  const std::string d = fresh_dir("attack30_paths");
  fs::create_directories(d + "/px");
  const CliRun px = run("train --task pathx" + kTinyModel + " --steps 1 --data " + d + "/px");
  EXPECT_EQ(px.code, 1) << px.err;
  EXPECT_NE(px.err.find("cast data pathx --out " + d + "/px"), std::string::npos) << px.err;
  ASSERT_EQ(run("data pathfinder --count 20 --out " + d + "/pf").code, 0);
  fs::remove(d + "/pf/imgs/0/sample_3.png");
  const CliRun pf = run("train --task pathfinder" + kTinyModel + " --steps 1 --data " + d + "/pf");
  EXPECT_EQ(pf.code, 1) << pf.err;
  EXPECT_NE(pf.err.find("which does not exist (generate it again with `cast data pathfinder --count 20 --out " + d +
                        "/pf --overwrite`"),
            std::string::npos)
      << pf.err;

  const std::string r = d + "/r", branch = d + "/branch";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + " --steps 4 --eval-every 2 --eval-best --run " + r).code, 0);
  const CliRun b = run("train --resume " + r + "/best.safetensors --run " + branch + " --steps 6");
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string records = slurp(branch + "/metrics.jsonl");
  size_t tests = 0;
  for (size_t at = records.find("\"split\":\"test\""); at != std::string::npos; at = records.find("\"split\":\"test\"", at + 1))
    ++tests;
  EXPECT_EQ(tests, 1u) << records;  // its own final evaluation's

  const CliRun rsqrt = run("train --data " + attack27_data() + kTinyModel +
                           " --steps 2 --schedule rsqrt --warmup 100 --lr 0.05 --run " + d + "/q");
  EXPECT_EQ(rsqrt.code, 0) << rsqrt.err;
  EXPECT_NE(rsqrt.out.find("never reaches its peak (0.005 at step 100: --lr 0.05 over the square root of --warmup)"),
            std::string::npos)
      << rsqrt.out;
}

// ---- the thirty-first attack

// The memory estimate counts an address-space limit (ulimit -v), not only the machine's memory:
// a step beyond it is refused before any folder is made, naming the limit and the settings (it
// died at its first step with "out of host memory allocating N bytes"). A relation between two
// settings names the settings file that gave one of them.
TEST(CliAttack, LimitsAndRelationsAreSaidWithTheirSource) {
  const std::string d = fresh_dir("attack31_limits");
  const std::string err = d + "/err";
  const int status = std::system(("ulimit -v 1500000; timeout 60 " + std::string(CAST_BINARY) + " train --data " +
                                  attack27_data() +
                                  " --dim 256 --heads 2 --mlp-dim 1024 --layers 1 --batch 4096 --steps 3 --device cpu "
                                  "--run " + d + "/uv > /dev/null 2> " + err)
                                     .c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1) << slurp(err);
  EXPECT_NE(slurp(err).find("the address-space limit (ulimit -v) leaves"), std::string::npos) << slurp(err);
  EXPECT_NE(slurp(err).find("lower --batch"), std::string::npos) << slurp(err);
  EXPECT_FALSE(fs::exists(d + "/uv"));
  put(d + "/cfg.json", R"({"lr": 1e308})");
  const CliRun relation = run("train --data " + attack27_data() + kTinyModel + " --config " + d + "/cfg.json --steps 1 --run " + d + "/r");
  EXPECT_EQ(relation.code, 2) << relation.err;
  EXPECT_NE(relation.err.find("config file " + d + "/cfg.json: setting 'weight-decay' is 0.01: with 'lr' 1e+308"),
            std::string::npos)
      << relation.err;
}

// ---- the thirty-second attack

// A comparison refused for a run an earlier invocation left with other settings changes nothing:
// no lock file is made in its folder (the check came after the folder was locked).
TEST(CliAttack, ARefusedComparisonLeavesNoLockFile) {
  const std::string d = fresh_dir("attack32_lock");
  const std::string model = " --heads 2 --mlp-dim 16 --layers 1 --eval-limit 5 --batch 4 --device cpu --data " +
                            attack27_data();
  ASSERT_EQ(run("train" + model + " --dim 32 --attention full --steps 1 --run " + d + "/q/full-seed1").code, 0);
  const CliRun refused = run("compare" + model + " --dim 16 --attention full --steps 1 --out " + d + "/q");
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_NE(refused.err.find("this run was started with setting 'dim' = 32"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(d + "/q/.cast.lock"));
}

// ---- the thirty-third attack

// cast bench --json over an earlier file of its own: the earlier rows stay whole until the new
// benchmark has all of its rows (a Ctrl-C or SIGTERM after its first row had left one row in their
// place);
// until then the rows go to FILE.partial, which the finished benchmark removes.
TEST(CliAttack, BenchJsonKeepsAnEarlierFileUntilItsLastRow) {
  const std::string d = fresh_dir("attack33_json");
  const std::string quick = "bench attention --lengths 16 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full";
  ASSERT_EQ(run(quick + " --json " + d + "/b.jsonl").code, 0);
  const std::string earlier = slurp(d + "/b.jsonl");
  // the second row (N 4096) takes many seconds: stopped once the first row is written
  put(d + "/stop.sh", "cd '" + d + "'\n" + std::string(CAST_BINARY) +
                          " bench attention --lengths 16,4096 --dim 256 --heads 4 --repeats 50 --warmup 0 "
                          "--mechanisms full --device cpu --json b.jsonl > out 2>&1 & pid=$!\n"
                          "for i in $(seq 600); do [ -s b.jsonl.partial ] && break; sleep 0.1; done\n"
                          "kill -TERM $pid; wait $pid; echo $? > code\n");  // a script's background job ignores SIGINT
  ASSERT_EQ(std::system(("bash '" + d + "/stop.sh'").c_str()), 0);
  EXPECT_EQ(slurp(d + "/code"), "143\n") << slurp(d + "/out");
  EXPECT_EQ(slurp(d + "/b.jsonl"), earlier);
  EXPECT_EQ(lines(slurp(d + "/b.jsonl.partial")), 1);
  EXPECT_NE(slurp(d + "/out").find("--json b.jsonl: kept as it is until the last row; the rows go to b.jsonl.partial"),
            std::string::npos)
      << slurp(d + "/out");
  // finished: the new rows replace the earlier ones, and the partial file goes
  ASSERT_EQ(run("bench attention --lengths 16,32 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full --json " + d +
                "/b.jsonl")
                .code,
            0);
  EXPECT_EQ(lines(slurp(d + "/b.jsonl")), 2);
  EXPECT_FALSE(fs::exists(d + "/b.jsonl.partial"));
}

// A data set whose rerun was stopped (marked unfinished) may still hold the whole set it had:
// only a rerun of its settings finishes it; other settings need --overwrite (they replaced it).
TEST(CliAttack, AnUnfinishedSetIsFinishedOnlyByItsOwnSettings) {
  const std::string d = fresh_dir("attack33_unfinished");
  ASSERT_EQ(run("data listops-short --count 300 --out " + d + "/s").code, 0);
  const std::string train = slurp(d + "/s/basic_train.tsv");
  put(d + "/s/.cast-data-unfinished", "");  // an older cast data's mark records no settings
  const CliRun other = run("data listops-short --count 50 --seed 9 --out " + d + "/s");
  EXPECT_EQ(other.code, 2) << other.err;
  EXPECT_NE(other.err.find("holds an unfinished ListOps set of other settings (300 training"), std::string::npos)
      << other.err;
  EXPECT_NE(other.err.find("finish it with `cast data listops-short --count 300 --out " + d + "/s`"), std::string::npos)
      << other.err;
  EXPECT_EQ(slurp(d + "/s/basic_train.tsv"), train);
  // its own settings finish it; a rerun that stops records them in the mark it leaves
  EXPECT_EQ(run("data listops-short --count 300 --out " + d + "/s").code, 0);
  EXPECT_FALSE(fs::exists(d + "/s/.cast-data-unfinished"));
  EXPECT_EQ(run("data listops-short --count 50 --seed 9 --out " + d + "/s --overwrite").code, 0);
}

// An output into a folder another cast process holds (a run training, a comparison) is refused
// with the line `cast plot` gives, naming the holder; here the holder is a lock on the folder
// taken as a FolderLock takes it.
TEST(CliAttack, AnOutputIntoAFolderAnotherProcessHoldsIsRefused) {
  const std::string d = fresh_dir("attack33_held");
  fs::create_directories(d + "/R");
  put(d + "/R/.cast.lock", "");
  ASSERT_EQ(while_held(d, "R", Hold::alone,
                       std::string(CAST_BINARY) +
                           " bench attention --lengths 16 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full "
                           "--device cpu --json R/x.jsonl > out 2> err; echo $? > code\n"),
            0);
  EXPECT_EQ(slurp(d + "/code"), "1\n") << slurp(d + "/err");
  EXPECT_NE(slurp(d + "/err").find("--json R/x.jsonl: folder R is in use by another cast process"), std::string::npos)
      << slurp(d + "/err");
  EXPECT_FALSE(fs::exists(d + "/R/x.jsonl"));
}

// A comparison reads every run's data and counts its memory before it makes its folder or trains
// its first run; two variants of one run on this machine (device cpu and auto, without a GPU) are
// refused as one run twice.
TEST(CliAttack, AComparisonChecksEveryRunsDataAndMemoryFirst) {
  const std::string d = fresh_dir("attack33_compare");
  fs::create_directories(d + "/bad");
  put(d + "/bad/basic_train.tsv", "Source\tTarget\tX\n( ( [MAX 1 2 ] ) )\t2\t3\n");
  fs::copy_file(attack27_data() + "/basic_val.tsv", d + "/bad/basic_val.tsv");
  fs::copy_file(attack27_data() + "/basic_test.tsv", d + "/bad/basic_test.tsv");
  const CliRun bad = run("compare --data " + d + "/bad" + kTinyModel + " --steps 1 --attention full --out " + d + "/a/b");
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_NE(bad.err.find("basic_train.tsv:1: expected the header"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(d + "/a"));
  const std::string model = " --dim 8 --heads 2 --mlp-dim 8 --layers 1";
  const CliRun big = run("compare --data " + attack27_data() + model +
                         " --device cpu --steps 1 --attention full --vary batch=2,1048576 --out " + d + "/v");
  EXPECT_EQ(big.code, 1) << big.err;
  EXPECT_NE(big.err.find("variant batch=1048576: a training step of batch 1048576"), std::string::npos) << big.err;
  EXPECT_FALSE(fs::exists(d + "/v"));
  if (train::resolve_device("auto") == Device::cpu) {
    const CliRun twice = run("compare --data " + attack27_data() + model +
                             " --batch 4 --steps 1 --attention full --vary device=cpu,auto --out " + d + "/dv");
    EXPECT_EQ(twice.code, 2) << twice.err;
    EXPECT_NE(twice.err.find("the variants 'device=cpu' and 'device=auto' train the same run"), std::string::npos)
        << twice.err;
  }
}

// The default `cast train` checks that its run folder can be made before it generates its data;
// a best.safetensors of another run's model is refused before a resumed run's first step, not
// after its last; a seed list takes digits only; an OpenMP stack size past 2^64 bytes is refused.
TEST(CliAttack, WhatARunWouldRefuseAtItsEndIsRefusedAtItsStart) {
  const std::string d = fresh_dir("attack33_start");
  put(d + "/runs", "x");
  const CliRun file = run("train --dim 8 --heads 2 --mlp-dim 8 --layers 1 --steps 1 --device cpu", d);
  EXPECT_EQ(file.code, 1) << file.err;
  EXPECT_NE(file.err.find("run folder runs/listops-short-cast: runs is a file"), std::string::npos) << file.err;
  EXPECT_FALSE(fs::exists(d + "/data"));

  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-best --steps 4 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --run " + d + "/a").code, 0);
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --seed 7 --run " + d + "/b").code, 0);
  fs::copy_file(d + "/b/best.safetensors", d + "/a/best.safetensors", fs::copy_options::overwrite_existing);
  const CliRun foreign = run("train --resume " + d + "/a/checkpoint.safetensors --steps 6");
  EXPECT_EQ(foreign.code, 2) << foreign.err;
  EXPECT_NE(foreign.err.find(d + "/a/best.safetensors is of another run than this one (setting 'seed' is 7 there"),
            std::string::npos)
      << foreign.err;
  EXPECT_EQ(foreign.out.find("step 5"), std::string::npos) << foreign.out;

  const CliRun seeds = run("compare --data " + attack27_data() + kTinyModel + " --steps 1 --seeds ' 1' --out " + d + "/s");
  EXPECT_EQ(seeds.code, 2) << seeds.err;
  EXPECT_NE(seeds.err.find("--seeds: ' 1' is not a seed"), std::string::npos) << seeds.err;
  const int stack = std::system(("OMP_STACKSIZE=17179869185G timeout 60 " + std::string(CAST_BINARY) +
                                  " info > /dev/null 2> " + d + "/stack_err").c_str());
  EXPECT_EQ(WEXITSTATUS(stack), 2) << slurp(d + "/stack_err");
  EXPECT_NE(slurp(d + "/stack_err").find("cast: error: OMP_STACKSIZE=17179869185G: more stack per thread than"),
            std::string::npos)
      << slurp(d + "/stack_err");
}

// A data file with a line longer than the memory holds (here under an address-space limit) is
// named with its line, not left to the general out-of-memory line.
TEST(CliAttack, ALineLongerThanTheMemoryIsNamed) {
  const std::string d = fresh_dir("attack33_line");
  fs::create_directories(d + "/big");
  {
    std::ofstream f(d + "/big/basic_train.tsv", std::ios::binary);
    f << "Source\tTarget\n( ( [MAX ";
    const std::string ones(1 << 20, '1');
    std::string chunk;
    for (size_t i = 0; i < ones.size(); ++i) chunk += i % 2 ? ' ' : '1';
    for (int i = 0; i < 80; ++i) f << chunk;  // 80 MiB on one line
    f << "] ) )\t1\n";
  }
  fs::copy_file(attack27_data() + "/basic_val.tsv", d + "/big/basic_val.tsv");
  fs::copy_file(attack27_data() + "/basic_test.tsv", d + "/big/basic_test.tsv");
  const std::string err = d + "/err";
  const int status = std::system(("ulimit -v 1200000; OMP_NUM_THREADS=1 timeout 60 " + std::string(CAST_BINARY) +
                                  " train --data " + d + "/big" + kTinyModel + " --steps 1 --run " + d +
                                  "/r > /dev/null 2> " + err)
                                     .c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1) << slurp(err);
  EXPECT_NE(slurp(err).find("data file " + d + "/big/basic_train.tsv: line 2: out of memory reading it"),
            std::string::npos)
      << slurp(err);
  fs::remove_all(d + "/big");
}

// ---- the thirty-fourth attack

// FILE.partial is a name cast chooses: no --overwrite reaches a file of the user's there, and a
// link there is never written through (it replaced the file it pointed to).
TEST(CliAttack, BenchJsonsPartialFileIsNeverTheUsers) {
  const std::string d = fresh_dir("attack34_partial");
  const std::string bench = "bench attention --lengths 8 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full "
                            "--device cpu --json ";
  put(d + "/res.json", "user results\n");
  put(d + "/res.json.partial", "my draft\n");
  const CliRun draft = run(bench + d + "/res.json --overwrite");
  EXPECT_EQ(draft.code, 2) << draft.err;
  EXPECT_NE(draft.err.find("res.json.partial"), std::string::npos) << draft.err;
  EXPECT_EQ(slurp(d + "/res.json.partial"), "my draft\n");
  EXPECT_EQ(slurp(d + "/res.json"), "user results\n");
  ASSERT_EQ(run(bench + d + "/other.jsonl").code, 0);
  const std::string other = slurp(d + "/other.jsonl");
  ASSERT_EQ(run(bench + d + "/b.jsonl").code, 0);
  fs::create_symlink("other.jsonl", d + "/b.jsonl.partial");
  const CliRun link = run(bench + d + "/b.jsonl");
  EXPECT_NE(link.code, 0) << link.err;
  EXPECT_NE(link.err.find("b.jsonl.partial"), std::string::npos) << link.err;
  EXPECT_EQ(slurp(d + "/other.jsonl"), other);
  EXPECT_TRUE(fs::is_symlink(d + "/b.jsonl.partial"));
}

// A comparison that varies --max-len reads its one data folder once per length: rerun when
// finished, it finds each run's set unchanged (each had been compared with the first length's).
TEST(CliAttack, AComparisonOfMaxLengthsRerunsWhenFinished) {
  const std::string d = fresh_dir("attack34_maxlen");
  const std::string cmp = "compare --data " + attack27_data() +
                          " --attention full --steps 1 --dim 8 --layers 1 --heads 2 --mlp-dim 8 --batch 4 "
                          "--eval-limit 4 --device cpu --vary max-len=48,8 --out " + d + "/cmp";
  ASSERT_EQ(run(cmp).code, 0);
  const CliRun again = run(cmp);
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("finished earlier"), std::string::npos) << again.out;
}

// A data set or a comparison is never made inside a folder another cast process holds; a best
// model that cannot be read is refused before a resumed run's first step where its end would
// evaluate it; a `cast layer` input of width 0 is named by its file and tensor.
TEST(CliAttack, NothingIsMadeInAHeldFolderAndABrokenBestIsRefusedFirst) {
  const std::string d = fresh_dir("attack34_held");
  fs::create_directories(d + "/R");
  put(d + "/R/.cast.lock", "");
  ASSERT_EQ(while_held(d, "R", Hold::alone,
                       std::string(CAST_BINARY) +
                           " data listops-short --count 20 --out R/sub > out 2> err; echo $? > code\n" +
                           std::string(CAST_BINARY) + " compare --data " + attack27_data() + kTinyModel +
                           " --attention full --steps 1 --out R/cmp > out2 2> err2; echo $? > code2\n"),
            0);
  EXPECT_EQ(slurp(d + "/code"), "1\n") << slurp(d + "/err");
  EXPECT_NE(slurp(d + "/err").find("data folder R/sub: folder R is in use by another cast process"), std::string::npos)
      << slurp(d + "/err");
  EXPECT_EQ(slurp(d + "/code2"), "1\n") << slurp(d + "/err2");
  EXPECT_NE(slurp(d + "/err2").find("R/cmp: folder R is in use by another cast process"), std::string::npos)
      << slurp(d + "/err2");
  EXPECT_FALSE(fs::exists(d + "/R/sub"));
  EXPECT_FALSE(fs::exists(d + "/R/cmp"));

  const std::string every = " --eval-every 2 --checkpoint-every 2 --steps 4 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --run " + d + "/a").code, 0);
  put(d + "/a/best.safetensors", "garbage\n");
  const CliRun broken = run("train --resume " + d + "/a/checkpoint.safetensors --steps 6 --eval-best");
  EXPECT_EQ(broken.code, 2) << broken.err;
  EXPECT_NE(broken.err.find(d + "/a/best.safetensors cannot be read as this run's best model"), std::string::npos)
      << broken.err;
  EXPECT_EQ(broken.out.find("step 5"), std::string::npos) << broken.out;

  {
    std::map<std::string, Tensor> t;
    t["x"] = Tensor::zeros({1, 4, 0});
    t["dout"] = Tensor::zeros({1, 4, 0});
    for (const char* w : {"wq", "wk", "wv", "wo"}) t[w] = Tensor::zeros({0, 0});
    write_safetensors(d + "/d0.st", t);
  }
  const CliRun zero = run("layer --in " + d + "/d0.st --out " + d + "/o.st --heads 1");
  EXPECT_EQ(zero.code, 1) << zero.err;
  EXPECT_NE(zero.err.find(d + "/d0.st: tensor 'x' has shape [1, 4, 0]: a token needs a width D"), std::string::npos)
      << zero.err;
}

// ---- the thirty-fifth attack

// A best model of another run is refused whatever tells it apart: a setting the run cannot change
// (its lr), named with the values the user gave; a branch does not take one along; nothing is
// written or made in a run folder of a comparison another process holds, nor made inside a folder
// a command holds shared; two benchmarks over one earlier --json file are not run at once; a
// --json name too long for its partial file is refused before any work.
TEST(CliAttack, ARunsBestAndAHeldComparisonAreTheirOwn) {
  const std::string d = fresh_dir("attack35");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-best --steps 4 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --run " + d + "/a").code, 0);
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --lr 0.01 --run " + d + "/b").code, 0);
  fs::copy_file(d + "/b/best.safetensors", d + "/a/best.safetensors", fs::copy_options::overwrite_existing);
  const CliRun lr = run("train --resume " + d + "/a/checkpoint.safetensors --steps 6");
  EXPECT_EQ(lr.code, 2) << lr.err;
  EXPECT_NE(lr.err.find("is of another run than this one (setting 'lr' is 0.01 there but"), std::string::npos)
      << lr.err;
  const CliRun branch = run("train --resume " + d + "/a/checkpoint.safetensors --steps 6 --run " + d + "/branch");
  EXPECT_EQ(branch.code, 2) << branch.err;
  EXPECT_NE(branch.err.find(d + "/a/best.safetensors is of another run than this one"), std::string::npos)
      << branch.err;
  EXPECT_FALSE(fs::exists(d + "/branch"));

  // a comparison C holding its folder (here a lock as its FolderLock takes it) around a run folder
  fs::create_directories(d + "/C/run");
  put(d + "/C/.cast.lock", "");
  put(d + "/C/run/.cast.lock", "");
  ASSERT_EQ(while_held(d, "C", Hold::alone,
                       std::string(CAST_BINARY) +
                           " bench attention --lengths 16 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full "
                           "--device cpu --json C/run/x.jsonl > out 2> err; echo $? > code\n" +
                           std::string(CAST_BINARY) +
                           " data listops-short --count 20 --out C/run/dd > out2 2> err2; echo $? > code2\n"),
            0);
  EXPECT_EQ(slurp(d + "/code"), "1\n") << slurp(d + "/err");
  EXPECT_NE(slurp(d + "/err").find("--json C/run/x.jsonl: folder C is in use by another cast process"),
            std::string::npos)
      << slurp(d + "/err");
  EXPECT_EQ(slurp(d + "/code2"), "1\n") << slurp(d + "/err2");
  EXPECT_NE(slurp(d + "/err2").find("folder C is in use by another cast process"), std::string::npos)
      << slurp(d + "/err2");
  EXPECT_FALSE(fs::exists(d + "/C/run/x.jsonl"));
  EXPECT_FALSE(fs::exists(d + "/C/run/dd"));

  // held shared (a command writing an output there): no folder is made inside it
  fs::create_directories(d + "/S");
  put(d + "/S/.cast.lock", "");
  ASSERT_EQ(while_held(d, "S", Hold::shared,
                       std::string(CAST_BINARY) +
                           " data listops-short --count 20 --out S/sub > out3 2> err3; echo $? > code3\n"),
            0);
  EXPECT_EQ(slurp(d + "/code3"), "1\n") << slurp(d + "/err3");
  EXPECT_NE(slurp(d + "/err3").find("folder S is in use by another cast process (pid unknown)"), std::string::npos)
      << slurp(d + "/err3");
  EXPECT_FALSE(fs::exists(d + "/S/sub"));

  // --json: a benchmark over an earlier file it shares with another is refused; a name with no room
  const std::string bench =
      "bench attention --lengths 16 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full "
      "--device cpu --json ";
  ASSERT_EQ(run(bench + d + "/w.jsonl").code, 0);
  ASSERT_EQ(while_held(d, "w.jsonl", Hold::alone,
                       std::string(CAST_BINARY) + " " + bench + "w.jsonl > out4 2> err4; echo $? > code4\n"),
            0);
  EXPECT_EQ(slurp(d + "/code4"), "1\n") << slurp(d + "/err4");
  EXPECT_NE(slurp(d + "/err4").find("--json w.jsonl: another cast bench is writing its rows over it"),
            std::string::npos)
      << slurp(d + "/err4");
  EXPECT_FALSE(fs::exists(d + "/w.jsonl.partial"));
  fs::create_symlink("w.jsonl", d + "/w2.jsonl.partial");
  ASSERT_EQ(run(bench + d + "/w2.jsonl").code, 0);  // w2.jsonl is new: no partial file then
  fs::remove(d + "/w2.jsonl.partial");
  fs::create_symlink("w.jsonl", d + "/w2.jsonl.partial");
  const CliRun link = run(bench + d + "/w2.jsonl");
  EXPECT_EQ(link.code, 2) << link.err;
  EXPECT_NE(link.err.find("w2.jsonl.partial is a symbolic link, where this benchmark writes its rows"),
            std::string::npos)
      << link.err;
  const CliRun long_name = run(bench + d + "/" + std::string(250, 'n'));
  EXPECT_EQ(long_name.code, 2) << long_name.err;
  EXPECT_NE(long_name.err.find("the name is too long"), std::string::npos) << long_name.err;
}

// ---- the thirty-sixth attack

// A link into a held folder is no way around its holder: the folders an output or a new folder
// really lies in are found with their links resolved ("link/x", "link/.."). An unfinished set of
// one kind is no place for a set of another, --overwrite or not, and its refusal names its kind.
TEST(CliAttack, ALinkIntoAHeldFolderAndAnUnfinishedSetOfAnotherKindAreRefused) {
  const std::string d = fresh_dir("attack36");
  fs::create_directories(d + "/R/deeper");
  put(d + "/R/.cast.lock", "");
  fs::create_directory_symlink("R/deeper", d + "/DL");
  ASSERT_EQ(while_held(d, "R", Hold::alone,
                       std::string(CAST_BINARY) +
                           " bench attention --lengths 16 --dim 8 --heads 2 --repeats 1 --warmup 0 --mechanisms full "
                           "--device cpu --json DL/../y.jsonl > out 2> err; echo $? > code\n" +
                           std::string(CAST_BINARY) +
                           " data listops-short --count 20 --out DL/dd > out2 2> err2; echo $? > code2\n"),
            0);
  EXPECT_EQ(slurp(d + "/code"), "1\n") << slurp(d + "/err");
  EXPECT_NE(slurp(d + "/err").find("R is in use by another cast process"), std::string::npos) << slurp(d + "/err");
  EXPECT_EQ(slurp(d + "/code2"), "1\n") << slurp(d + "/err2");
  EXPECT_NE(slurp(d + "/err2").find("R is in use by another cast process"), std::string::npos) << slurp(d + "/err2");
  EXPECT_FALSE(fs::exists(d + "/R/y.jsonl"));
  EXPECT_FALSE(fs::exists(d + "/R/deeper/dd"));

  // a Pathfinder set stopped before it finished (as its generator leaves it: images, the mark)
  ASSERT_EQ(run("data pathfinder --count 20 --out " + d + "/pf").code, 0);
  fs::remove(d + "/pf/.made-by-cast");
  put(d + "/pf/.cast-data-unfinished", "cast data is writing this data set\nkind: Pathfinder\nsettings: 8 images\n");
  for (const std::string& flags : {"", " --overwrite"}) {
    const CliRun other = run("data listops-short --count 50 --out " + d + "/pf" + flags);
    EXPECT_EQ(other.code, 2) << other.err;
    EXPECT_NE(other.err.find("holds a Pathfinder set made by cast data; a ListOps set there would lie beside its files"),
              std::string::npos)
        << other.err;
  }
  EXPECT_FALSE(fs::exists(d + "/pf/basic_train.tsv"));
  const CliRun same_kind = run("data pathfinder --count 10 --out " + d + "/pf");
  EXPECT_EQ(same_kind.code, 2) << same_kind.err;
  EXPECT_NE(same_kind.err.find("holds an unfinished Pathfinder set of other settings (8 images), not these"),
            std::string::npos)
      << same_kind.err;
  EXPECT_EQ(same_kind.err.find("may still be a whole set"), std::string::npos) << same_kind.err;
}

// ---- the thirty-eighth attack

// A data folder another cast data is writing is said to be in use, not to hold a set it left
// unfinished (two started at once: the second was told to finish or replace the first's set).
TEST(CliAttack, ADataFolderBeingWrittenIsInUse) {
  const std::string d = fresh_dir("attack38");
  ASSERT_EQ(run("data listops-short --count 40 --out " + d + "/x").code, 0);
  put(d + "/x/.cast-data-unfinished", "cast data is writing this data set\nkind: ListOps\nsettings: another\n");
  ASSERT_EQ(
      while_held(d, "x", Hold::alone,
                 std::string(CAST_BINARY) + " data listops-short --count 40 --out x > out 2> err; echo $? > code\n"),
      0);
  EXPECT_EQ(slurp(d + "/code"), "1\n") << slurp(d + "/err");
  EXPECT_NE(slurp(d + "/err").find("data folder x is in use by another cast process"), std::string::npos)
      << slurp(d + "/err");
}

// ---- the thirty-eighth attack, what was left of it

// A best model of another run whose every setting agrees with this one's but a resumable one
// (--steps here) is told apart by the run id each run draws at step 0; a branch draws its own and
// gives it to the best it takes along, so that best is its run's.
TEST(CliAttack, ABestOfAnotherRunOfTheSameSettingsIsTheOtherRuns) {
  const std::string d = fresh_dir("attack38_run_id");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-best --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 4 --run " + d + "/a").code, 0);
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 6 --run " + d + "/b").code, 0);
  const std::string a_id = train::read_checkpoint_header(d + "/a/checkpoint.safetensors").run_id;
  EXPECT_EQ(a_id.size(), 16u);
  EXPECT_NE(a_id, train::read_checkpoint_header(d + "/b/checkpoint.safetensors").run_id);
  EXPECT_EQ(train::read_checkpoint_header(d + "/a/best.safetensors").run_id, a_id);

  // a's own best goes along a branch, under the branch's own id, and the branch resumes with it
  ASSERT_EQ(run("train --resume " + d + "/a/checkpoint.safetensors --steps 6 --run " + d + "/branch").code, 0);
  const std::string branch_id = train::read_checkpoint_header(d + "/branch/checkpoint.safetensors").run_id;
  EXPECT_NE(branch_id, a_id);
  EXPECT_EQ(train::read_checkpoint_header(d + "/branch/best.safetensors").run_id, branch_id);
  const CliRun own = run("train --resume " + d + "/branch/checkpoint.safetensors --steps 8");
  EXPECT_EQ(own.code, 0) << own.err;

  fs::copy_file(d + "/b/best.safetensors", d + "/a/best.safetensors", fs::copy_options::overwrite_existing);
  const CliRun other = run("train --resume " + d + "/a/checkpoint.safetensors --steps 8");
  EXPECT_EQ(other.code, 2) << other.err;
  EXPECT_NE(other.err.find(d + "/a/best.safetensors is of another run than this one (its run id is "),
            std::string::npos)
      << other.err;
  EXPECT_EQ(other.out.find("step 5"), std::string::npos) << other.out;
  const CliRun branch = run("train --resume " + d + "/a/checkpoint.safetensors --steps 8 --run " + d + "/branch2");
  EXPECT_EQ(branch.code, 2) << branch.err;
  EXPECT_FALSE(fs::exists(d + "/branch2"));

  // an id that is no id is an edited file's
  std::map<std::string, std::string> meta;
  const auto file = read_safetensors(d + "/b/checkpoint.safetensors");
  meta = file.metadata;
  meta["run_id"] = "zz";
  write_safetensors(d + "/edited.safetensors", file.tensors, meta);
  const CliRun edited = run("eval --checkpoint " + d + "/edited.safetensors --data " + attack27_data());
  EXPECT_EQ(edited.code, 1) << edited.err;
  EXPECT_NE(edited.err.find("'run_id' is \"zz\", not 16 lowercase hexadecimal digits"), std::string::npos)
      << edited.err;
}

// A working folder removed under the shell: one line saying so, not the library's "cannot make
// absolute path" or a data folder that cannot be made; a hundred temporaries a killed writer left
// beside a run's checkpoint do not make its next checkpoint fail.
TEST(CliAttack, ARemovedWorkingFolderAndLeftTemporariesAreNoLateFailure) {
  const std::string d = fresh_dir("attack38_left");
  const int status = std::system(("cd " + d + " && mkdir gone && cd gone && rmdir ../gone && timeout 60 " +
                                  std::string(CAST_BINARY) + " train" + kTinyModel + " --steps 1 > " + d + "/out 2> " +
                                  d + "/err; echo $? > " + d + "/code")
                                     .c_str());
  ASSERT_EQ(status, 0);
  EXPECT_EQ(slurp(d + "/code"), "2\n") << slurp(d + "/err");
  EXPECT_EQ(slurp(d + "/err"),
            "cast train: error: the working folder was removed (getcwd: no such file or folder), so no relative path, "
            "the default runs/ and data/ among them, can be found or made: cd into a folder that exists\n");

  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + " --checkpoint-every 2 --steps 2 --run " + d + "/r").code,
            0);
  put(d + "/r/checkpoint.safetensors.tmp", "left");
  for (int n = 1; n < 100; ++n) put(d + "/r/checkpoint.safetensors." + std::to_string(n) + ".tmp", "left");
  const CliRun resumed = run("train --resume " + d + "/r/checkpoint.safetensors --steps 4");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("checkpoint.safetensors.1.tmp (4 B), "), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find(", and 95 more of those names, left by a write"), std::string::npos) << resumed.out;
  EXPECT_EQ(train::read_checkpoint_header(d + "/r/checkpoint.safetensors").step, 4);
  int left = 0;
  for (const auto& entry : fs::directory_iterator(d + "/r")) left += entry.path().extension() == ".tmp";
  EXPECT_EQ(left, 100);  // the user's to delete, as the note says; none of the run's own left
}

// ---- the thirty-ninth attack (files, runs, resume)

namespace {
// A checkpoint's metadata key set to `value` in place (the tensors as they were).
// The checkpoint at `path` written again with its metadata as `edit` leaves it.
void rewrite_metadata(const std::string& path, const std::function<void(std::map<std::string, std::string>&)>& edit) {
  TensorFile f = read_safetensors(path);
  edit(f.metadata);
  write_safetensors(path, f.tensors, f.metadata);
}
void set_metadata(const std::string& path, const std::string& key, const std::string& value) {
  rewrite_metadata(path, [&](auto& metadata) { metadata[key] = value; });
}
// The same for a key of a JSON metadata entry ("train" or "model").
void set_in_metadata(const std::string& path, const std::string& entry, const std::string& key,
                     const nlohmann::json& value) {
  rewrite_metadata(path, [&](auto& metadata) {
    nlohmann::json j = nlohmann::json::parse(metadata.at(entry));
    j[key] = value;
    metadata[entry] = j.dump();
  });
}
}  // namespace

// A run stopped (or its disk full) between a new best's checkpoint and its best.safetensors left a
// checkpoint of the best step and no best model of it: the resume writes the best from that
// checkpoint, with a note, instead of losing it (the next validation need not beat it).
TEST(CliAttack, ABestModelNotWrittenIsWrittenFromItsCheckpoint) {
  const std::string d = fresh_dir("attack39_best");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 2 --run " + d + "/r").code, 0);
  const train::Checkpoint ck = train::read_checkpoint_header(d + "/r/checkpoint.safetensors");
  EXPECT_EQ(ck.best_step, 2);
  const std::string model = slurp(d + "/r/checkpoint.safetensors");
  fs::remove(d + "/r/best.safetensors");  // the second write never happened
  const CliRun resumed = run("train --resume " + d + "/r/checkpoint.safetensors --steps 4");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("note: " + d + "/r/best.safetensors was not written at step 2 (the run was stopped, or "
                                            "its disk full, between the checkpoint and the best model): written now "
                                            "from " + d + "/r/checkpoint.safetensors, which is of that step"),
            std::string::npos)
      << resumed.out;
  ASSERT_TRUE(fs::exists(d + "/r/best.safetensors"));
  const train::Checkpoint best = train::read_checkpoint_header(d + "/r/best.safetensors");
  if (best.step == 2) EXPECT_EQ(slurp(d + "/r/best.safetensors"), model);  // else a better one at step 4 replaced it

  // a best_step that is not the best validation's is an edited file's; a number with a space before it too
  fs::copy_file(d + "/r/checkpoint.safetensors", d + "/edited.safetensors");
  set_metadata(d + "/edited.safetensors", "best_step", "9");
  const CliRun late = run("eval --checkpoint " + d + "/edited.safetensors --data " + attack27_data());
  EXPECT_EQ(late.code, 1) << late.err;
  EXPECT_NE(late.err.find("'best_step' is 9: the step of the best validation, from 0 to the checkpoint's step 4"),
            std::string::npos)
      << late.err;
  set_metadata(d + "/edited.safetensors", "best_step", "2");
  set_metadata(d + "/edited.safetensors", "step", " 4");
  const CliRun spaced = run("eval --checkpoint " + d + "/edited.safetensors --data " + attack27_data());
  EXPECT_EQ(spaced.code, 1) << spaced.err;
  EXPECT_NE(spaced.err.find("'step' is ' 4', not a number in range"), std::string::npos) << spaced.err;
}

// Each record and summary names the run that wrote it: a checkpoint or a metrics file of another
// run copied into a run's folder is refused on resume (the two runs' histories would join in one
// file), before anything is written; a summary of another run too.
TEST(CliAttack, RecordsOfAnotherRunAreNotContinued) {
  const std::string d = fresh_dir("attack39_records");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-limit 8 --steps 4";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --run " + d + "/g").code, 0);
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --seed 2 --run " + d + "/s").code, 0);
  const std::string g_id = train::read_checkpoint_header(d + "/g/checkpoint.safetensors").run_id;
  const std::string s_id = train::read_checkpoint_header(d + "/s/checkpoint.safetensors").run_id;
  EXPECT_NE(slurp(d + "/g/metrics.jsonl").find("\"run\":\"" + g_id + "\""), std::string::npos);
  EXPECT_NE(slurp(d + "/g/summary.json").find("\"run_id\": \"" + g_id + "\""), std::string::npos);

  // another run's checkpoint in g's folder
  fs::copy(d + "/g", d + "/a", fs::copy_options::recursive);
  fs::copy_file(d + "/s/checkpoint.safetensors", d + "/a/checkpoint.safetensors", fs::copy_options::overwrite_existing);
  fs::remove(d + "/a/best.safetensors");
  const std::string before = slurp(d + "/a/metrics.jsonl");
  const CliRun checkpoint = run("train --resume " + d + "/a/checkpoint.safetensors --steps 6");
  EXPECT_EQ(checkpoint.code, 2) << checkpoint.err;
  EXPECT_NE(checkpoint.err.find(d + "/a/metrics.jsonl line 1 is a record of run \"" + g_id + "\", but checkpoint " + d +
                                "/a/checkpoint.safetensors is of run " + s_id +
                                ": a checkpoint and records of two runs"),
            std::string::npos)
      << checkpoint.err;
  EXPECT_EQ(slurp(d + "/a/metrics.jsonl"), before);
  // and into a new folder: nothing made
  const CliRun branch = run("train --resume " + d + "/a/checkpoint.safetensors --steps 6 --run " + d + "/a2");
  EXPECT_EQ(branch.code, 2) << branch.err;
  EXPECT_FALSE(fs::exists(d + "/a2"));

  // another run's metrics in g's folder
  fs::copy(d + "/g", d + "/b", fs::copy_options::recursive);
  fs::copy_file(d + "/s/metrics.jsonl", d + "/b/metrics.jsonl", fs::copy_options::overwrite_existing);
  const CliRun metrics = run("train --resume " + d + "/b/checkpoint.safetensors --steps 6");
  EXPECT_EQ(metrics.code, 2) << metrics.err;
  EXPECT_NE(metrics.err.find("is a record of run \"" + s_id + "\""), std::string::npos) << metrics.err;

  // another run's summary, the records gone
  fs::copy(d + "/g", d + "/c", fs::copy_options::recursive);
  fs::remove(d + "/c/metrics.jsonl");
  fs::copy_file(d + "/s/summary.json", d + "/c/summary.json", fs::copy_options::overwrite_existing);
  const CliRun summary = run("train --resume " + d + "/c/checkpoint.safetensors --steps 6");
  EXPECT_EQ(summary.code, 2) << summary.err;
  EXPECT_NE(summary.err.find(d + "/c/summary.json is the summary of run \"" + s_id + "\""), std::string::npos)
      << summary.err;

  // g itself goes on
  EXPECT_EQ(run("train --resume " + d + "/g/checkpoint.safetensors --steps 6").code, 0);
}

// Messages of the thirty-ninth attack: an edited task or class count is the checkpoint's, a copy
// of the newest checkpoint is no rewind, an immutable run file is refused before the first step.
TEST(CliAttack, EditedCheckpointsAndCopiesAreSaidAsSuch) {
  const std::string d = fresh_dir("attack39_said");
  const std::string every = " --checkpoint-every 2 --steps 2";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --run " + d + "/r").code, 0);
  fs::copy_file(d + "/r/checkpoint.safetensors", d + "/task.safetensors");
  set_in_metadata(d + "/task.safetensors", "train", "task", "nope");
  const CliRun task = run("eval --checkpoint " + d + "/task.safetensors");
  EXPECT_EQ(task.code, 1) << task.err;
  EXPECT_NE(task.err.find(d + "/task.safetensors: corrupt checkpoint metadata: 'train' metadata: 'task' is 'nope', no "
                              "task of cast"),
            std::string::npos)
      << task.err;
  fs::copy_file(d + "/r/checkpoint.safetensors", d + "/classes.safetensors");
  set_in_metadata(d + "/classes.safetensors", "model", "classes", 3);
  const CliRun classes = run("eval --checkpoint " + d + "/classes.safetensors --data " + attack27_data());
  EXPECT_EQ(classes.code, 1) << classes.err;
  EXPECT_NE(classes.err.find(d + "/classes.safetensors: corrupt checkpoint metadata: 'model' metadata: 3 classes, but "
                                 "task listops-short has 10"),
            std::string::npos)
      << classes.err;

  fs::copy_file(d + "/r/checkpoint.safetensors", d + "/r/mine.safetensors");
  const CliRun copy = run("train --resume " + d + "/r/mine.safetensors --steps 4");
  EXPECT_EQ(copy.code, 2) << copy.err;
  EXPECT_NE(copy.err.find("--resume " + d + "/r/mine.safetensors is a copy of step 2 beside run " + d +
                          "/r's own checkpoint " + d + "/r/checkpoint.safetensors, of that step"),
            std::string::npos)
      << copy.err;
  fs::remove(d + "/r/mine.safetensors");

  // an immutable summary (where the file system keeps the attribute)
  if (std::system(("chattr +i " + d + "/r/summary.json 2> /dev/null").c_str()) == 0) {
    const CliRun fixed = run("train --resume " + d + "/r/checkpoint.safetensors --steps 4");
    std::system(("chattr -i " + d + "/r/summary.json").c_str());
    EXPECT_EQ(fixed.code, 2) << fixed.err;
    EXPECT_NE(fixed.err.find(d + "/r/summary.json: is immutable (chattr +i), so it cannot be replaced"),
              std::string::npos)
        << fixed.err;
    EXPECT_EQ(train::read_checkpoint_header(d + "/r/checkpoint.safetensors").step, 2);  // no step taken
  }
}

// ---- the thirty-ninth attack (signals, settings, messages)

// A --max-len far above the data's longest example is sized by that example, not refused for
// memory the run never takes (a batch is padded to its longest example); a benchmark's memory
// refusal names the attention and its cluster options; a data set inside another is refused (the
// outer set's next cast data took its files for edits); a seed may carry a '+' as every other
// whole number may; a limit the libraries take nearly whole is said as such, not as the batch.
TEST(CliAttack, RefusalsSayWhatTakesTheMemoryAndSetsNestNot) {
  const std::string d = fresh_dir("attack39_settings");
  const CliRun long_max = run("train --data " + attack27_data() + kTinyModel +
                              " --steps 1 --eval-limit 8 --max-len 1000000 --run " + d + "/ml");
  EXPECT_EQ(long_max.code, 0) << long_max.err;

  const CliRun bench = run("bench attention --device cpu --lengths 1048576 --mechanisms cast-topk --repeats 1 --warmup 0");
  EXPECT_EQ(bench.code, 1) << bench.err;
  EXPECT_NE(bench.err.find("the attention layer takes all of it: lower --lengths or --batch, or --clusters or "
                           "--cluster-size"),
            std::string::npos)
      << bench.err;

  ASSERT_EQ(run("data listops-short --count 40 --out " + d + "/D").code, 0);
  const CliRun nested = run("data listops-short --count 10 --out " + d + "/D/sub");
  EXPECT_EQ(nested.code, 2) << nested.err;
  EXPECT_NE(nested.err.find("data folder " + d + "/D/sub: is inside the data set " + d + "/D"), std::string::npos)
      << nested.err;
  EXPECT_FALSE(fs::exists(d + "/D/sub"));
  EXPECT_EQ(run("data listops-short --count 40 --out " + d + "/D").code, 0);  // made again, as before

  const CliRun plus = run("compare --data " + attack27_data() + kTinyModel +
                          " --steps 1 --eval-limit 8 --attention full --seeds +1,1 --out " + d + "/c");
  EXPECT_EQ(plus.code, 2) << plus.err;
  EXPECT_NE(plus.err.find("--seeds: seed 1 is listed twice ('+1,1')"), std::string::npos) << plus.err;

  // where this machine's libraries leave room under the limit the step runs; where not, the line
  // says the libraries and their buffers take the limit, and asks for no smaller batch
  const std::string err = d + "/err";
  const int status = std::system(("ulimit -v 1250000; OMP_NUM_THREADS=2 timeout 60 " + std::string(CAST_BINARY) +
                                  " train --data " + attack27_data() + kTinyModel + " --steps 1 --eval-limit 8 --run " +
                                  d + "/uv > /dev/null 2> " + err)
                                     .c_str());
  const std::string said = slurp(err);
  if (WEXITSTATUS(status) != 0) {
    EXPECT_NE(said.find("beside what this process has mapped already (its libraries), where the BLAS's work "
                        "buffers alone need 384 MiB (2 threads: 128 MiB each and one more): raise the limit by "
                        "about"),
              std::string::npos)
        << said;
    EXPECT_EQ(said.find("--batch"), std::string::npos) << said;
  }
}

// ---- the fortieth attack (files, runs, resume)

namespace {
// Every record of a metrics file with its "run" taken out, as an older cast wrote them.
void strip_run_ids(const std::string& metrics) {
  std::istringstream in(slurp(metrics));
  std::string out;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    j.erase("run");
    out += j.dump() + "\n";
  }
  put(metrics, out);
}
void remove_metadata(const std::string& path, const std::string& key) {
  rewrite_metadata(path, [&](auto& metadata) { metadata.erase(key); });
}
}  // namespace

// A branch is a run of its own: it draws its own id, and the records and best model it takes
// along are given it; so the branch's best or records copied back into the run it came from are
// refused there. A checkpoint of an older cast (no id) gives its records one derived from it, the
// same at every resume; one whose id was taken out while its records keep theirs is refused.
TEST(CliAttack, ABranchIsARunOfItsOwn) {
  const std::string d = fresh_dir("attack40_branch");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 4 --run " + d + "/o").code, 0);
  ASSERT_EQ(run("train --resume " + d + "/o/checkpoint.safetensors --steps 8 --run " + d + "/br").code, 0);
  const std::string o_id = train::read_checkpoint_header(d + "/o/checkpoint.safetensors").run_id;
  const std::string br_id = train::read_checkpoint_header(d + "/br/checkpoint.safetensors").run_id;
  EXPECT_NE(o_id, br_id);
  EXPECT_EQ(train::read_checkpoint_header(d + "/br/best.safetensors").run_id, br_id);
  EXPECT_EQ(slurp(d + "/br/metrics.jsonl").find(o_id), std::string::npos);  // its history under its own id
  EXPECT_EQ(run("plot " + d + "/br --out " + d + "/br.svg").code, 0);

  ASSERT_EQ(run("train --resume " + d + "/o/checkpoint.safetensors --steps 6").code, 0);
  fs::copy(d + "/o", d + "/o2", fs::copy_options::recursive);
  fs::copy_file(d + "/br/best.safetensors", d + "/o/best.safetensors", fs::copy_options::overwrite_existing);
  const CliRun best = run("train --resume " + d + "/o/checkpoint.safetensors --steps 10 --eval-best");
  EXPECT_EQ(best.code, 2) << best.err;
  EXPECT_NE(best.err.find(d + "/o/best.safetensors is of another run than this one (its run id is " + br_id),
            std::string::npos)
      << best.err;
  fs::copy_file(d + "/br/metrics.jsonl", d + "/o2/metrics.jsonl", fs::copy_options::overwrite_existing);
  const CliRun records = run("train --resume " + d + "/o2/checkpoint.safetensors --steps 10");
  EXPECT_EQ(records.code, 2) << records.err;
  EXPECT_NE(records.err.find("is a record of run \"" + br_id + "\""), std::string::npos) << records.err;

  // an older cast's run: no ids anywhere; two resumes give their records one id
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 2 --run " + d + "/old").code, 0);
  for (const char* file : {"/old/checkpoint.safetensors", "/old/best.safetensors"}) {
    remove_metadata(d + file, "run_id");
    remove_metadata(d + file, "best_step");
  }
  strip_run_ids(d + "/old/metrics.jsonl");
  fs::remove(d + "/old/summary.json");
  fs::copy(d + "/old", d + "/old_again", fs::copy_options::recursive);
  ASSERT_EQ(run("train --resume " + d + "/old/checkpoint.safetensors --steps 4").code, 0);
  const std::string derived = train::read_checkpoint_header(d + "/old/checkpoint.safetensors").run_id;
  EXPECT_EQ(derived.size(), 16u);
  // a process that resumed the same checkpoint and was killed left its records: the same id
  ASSERT_EQ(run("train --resume " + d + "/old_again/checkpoint.safetensors --steps 4").code, 0);
  EXPECT_EQ(train::read_checkpoint_header(d + "/old_again/checkpoint.safetensors").run_id, derived);

  // a new checkpoint whose id was taken out, beside records that keep theirs
  fs::copy(d + "/o", d + "/cut", fs::copy_options::recursive);
  fs::remove(d + "/cut/best.safetensors");
  remove_metadata(d + "/cut/checkpoint.safetensors", "run_id");
  const CliRun cut = run("train --resume " + d + "/cut/checkpoint.safetensors --steps 10");
  EXPECT_EQ(cut.code, 2) << cut.err;
  EXPECT_NE(cut.err.find("or a checkpoint whose run id was taken out"), std::string::npos) << cut.err;
}

// A finished run a comparison reports is held to the same rule: another run's summary, records
// or checkpoint in its folder is refused, not reported as the comparison's.
TEST(CliAttack, AComparisonReportsOnlyItsOwnRuns) {
  const std::string d = fresh_dir("attack40_compare");
  const std::string cmp = "compare --data " + attack27_data() + kTinyModel + " --steps 2 --eval-limit 8 --attention full --out " + d + "/c";
  ASSERT_EQ(run(cmp).code, 0);
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + " --steps 2 --eval-limit 8 --attention full --seed 7 --run " +
                d + "/other")
                .code,
            0);
  const std::string results = slurp(d + "/c/results.md");
  for (const char* file : {"/summary.json", "/metrics.jsonl"}) {
    fs::copy(d + "/c", d + "/keep", fs::copy_options::recursive);
    fs::copy_file(d + "/other" + std::string(file), d + "/c/full-seed1" + file, fs::copy_options::overwrite_existing);
    const CliRun again = run(cmp);
    EXPECT_EQ(again.code, 2) << file << ": " << again.err;
    EXPECT_NE(again.err.find("of run \""), std::string::npos) << again.err;
    EXPECT_EQ(slurp(d + "/c/results.md"), results);
    fs::remove_all(d + "/c");
    fs::rename(d + "/keep", d + "/c");
  }
}

// Messages and modes of the fortieth attack: a best model of another step than the checkpoint's
// best validation; a summary written again keeps the run's private mode; a resume notes a cut
// last line and an emptied history; a metrics file of two runs is no figure; a malformed run id
// is said as such; --trace at a lock file's name and an append-only folder refused before work.
TEST(CliAttack, BestStepsModesAndNotesOfTheFortiethAttack) {
  const std::string d = fresh_dir("attack40_notes");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 4 --run " + d + "/r").code, 0);
  const train::Checkpoint ck = train::read_checkpoint_header(d + "/r/checkpoint.safetensors");
  const int64_t best_step = train::read_checkpoint_header(d + "/r/best.safetensors").step;
  ASSERT_EQ(ck.best_step, best_step);

  fs::copy(d + "/r", d + "/b", fs::copy_options::recursive);
  fs::remove(d + "/b/summary.json");
  set_metadata(d + "/b/checkpoint.safetensors", "best_step", best_step == 2 ? "0" : "2");
  const CliRun edited = run("train --resume " + d + "/b/checkpoint.safetensors --steps 6 --eval-best");
  EXPECT_EQ(edited.code, 2) << edited.err;
  EXPECT_NE(edited.err.find(fmt::format("(it is of step {}, but the checkpoint's best validation was at step {}",
                                        best_step, best_step == 2 ? 0 : 2)),
            std::string::npos)
      << edited.err;

  fs::copy(d + "/r", d + "/p", fs::copy_options::recursive);
  for (const auto& entry : fs::directory_iterator(d + "/p"))
    fs::permissions(entry.path(), fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_EQ(run("train --resume " + d + "/p/checkpoint.safetensors --steps 6").code, 0);
  EXPECT_EQ(fs::status(d + "/p/summary.json").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);

  fs::copy(d + "/r", d + "/t", fs::copy_options::recursive);
  fs::remove(d + "/t/summary.json");
  const std::string text = slurp(d + "/t/metrics.jsonl");
  put(d + "/t/metrics.jsonl", text.substr(0, text.size() - 10));
  const CliRun cut = run("train --resume " + d + "/t/checkpoint.safetensors --steps 6");
  EXPECT_EQ(cut.code, 0) << cut.err;
  EXPECT_NE(cut.out.find("note: the last line of " + d + "/t/metrics.jsonl was cut short"), std::string::npos) << cut.out;
  fs::copy(d + "/r", d + "/e", fs::copy_options::recursive);
  put(d + "/e/metrics.jsonl", "");
  const CliRun emptied = run("train --resume " + d + "/e/checkpoint.safetensors --steps 6");
  EXPECT_EQ(emptied.code, 0) << emptied.err;
  EXPECT_NE(emptied.out.find("note: " + d + "/e/metrics.jsonl holds no records up to step 4"), std::string::npos)
      << emptied.out;

  fs::copy(d + "/r", d + "/m", fs::copy_options::recursive);
  std::string lines = slurp(d + "/m/metrics.jsonl");
  lines.replace(lines.find(ck.run_id), 16, "0123456789abcdef");
  put(d + "/m/metrics.jsonl", lines);
  const CliRun mixed = run("plot " + d + "/m --out " + d + "/m.svg");
  EXPECT_EQ(mixed.code, 1) << mixed.err;
  EXPECT_NE(mixed.err.find("two runs' records in one file"), std::string::npos) << mixed.err;
  lines.replace(lines.find("0123456789abcdef"), 16, "ZZZZ");
  put(d + "/m/metrics.jsonl", lines);
  fs::remove(d + "/m/summary.json");
  const CliRun malformed = run("train --resume " + d + "/m/checkpoint.safetensors --steps 6");
  EXPECT_EQ(malformed.code, 2) << malformed.err;
  EXPECT_NE(malformed.err.find("'run' is \"ZZZZ\", not a run id"), std::string::npos) << malformed.err;

  const CliRun lock = run("train --data " + attack27_data() + kTinyModel + " --steps 2 --run " + d + "/lt --trace " + d +
                          "/lt/.cast.lock");
  EXPECT_EQ(lock.code, 2) << lock.err;
  EXPECT_NE(lock.err.find("is the name of a folder's lock file (.cast.lock)"), std::string::npos) << lock.err;
  EXPECT_FALSE(fs::exists(d + "/lt/checkpoint.safetensors"));

  fs::create_directories(d + "/ao");
  if (std::system(("chattr +a " + d + "/ao 2> /dev/null").c_str()) == 0) {
    const CliRun appending = run("train --data " + attack27_data() + kTinyModel + " --steps 2 --run " + d + "/ao");
    std::system(("chattr -a " + d + "/ao").c_str());
    EXPECT_EQ(appending.code, 1) << appending.err;
    EXPECT_NE(appending.err.find("is append-only (chattr +a), so no file in it can be replaced; nothing was written"),
              std::string::npos)
        << appending.err;
    EXPECT_TRUE(fs::is_empty(d + "/ao")) << appending.err;
  }
}

// ---- the fortieth attack (signals, settings, messages)

// cast eval under an address-space limit that leaves the BLAS no room for its buffers is refused
// with the limit's line (it spun in OpenBLAS's malloc, past SIGTERM); a config file's unknown task
// names the file; a cluster count beyond the data's longest sequence is refused whatever --max-len.
TEST(CliAttack, EvalUnderALimitConfigTasksAndClustersOfTheData) {
  const std::string d = fresh_dir("attack40_eval");
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + " --steps 2 --eval-limit 8 --run " + d + "/r").code, 0);
  const std::string err = d + "/err";
  const int status = std::system(("ulimit -v 1150000; OMP_NUM_THREADS=2 timeout 60 " + std::string(CAST_BINARY) +
                                  " eval --checkpoint " + d + "/r/checkpoint.safetensors --data " + attack27_data() +
                                  " > /dev/null 2> " + err)
                                     .c_str());
  const int code = WEXITSTATUS(status);
  EXPECT_NE(code, 124) << "timed out: " << slurp(err);
  if (code != 0)  // where the libraries leave the buffers room, it evaluates
    EXPECT_NE(slurp(err).find("where the BLAS's work buffers alone need 384 MiB (2 threads"), std::string::npos)
        << slurp(err);

  put(d + "/task.json", R"({"steps": 1, "task": "bogus"})");
  for (const std::string command : {"train --device cpu --run " + d + "/t", "compare --device cpu --out " + d + "/c"}) {
    const CliRun r = run(command + " --config " + d + "/task.json");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("config file " + d + "/task.json: unknown task 'bogus'"), std::string::npos) << r.err;
  }

  const CliRun clusters = run("train --data " + attack27_data() + kTinyModel +
                              " --steps 1 --clusters 200 --max-len 2000 --run " + d + "/cl");
  EXPECT_EQ(clusters.code, 2) << clusters.err;
  EXPECT_NE(clusters.err.find("setting 'clusters' is 200: more than the"), std::string::npos) << clusters.err;
  EXPECT_FALSE(fs::exists(d + "/cl"));
}

// ---- the forty-first attack

// A best model of the checkpoint's own best step that cannot be read is written again from the
// checkpoint, with a note (it was left, and refused for good once the checkpoint moved on); a
// record with no run id after records with one is refused by the figure; a compare --config's
// mechanisms are checked under --attention's; help needs no room for the BLAS; training on an
// unfinished set names the command that finishes it.
TEST(CliAttack, BrokenBestsLoneRecordsConfigMechanismsAndUnfinishedSets) {
  const std::string d = fresh_dir("attack41");
  const std::string every = " --eval-every 2 --checkpoint-every 2 --eval-limit 8";
  ASSERT_EQ(run("train --data " + attack27_data() + kTinyModel + every + " --steps 2 --run " + d + "/r").code, 0);
  const std::string model = slurp(d + "/r/checkpoint.safetensors");
  fs::resize_file(d + "/r/best.safetensors", 100);
  const CliRun resumed = run("train --resume " + d + "/r/checkpoint.safetensors --steps 4 --eval-best");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("note: " + d + "/r/best.safetensors could not be read as the best model of step 2 ("),
            std::string::npos)
      << resumed.out;
  EXPECT_NO_THROW(read_safetensors(d + "/r/best.safetensors"));
  // the checkpoint of step 2 itself, unless the validation at step 4 found a better model
  if (train::read_checkpoint_header(d + "/r/best.safetensors").step == 2)
    EXPECT_EQ(slurp(d + "/r/best.safetensors"), model);

  std::string lines = slurp(d + "/r/metrics.jsonl");
  const size_t second = lines.find('\n') + 1;
  const std::string line2 = lines.substr(second, lines.find('\n', second) - second);
  nlohmann::json j = nlohmann::json::parse(line2);
  j.erase("run");
  lines.replace(second, line2.size(), j.dump());
  put(d + "/lone.jsonl", lines);
  fs::create_directories(d + "/lone");
  put(d + "/lone/metrics.jsonl", lines);
  const CliRun lone = run("plot " + d + "/lone --out " + d + "/lone.svg");
  EXPECT_EQ(lone.code, 1) << lone.err;
  EXPECT_NE(lone.err.find("a record with no run id after line 1"), std::string::npos) << lone.err;

  put(d + "/cfg.json", R"({"attention": "full,bogus"})");
  const CliRun mechanisms = run("compare --data " + attack27_data() + kTinyModel +
                                " --steps 1 --attention full --out " + d + "/c --config " + d + "/cfg.json");
  EXPECT_EQ(mechanisms.code, 2) << mechanisms.err;
  EXPECT_NE(mechanisms.err.find("config file " + d + "/cfg.json: setting 'attention': "), std::string::npos)
      << mechanisms.err;
  EXPECT_NE(mechanisms.err.find("bogus"), std::string::npos) << mechanisms.err;
  EXPECT_FALSE(fs::exists(d + "/c"));

  const int help = std::system(("ulimit -v 1100000; OMP_NUM_THREADS=2 " + std::string(CAST_BINARY) +
                                " train --help > /dev/null 2> " + d + "/help_err")
                                   .c_str());
  EXPECT_EQ(WEXITSTATUS(help), 0) << slurp(d + "/help_err");

  ASSERT_EQ(run("data listops-short --count 40 --out " + d + "/u").code, 0);
  put(d + "/u/.cast-data-unfinished",
      "cast data is writing this data set\nkind: ListOps\nsettings: x\ncommand: cast data listops-short --count 40\n");
  const CliRun unfinished = run("train --data " + d + "/u" + kTinyModel + " --steps 1 --run " + d + "/t");
  EXPECT_EQ(unfinished.code, 1) << unfinished.err;
  EXPECT_NE(unfinished.err.find("finish it with `cast data listops-short --count 40 --out " + d + "/u`"),
            std::string::npos)
      << unfinished.err;
}
