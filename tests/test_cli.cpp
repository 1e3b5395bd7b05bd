// The binary as a user meets it: exit codes, one-line errors on stderr, --help, JSON configs.
#include <sys/wait.h>
#include <csignal>
#include <cmath>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tensor/safetensors.h"
#include "tests/test_util.h"
#include "datasets/data.h"
#include "nn/transformer.h"
#include "train/settings.h"
#include "train/trainer.h"

using cast::testing::slurp;

namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out, err;
};

static CliRun run(const std::string& args) {
  // ctest runs tests side by side: each call gets its own output files
  static int calls = 0;
  const auto dir = fs::temp_directory_path();
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(calls++);
  const std::string out = (dir / ("cast_cli_out_" + tag)).string(), err = (dir / ("cast_cli_err_" + tag)).string();
  const std::string cmd = std::string(CAST_BINARY) + " " + args + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

static int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, HelpShowsDefaultsAndExamples) {
  CliRun train = run("train --help");
  EXPECT_EQ(train.code, 0);
  // per-task defaults from the presets themselves
  EXPECT_NE(train.out.find("--steps <value>                training steps; default 5000 (listops-short 1200, "
                           "text 20000"),
            std::string::npos)
      << train.out;
  EXPECT_NE(train.out.find("--attention <value>            full | cast | clustered | iclustered; default cast"),
            std::string::npos);
  EXPECT_EQ(train.out.find("; default \n"), std::string::npos) << "a setting without its default";
  CliRun bench = run("bench --help");
  EXPECT_NE(bench.out.find("usage: cast bench attention|train|flash|gemm"), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("cast bench attention --lengths"), std::string::npos);
  EXPECT_NE(bench.out.find("cast bench train --task"), std::string::npos);
  for (const char* command :
       {"train", "compare", "eval", "data", "clusters", "attention", "plot", "layer", "bench", "info", "demo"}) {
    CliRun help = run(std::string(command) + " --help");
    EXPECT_EQ(help.code, 0) << command;
    EXPECT_NE(help.out.find("examples:\n  cast " + std::string(command)), std::string::npos) << command << ":\n"
                                                                                             << help.out;
  }
}

TEST(Cli, SettingsOutOfRangeAreUsageErrorsBeforeAnyWork) {
  // each of these once crashed (SIGFPE) or silently meant something else
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --heads 0", "setting 'heads' is 0: it must be in [1, 1024]"},
      {"train --log-every 0", "setting 'log-every' is 0"},
      {"train --summaries yes", "setting 'summaries' is 'yes': it must be one of on | off"},
      {"train --pooling avg", "setting 'pooling' is 'avg'"},
      {"train --cast-heads all", "setting 'cast-heads' is 'all'"},
      {"train --dropout 1.5", "setting 'dropout' is 1.5: it must be in [0, 1)"},
      {"train --attention iclustered --topk 0", "setting 'topk' is 0"},
      {"train --steps 12x", "--steps expects an integer, got '12x'"},
      {"bench attention --lengths 0", "--lengths: 0 is outside [1, 1048576]"},
      {"bench attention --lengths 64,064", "--lengths: 64 is listed twice ('64,064')"},
      {"eval --checkpoint x --attention clustered --clusters 4,04", "--clusters: 4 is listed twice ('4,04')"},
      {"bench attention --lengths 8 --trace -", "--trace -: the trace goes to standard output with --trace alone"},
      {"bench attention --repeats 0", "--repeats is 0"},
      {"bench attention --mechanisms bogus", "--mechanisms: unknown 'bogus'"},
      {"data listops --count -1", "--count is -1: it must be in [0, 10000000]"},
      {"data pathfinder --count 99999999", "--count is 99999999: it must be in [0, 1000000]"},
      {"data pathfinder --max-length 100", "--max-length and --min-length are ListOps options"},
      {"data listops --max-length 40 --min-length 39", "strictly between the shortest (39) and the longest (40): none"},
      {"data listops --max-length 3", "strictly between the shortest (0, a quarter of --max-length 3) and the longest (3)"},
      {"compare --task bogus", "unknown task 'bogus'"},
      {"train --task bogus", "unknown task 'bogus'"},
      {"compare --vary precision=fp32,fp16", "setting 'precision' is 'fp16': it must be one of fp32 | tf32 | bf16"},
      {"train --precision bf16 --device cpu", "setting 'precision' is bf16: the CPU computes in fp32 only"},
      {"bench attention --precision tf32 --device cpu", "--precision is tf32: the CPU computes in fp32 only"},
      {"bench attention --precision fp16", "precision 'fp16' is not one of fp32, tf32, bf16"},
      {"bench flash --device cpu", "cast bench flash times the GPU's flash kernels: it needs --device cuda"},
      {"bench train --fp32-flash tf32x3", "--fp32-flash tf32x3 chooses the GPU's kernel at --precision fp32"},
      {"bench train --fp32-flash bf16 --device cuda", "--fp32-flash must be one of fma|tf32x3, got 'bf16'"},
      {"bench gemm --fp32-flash fma", "--fp32-flash is an option of cast bench"},
      {"bench train --bf16-gemm fast16bf --device cuda", "--bf16-gemm fast16bf chooses how the GPU's matmuls take"},
      {"bench train --bf16-gemm fp16 --device cuda --precision bf16", "--bf16-gemm must be one of copies|fast16bf"},
      {"bench flash --bf16-gemm copies", "--bf16-gemm is an option of cast bench"},
      {"bench train --head-projections permuted", "--head-projections permuted chooses how the GPU lays out the heads"},
      {"bench flash --head-projections permuted --device cuda", "--head-projections is an option of cast bench"},
      {"data listops --seed -3", "--seed is -3"},
      {"compare --seeds 1,x", "--seeds: 'x' is not a seed"},
      {"compare --seeds 99999999999999999999", "--seeds: 99999999999999999999 is out of range"},
      {"bench gemm --device cuda", "--device cuda: cast bench gemm measures the CPU's BLAS"},
      {"compare --seeds 1,,2", "--seeds: '1,,2' has an empty item"},
      {"compare --attention full,full", "--attention: 'full' is listed twice"},
      {"compare --attention full,bogus", "unknown mechanism 'bogus'"},
      {"compare --vary summaries", "--vary expects SETTING=V1,V2,..., got 'summaries'"},
      {"compare --vary colour=red,blue", "'colour' is not a setting of cast train"},
      {"compare --vary heads=2,two", "setting 'heads': 'two' is not a whole number"},
      {"compare --vary summaries=on,maybe", "setting 'summaries' is 'maybe': it must be one of on | off"},
      {"compare --vary seed=1,2", "--vary seed: use --attention, --seeds or --out for that"},
      {"compare --attention cast,full --vary f=softmax,laplace",
       "--attention names one mechanism when --vary is given"},
      {"compare --heads 0", "setting 'heads' is 0"},
      {"layer --in x --clusters -1", "--clusters is -1"},
      {"layer --in x --iterations -5", "--iterations is -5"},
      {"layer --in x --seed -1", "--seed is -1"},
      {"eval --checkpoint x --eval-limit -2", "--eval-limit is -2"},
  };
  for (const auto& [args, message] : cases) {
    CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
  }
}

TEST(Cli, WorkTooBigForTheMachineStopsBeforeAllocating) {
  // the README's `cast bench train --task text` once grew until the kernel killed it
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"bench train --task text --batch-size 4096",
            "a full training step of batch 4096 at length 4096 needs about"},
           {"bench attention --lengths 1048576 --batch 512 --mechanisms full",
            "full attention at N 1048576 (batch 512"},
           {"train --task listops-short --batch 1048576 --dim 1024 --mlp-dim 4096 --attention full --run "
            "/tmp/cast_cli_too_big --overwrite",
            "a training step of batch 1048576 at length"}}) {
    // on the CPU the limit is the machine's memory; with --device auto it is the memory of
    // whichever device was picked (a GPU's where one is present)
    for (const std::string device : {"cpu", "auto"}) {
      CliRun r = run(args + " --device " + device);
      EXPECT_EQ(r.code, 1) << args << ": " << r.err;
      EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
      const bool machine = r.err.find("(an estimate that errs high) but this machine has") != std::string::npos;
      const bool gpu = r.err.find("(an estimate that errs high) but the GPU has") != std::string::npos;
      EXPECT_TRUE(device == "cpu" ? machine : machine || gpu) << device << ": " << r.err;
      EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
      EXPECT_EQ(r.out.find("mechanism "), std::string::npos) << "a table was started: " << r.out;
    }
  }
}

TEST(Cli, InfoAndHelp) {
  CliRun info = run("info");
  EXPECT_EQ(info.code, 0);
  for (const char* line : {"cpu:", "vector isa:", "blas:", "openmp:", "cuda:"})
    EXPECT_NE(info.out.find(line), std::string::npos) << line;
  if (!::cast::device_memory::cuda_available())  // GPU settings only where a GPU is
    EXPECT_EQ(info.out.find("TF32"), std::string::npos) << info.out;
  CliRun help = run("--help");
  EXPECT_EQ(help.code, 0);
  for (const char* c : {"train", "eval", "data", "bench", "layer", "clusters", "attention", "info"})
    EXPECT_NE(help.out.find(c), std::string::npos) << c;
  for (const char* c : {"train", "eval", "data", "bench", "layer", "clusters", "info", "demo"}) {
    CliRun h = run(std::string(c) + " --help");
    EXPECT_EQ(h.code, 0) << c;
    EXPECT_NE(h.out.find("usage: cast"), std::string::npos) << c;
  }
}

TEST(Cli, ErrorsAreOneLineWithNonZeroExit) {
  CliRun unknown = run("frobnicate");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(lines(unknown.err), 1) << unknown.err;
  // a command used wrongly exits 2; a command that fails on its input exits 1
  for (auto [args, code] :
       std::vector<std::pair<const char*, int>>{{"eval --checkpoint /nonexistent/c.safetensors", 1},
                                                {"train --steps many", 2},
                                                {"train --bogus 1", 2},
                                                {"layer --in /nonexistent.safetensors --out /tmp/x.safetensors", 1},
                                                {"data --task sudoku", 2},
                                                {"bench --mechanisms full,magic --lengths 8", 2},
                                                {"demo ''", 2},
                                                {"plot /tmp /tmp/ --out /tmp/never.svg", 2}}) {
    CliRun r = run(args);
    EXPECT_EQ(r.code, code) << args;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << args;
  }
}

TEST(Cli, DemoPassesItsGradientChecks) {
  // the op walk; the attention walks are compared with their golden files (tests/test_demo.cpp)
  CliRun demo = run("demo softmax");
  EXPECT_EQ(demo.code, 0) << demo.out;
  EXPECT_NE(demo.out.find("softmax:   ok"), std::string::npos) << demo.out;
  EXPECT_NE(demo.out.find("layernorm: ok"), std::string::npos) << demo.out;
  EXPECT_EQ(demo.out.find("FAIL"), std::string::npos);
}

TEST(Cli, TrainReadsAJsonConfigAndRejectsAWrongOne) {
  const auto dir = fs::temp_directory_path() / ("cast_cli_train_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string data = (dir / "listops").string(), cfg = (dir / "run.json").string();
  ASSERT_EQ(run("data listops-short --out " + data).code, 0);
  std::ofstream(cfg) << R"({"attention": "full", "steps": 3, "dim": 16, "heads": 2, "layers": 1, "mlp-dim": 16,
                          "eval-limit": 20, "device": "cpu"})";
  CliRun ok = run("train --config " + cfg + " --data " + data + " --run " + (dir / "run").string());
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("test accuracy"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "run" / "checkpoint.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "run" / "curves.svg"));
  CliRun ev = run("eval --checkpoint " + (dir / "run" / "checkpoint.safetensors").string() + " --data " + data);
  EXPECT_EQ(ev.code, 0) << ev.err;
  std::ofstream(cfg) << R"({"steps": "three"})";
  CliRun bad = run("train --config " + cfg + " --data " + data);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("setting 'steps' is \"three\": it must be an integer"), std::string::npos) << bad.err;
}

// Standard streams as a careless caller leaves them. stdout on a full device: the command fails
// with one line instead of exiting 0 with its output lost. stdout closed: a run's files never
// take descriptor 1, so the console's lines do not end up in metrics.jsonl; and the lines lost
// are an error said as a closed output (nineteenth attack: eval's accuracies went to /dev/null,
// exit 0), the run's checkpoint kept.
TEST(Cli, StandardStreamsFullOrClosed) {
  const auto dir = fs::temp_directory_path() / ("cast_cli_streams_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string err = (dir / "err").string();
  if (fs::exists("/dev/full")) {
    const int full = std::system((std::string(CAST_BINARY) + " info > /dev/full 2> " + err).c_str());
    EXPECT_TRUE(WIFEXITED(full) && WEXITSTATUS(full) == 1);
    std::ifstream in(err);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("cast info: error: cannot write to standard output"), std::string::npos) << text;
  }
  const std::string data = (dir / "listops").string(), run_dir = (dir / "run").string();
  ASSERT_EQ(run("data listops-short --count 200 --out " + data).code, 0);
  const std::string train = std::string(CAST_BINARY) +
                            " train --steps 3 --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 4 --eval-limit 8 "
                            "--log-every 1 --device cpu --data " +
                            data + " --run " + run_dir + " >&- 2> " + err;
  const int status = std::system(train.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const auto said = [&] {
    std::ifstream in(err);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_NE(said().find("cannot write to standard output after step"), std::string::npos) << said();
  EXPECT_NE(said().find("(it was closed when cast started): checkpoint"), std::string::npos) << said();
  EXPECT_TRUE(fs::exists(run_dir + "/checkpoint.safetensors"));
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines)
    EXPECT_TRUE(nlohmann::json::accept(line)) << "not a JSON line in metrics.jsonl: " << line;
  EXPECT_GE(lines, 1);
  const int eval = std::system((std::string(CAST_BINARY) + " eval --eval-limit 4 --checkpoint " + run_dir +
                                "/checkpoint.safetensors >&- 2> " + err)
                                   .c_str());
  EXPECT_TRUE(WIFEXITED(eval) && WEXITSTATUS(eval) == 1);
  EXPECT_NE(said().find("cast eval: error: cannot write to standard output (it was closed when cast started)"),
            std::string::npos)
      << said();
  // a comparison whose standard output fails says to run the comparison again, not to resume its
  // one run alone, which would leave the others untrained (ninth attack, J5)
  if (fs::exists("/dev/full")) {
    const std::string cmp = std::string(CAST_BINARY) +
                            " compare --steps 3 --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 4 --eval-limit 8 "
                            "--log-every 1 --device cpu --attention full,cast --data " +
                            data + " --out " + (dir / "cmp").string() + " > /dev/full 2> " + err;
    const int code = std::system(cmp.c_str());
    EXPECT_TRUE(WIFEXITED(code) && WEXITSTATUS(code) == 1);
    std::ifstream in(err);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("resume with: cast compare --steps 3"), std::string::npos) << text;
    EXPECT_EQ(text.find("cast train --resume"), std::string::npos) << text;
  }
}

// `--trace` prints the tape: cast layer's one pass, cast train's every step.
TEST(Cli, TracePrintsTheTape) {
  const auto dir = fs::temp_directory_path() / ("cast_cli_trace_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string data_dir = CAST_TEST_DATA_DIR;
  CliRun layer = run("layer --in " + data_dir + "/layer_cast.safetensors --out " + (dir / "out.safetensors").string() +
                     " --attention cast --heads 2 --clusters 3 --cluster-size 3 --trace");
  ASSERT_EQ(layer.code, 0) << layer.err;
  for (const char* want : {"trace layer: forward", "── cast_attention", "cast_attention_fused", "fast cpu",
                           "reference cpu", "trace layer: backward", "nodes, saved"})
    EXPECT_NE(layer.out.find(want), std::string::npos) << want << "\n" << layer.out;
  CliRun steps =
      run("layer --in " + data_dir + "/layer_cast.safetensors --out " + (dir / "steps.safetensors").string() +
          " --attention cast --heads 2 --clusters 3 --cluster-size 3 --trace --reference");
  ASSERT_EQ(steps.code, 0) << steps.err;
  for (const char* want : {"── cluster_topk", "no node", "── intra_cluster_attention", "reference cpu"})
    EXPECT_NE(steps.out.find(want), std::string::npos) << want << "\n" << steps.out;
  const std::string data = (dir / "listops").string();
  ASSERT_EQ(run("data listops-short --count 200 --out " + data).code, 0);
  CliRun train =
      run("train --steps 2 --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 4 --eval-limit 8 --device cpu "
          "--data " +
          data + " --run " + (dir / "run").string() + " --trace");
  ASSERT_EQ(train.code, 0) << train.err;
  for (const char* want : {"trace step 1: forward", "trace step 1: backward", "trace step 2: forward", "cross_entropy",
                           "── cast_attention"})
    EXPECT_NE(train.out.find(want), std::string::npos) << want << "\n" << train.out;
  // cast bench: the trace is never the --json file, and the benchmark's name comes first
  const std::string results = (dir / "bench.jsonl").string();
  CliRun same = run("bench attention --lengths 16 --mechanisms full --repeats 1 --warmup 0 --dim 8 --heads 2 --json " +
                    results + " --trace " + (dir / "." / "bench.jsonl").string());
  EXPECT_EQ(same.code, 2) << same.err;
  EXPECT_FALSE(fs::exists(results));
  CliRun order = run("bench --trace train --lengths 16");
  EXPECT_EQ(order.code, 2) << order.err;
  EXPECT_NE(order.err.find("name the benchmark first"), std::string::npos) << order.err;
  // --trace FILE refuses the run's own files
  CliRun clash =
      run("train --steps 1 --dim 16 --heads 2 --layers 1 --mlp-dim 16 --device cpu --data " + data + " --run " +
          (dir / "run").string() + " --overwrite --trace " + (dir / "run" / "metrics.jsonl").string());
  EXPECT_EQ(clash.code, 2) << clash.err;
  EXPECT_NE(clash.err.find("is the run's own"), std::string::npos) << clash.err;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- Ctrl-C, SIGTERM and resuming
namespace {

// A folder of its own with short ListOps in <dir>/listops.
fs::path lifecycle_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("cast_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_EQ(run("data listops-short --count 400 --out " + (dir / "listops").string()).code, 0);
  return dir;
}

// A tiny full-attention run: one metrics line per step, no checkpoint before the end.
std::string tiny_train(const fs::path& dir, const std::string& run_name, int steps) {
  return fmt::format(
      "train --data {} --run {} --attention full --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 8 "
      "--steps {} --log-every 1 --checkpoint-every 0 --eval-limit 20 --device cpu",
      (dir / "listops").string(), (dir / run_name).string(), steps);
}

int lines_in(const std::string& path) { return lines(slurp(path)); }

// Starts `cast <args>` in the background (after `shell_prefix`, shell commands run first), its
// stderr into `err` and its stdout into `out`; returns its pid.
pid_t start_cast(const std::string& args, const std::string& err, const std::string& shell_prefix = "",
                 const std::string& out = "/dev/null") {
  const pid_t pid = fork();
  if (pid == 0) {
    // as from a terminal, whatever started the tests: a background job of a script starts
    // with SIGINT ignored, and cast (rightly) keeps it ignored
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    const std::string cmd =
        shell_prefix + "exec " + std::string(CAST_BINARY) + " " + args + " > " + out + " 2> " + err + " < /dev/null";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits (at most a minute) until `pid` holds `folder` (its pid in the folder's lock file).
void wait_for_holder(const std::string& folder, pid_t pid) {
  for (int waited = 0; waited < 60000 && slurp(folder + "/.cast.lock") != std::to_string(pid); waited += 2)
    usleep(2000);
}

// Waits (at most two minutes) until `metrics` has `count` lines: false where it never does.
bool wait_for_lines(const std::string& metrics, int count) {
  for (int waited = 0; waited < 120000 && lines_in(metrics) < count; waited += 2) usleep(2000);
  return lines_in(metrics) >= count;
}

// Whether the run `pid` got going (three metrics lines); one that never does is killed, so that
// the test says so instead of waiting on it.
bool under_way(pid_t pid, const std::string& metrics) {
  if (wait_for_lines(metrics, 3)) return true;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return false;
}

// tiny_train with a checkpoint at every step.
std::string checkpointing_train(const fs::path& dir, const std::string& run_name) {
  std::string args = tiny_train(dir, run_name, 100000);
  return args.replace(args.find("--checkpoint-every 0"), 20, "--checkpoint-every 1");
}

// In `dir`, after the shell commands `prepare`: checkpointing_train's run `run_name` in a mount
// namespace of its own, its stderr into err, with `mount` run there once its run is under way;
// its exit code goes into the file code. The system() status of it all.
int train_then_mount(const fs::path& dir, const std::string& prepare, const std::string& run_name,
                     const std::string& mount) {
  const std::string script = fmt::format(
      "cd {0} && {1} && unshare -rm sh -c '{2} {3} > out 2> err < /dev/null & p=$!; n=0; "
      "while [ \"$(cat {4}/metrics.jsonl 2>/dev/null | wc -l)\" -lt 3 ] && [ $n -lt 3000 ]; do sleep 0.02; "
      "n=$((n+1)); done; {5}; wait $p; echo $? > code'",
      dir.string(), prepare, CAST_BINARY, checkpointing_train(dir, run_name), run_name, mount);
  return std::system(script.c_str());
}

// Starts `cast <args>` (after `shell_prefix`), and for each (n, signal) of `plan` waits until
// its run's metrics have n lines and sends the signal; returns the exit status and what it wrote
// to stderr (status −2: it ended before a signal was due).
CliRun interrupt(const std::string& args, const std::string& metrics, const std::vector<std::pair<int, int>>& plan,
                 const std::string& shell_prefix = "") {
  static int calls = 0;
  const std::string err =
      (fs::temp_directory_path() / fmt::format("cast_cli_signal_{}_{}", getpid(), calls++)).string();
  const pid_t pid = start_cast(args, err, shell_prefix);
  int status = 0;
  for (auto [after, signal] : plan) {
    for (int waited = 0; waited < 60000 && lines_in(metrics) < after; waited += 2) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        fs::remove(err);
        return {-2, "", ""};
      }
      usleep(2000);
    }
    kill(pid, signal);
  }
  waitpid(pid, &status, 0);
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, "", slurp(err)};
  fs::remove(err);
  return r;
}

// Every tensor of two safetensors files equal bit for bit.
void expect_same_tensors(const std::string& a, const std::string& b) {
  const cast::TensorFile fa = cast::read_safetensors(a), fb = cast::read_safetensors(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  for (const auto& [name, t] : fa.tensors) {
    ASSERT_TRUE(fb.has(name)) << name;
    const auto x = t.to_double_vector(), y = fb.tensors.at(name).to_double_vector();
    EXPECT_TRUE(x == y) << name << " differs";
  }
}

std::vector<double> train_losses(const std::string& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["split"] == "train") losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

}  // namespace

TEST(Cli, CtrlCSavesACheckpointSaysHowToResumeAndTheResumedRunIsBitIdentical) {
  const fs::path dir = lifecycle_dir("sigint");
  ASSERT_EQ(run(tiny_train(dir, "straight", 600)).code, 0);
  const std::string ckpt = (dir / "stopped" / "checkpoint.safetensors").string();
  const CliRun stopped =
      interrupt(tiny_train(dir, "stopped", 600), (dir / "stopped" / "metrics.jsonl").string(), {{3, SIGINT}});
  ASSERT_EQ(stopped.code, 130) << stopped.err;
  // the signal heard at once (twenty-first attack: a step of 50 s went on without a word), then
  // the stop's own line
  EXPECT_EQ(lines(stopped.err), 2) << stopped.err;
  EXPECT_EQ(stopped.err.rfind("cast: SIGINT: stopping once the step (or evaluation batch) in progress is done and "
                              "saved; send it again to stop at once\n",
                              0),
            0u)
      << stopped.err;
  const std::string resume = "cast train --resume " + ckpt;
  EXPECT_NE(stopped.err.find("stopped by SIGINT after step "), std::string::npos) << stopped.err;
  EXPECT_NE(stopped.err.find("checkpoint " + ckpt + " written; resume with: " + resume + "\n"), std::string::npos)
      << stopped.err;
  ASSERT_TRUE(fs::exists(ckpt));
  EXPECT_FALSE(fs::exists(dir / "stopped" / "summary.json"));
  // the printed command continues the run; it ends as the uninterrupted one, bit for bit
  const CliRun resumed = run(resume.substr(5));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  expect_same_tensors(ckpt, (dir / "straight" / "checkpoint.safetensors").string());
  EXPECT_EQ(train_losses((dir / "stopped" / "metrics.jsonl").string()),
            train_losses((dir / "straight" / "metrics.jsonl").string()));
  fs::remove_all(dir);
}

TEST(Cli, SigtermExits143AndOneSignalDeliveredTwiceStopsOnce) {
  const fs::path dir = lifecycle_dir("sigterm");
  const CliRun term =
      interrupt(tiny_train(dir, "term", 100000), (dir / "term" / "metrics.jsonl").string(), {{3, SIGTERM}});
  EXPECT_EQ(term.code, 143) << term.err;
  EXPECT_NE(term.err.find("stopped by SIGTERM after step "), std::string::npos) << term.err;
  EXPECT_NO_THROW(cast::read_safetensors((dir / "term" / "checkpoint.safetensors").string()));
  // one Ctrl-C delivered twice at once (from the terminal and from a wrapper such as timeout that
  // forwards it; eighth attack): taken as one, so the step is saved and the resume said
  const CliRun twice = interrupt(tiny_train(dir, "twice", 100000), (dir / "twice" / "metrics.jsonl").string(),
                                 {{3, SIGINT}, {3, SIGINT}});
  EXPECT_EQ(twice.code, 130) << twice.err;
  EXPECT_NE(twice.err.find("stopped by SIGINT after step "), std::string::npos) << twice.err;
  EXPECT_NO_THROW(cast::read_safetensors((dir / "twice" / "checkpoint.safetensors").string()));
  // started with SIGINT ignored (a script's background job): Ctrl-C stays ignored, SIGTERM stops it
  const CliRun ignored = interrupt(tiny_train(dir, "ignored", 100000), (dir / "ignored" / "metrics.jsonl").string(),
                                   {{3, SIGINT}, {30, SIGTERM}}, "trap '' INT; ");
  EXPECT_EQ(ignored.code, 143) << ignored.err;
  EXPECT_NE(ignored.err.find("stopped by SIGTERM after step "), std::string::npos) << ignored.err;
  // the terminal gone (SIGHUP) stops the run as SIGTERM does (ninth attack, J4: it died by the signal)
  const CliRun hangup =
      interrupt(tiny_train(dir, "hangup", 100000), (dir / "hangup" / "metrics.jsonl").string(), {{3, SIGHUP}});
  EXPECT_EQ(hangup.code, 129) << hangup.err;
  EXPECT_NE(hangup.err.find("stopped by SIGHUP after step "), std::string::npos) << hangup.err;
  EXPECT_NO_THROW(cast::read_safetensors((dir / "hangup" / "checkpoint.safetensors").string()));
  fs::remove_all(dir);
}

// A second Ctrl-C, well after the first, stops at once (the user will not wait for the step),
// and its line names the checkpoint that is whole and how to resume from it. The steps are slow
// (seconds) so that the second signal comes while one is under way.
TEST(Cli, ASecondCtrlCStopsAtOnceAndNamesTheWholeCheckpoint) {
  const fs::path dir = lifecycle_dir("second_signal");
  const std::string metrics = (dir / "slow" / "metrics.jsonl").string();
  const std::string err = (dir / "err").string();
  const std::string args = fmt::format(
      "train --data {} --run {} --attention full --dim 256 --heads 4 --layers 4 --mlp-dim 1024 --batch 128 --steps 100 "
      "--log-every 1 --checkpoint-every 1 --eval-limit 8 --device cpu",
      (dir / "listops").string(), (dir / "slow").string());
  const pid_t pid = start_cast(args, err);
  wait_for_lines(metrics, 1);
  kill(pid, SIGINT);
  usleep(800000);  // past the half second within which a signal is the first one again
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "status " << status << ": " << said;
  const std::string ckpt = (dir / "slow" / "checkpoint.safetensors").string();
  EXPECT_NE(said.find("cast: stopped at once by a second SIGINT: the last checkpoint written (" + ckpt +
                      ") is whole; resume with: cast train --resume " + ckpt),
            std::string::npos)
      << said;
  EXPECT_NO_THROW(cast::read_safetensors(ckpt));
  for (const auto& entry : fs::directory_iterator(dir / "slow"))
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  fs::remove_all(dir);
}

// A run folder moved while its run goes on (seventeenth attack): the run stops at its next
// write and names where the folder is now, with the resume that works from there; a folder put
// at its old name gets nothing.
TEST(Cli, ARunFolderMovedDuringItsRunIsFoundWhereItWent) {
  const fs::path dir = lifecycle_dir("moved_run");
  const std::string err = (dir / "err").string();
  const std::string args = checkpointing_train(dir, "first");
  const pid_t pid = start_cast(args, err);
  ASSERT_TRUE(under_way(pid, (dir / "first" / "metrics.jsonl").string())) << "the run did not start: " << slurp(err);
  fs::rename(dir / "first", dir / "second");
  // another folder at its name (thirty-seventh attack: the run wrote its checkpoints into it by
  // name, into another run's folder that another process held, and said the folder was moved)
  fs::create_directory(dir / "first");
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err), now = fs::canonical(dir / "second").string();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << said;
  EXPECT_NE(said.find("was moved while the run went on and is now " + now), std::string::npos) << said;
  EXPECT_NE(said.find("resume with: cast train --resume " + now + "/checkpoint.safetensors"), std::string::npos)
      << said;
  EXPECT_TRUE(fs::is_empty(dir / "first")) << said;  // nothing written at the old name
  EXPECT_NO_THROW(cast::read_safetensors(now + "/checkpoint.safetensors"));  // whole, where the line says
  // a comparison's folder moved: the advice is the comparison, from where its folder went
  std::string compare = "compare --out " + (dir / "cmp").string() + args.substr(args.find(" --data"));
  compare.replace(compare.find(" --run "), 7 + (dir / "first").string().size(), "");
  const pid_t cmp_pid = start_cast(compare, err);
  ASSERT_TRUE(under_way(cmp_pid, (dir / "cmp" / "full-seed1" / "metrics.jsonl").string())) << "the comparison did not start: " << slurp(err);
  fs::rename(dir / "cmp", dir / "cmp2");
  waitpid(cmp_pid, &status, 0);
  const std::string cmp_said = slurp(err), cmp_now = fs::canonical(dir / "cmp2").string();
  EXPECT_NE(cmp_said.find("is now " + cmp_now + "/full-seed1"), std::string::npos) << cmp_said;
  EXPECT_NE(cmp_said.find("run the same cast compare again with --out " + cmp_now), std::string::npos) << cmp_said;
  fs::remove_all(dir);
}

// A run folder removed while its run goes on (thirty-eighth attack): the run stops at its next
// write and says the folder was removed, not that it moved to "... (deleted)".
TEST(Cli, ARunFolderRemovedDuringItsRunIsSaidRemoved) {
  const fs::path dir = lifecycle_dir("removed_run");
  const std::string err = (dir / "err").string();
  const std::string args = checkpointing_train(dir, "gone");
  const pid_t pid = start_cast(args, err);
  ASSERT_TRUE(under_way(pid, (dir / "gone" / "metrics.jsonl").string())) << "the run did not start: " << slurp(err);
  std::error_code busy;  // the run may write a file in it meanwhile: removed again
  for (int tries = 0; tries < 100 && fs::exists(dir / "gone"); ++tries) fs::remove_all(dir / "gone", busy);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << said;
  EXPECT_NE(said.find("run folder " + (dir / "gone").string() + ": was removed while the run went on"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("its checkpoints went with it: run the same command again"), std::string::npos) << said;
  EXPECT_EQ(said.find("(deleted)"), std::string::npos) << said;
  EXPECT_FALSE(fs::exists(dir / "gone")) << said;  // nothing made again at its name
  fs::remove_all(dir);
}

// A folder mounted over a run folder while its run goes on (thirty-eighth attack): the run stops
// at its next write, writing nothing into the mounted folder, and says its folder is hidden, not
// that it moved to the same path. Needs a mount namespace of its own (unshare -rm).
TEST(Cli, ARunFolderHiddenByAMountIsSaidHidden) {
  if (std::system("unshare -rm true > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mount namespace here (unshare -rm)";
  const fs::path dir = lifecycle_dir("hidden_run");
  const std::string d = dir.string();
  ASSERT_EQ(train_then_mount(dir, "mkdir other", "hid", "mount --bind other hid"), 0);
  const std::string said = slurp(d + "/err");
  EXPECT_EQ(slurp(d + "/code"), "1\n") << said;
  EXPECT_NE(said.find("run folder " + d + "/hid: is hidden by another folder at its path (one mounted over it)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("once its own folder is back at that path, resume with: cast train --resume " + d +
                      "/hid/checkpoint.safetensors"),
            std::string::npos)
      << said;
  EXPECT_TRUE(fs::is_empty(dir / "other")) << said;  // nothing written into the folder mounted over it
  EXPECT_NO_THROW(cast::read_safetensors(d + "/hid/checkpoint.safetensors"));  // its own, whole
  fs::remove_all(dir);
}

// A file mounted over a run's checkpoint mid-run (forty-first attack: the run read the mounted
// file back and said no good checkpoint was left): the line says what is mounted and how to
// resume once it is gone. Needs a mount namespace of its own.
TEST(Cli, AFileMountedOverTheCheckpointIsSaidMounted) {
  if (std::system("unshare -rm true > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mount namespace here (unshare -rm)";
  const fs::path dir = lifecycle_dir("mounted_checkpoint");
  const std::string d = dir.string();
  ASSERT_EQ(train_then_mount(dir, "echo hi > note", "mc", "mount --bind note mc/checkpoint.safetensors"), 0);
  const std::string said = slurp(d + "/err");
  EXPECT_EQ(slurp(d + "/code"), "1\n") << said;
  EXPECT_NE(said.find("something is mounted at " + d + "/mc/checkpoint.safetensors, over the run's own checkpoint, "
                      "which is whole beneath it: unmount it, then resume with: cast train --resume"),
            std::string::npos)
      << said;
  EXPECT_EQ(slurp(d + "/note"), "hi\n");
  EXPECT_NO_THROW(cast::read_safetensors(d + "/mc/checkpoint.safetensors"));  // its own, whole
  fs::remove_all(dir);
}

// SIGQUIT (Ctrl-\) stops a run at once, by the signal, with one line naming the whole checkpoint
// and no temporary file left (thirty-eighth attack: it died by the default action).
TEST(Cli, SigquitStopsARunAtOnceAndNamesTheWholeCheckpoint) {
  const fs::path dir = lifecycle_dir("sigquit");
  const std::string err = (dir / "err").string();
  const std::string args = checkpointing_train(dir, "quit");
  const pid_t pid = start_cast(args, err, "ulimit -c 0; ");  // no core file of the signal's default action
  ASSERT_TRUE(under_way(pid, (dir / "quit" / "metrics.jsonl").string())) << "the run did not start: " << slurp(err);
  kill(pid, SIGQUIT);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err), ckpt = (dir / "quit" / "checkpoint.safetensors").string();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGQUIT) << "status " << status << ": " << said;
  EXPECT_NE(said.find("cast: stopped at once by SIGQUIT: the last checkpoint written (" + ckpt +
                      ") is whole; resume with: cast train --resume " + ckpt),
            std::string::npos)
      << said;
  EXPECT_NO_THROW(cast::read_safetensors(ckpt));
  for (const auto& entry : fs::directory_iterator(dir / "quit"))
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  fs::remove_all(dir);
}

// metrics.jsonl made read-only while the run goes on (thirty-ninth attack): the open file could
// still be appended to, but a read-only file is never written; the run stops at its next record.
TEST(Cli, AMetricsFileMadeReadOnlyMidRunIsNotAppendedTo) {
  const fs::path dir = lifecycle_dir("read_only_metrics");
  const std::string err = (dir / "err").string(), metrics = (dir / "ro" / "metrics.jsonl").string();
  const pid_t pid = start_cast(tiny_train(dir, "ro", 100000), err);
  ASSERT_TRUE(under_way(pid, metrics)) << "the run did not start: " << slurp(err);
  fs::permissions(metrics, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  const std::string at_chmod = slurp(metrics);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << said;
  EXPECT_NE(said.find("metrics file " + metrics + ": was made read-only (mode 0444) while it was written; nothing "
                      "more is appended to it"),
            std::string::npos)
      << said;
  // at most the record being written as the mode changed
  EXPECT_LE(lines(slurp(metrics)), lines(at_chmod) + 1);
  fs::remove_all(dir);
}

// metrics.jsonl removed while its run goes on (fortieth attack: the run wrote every later record
// into the removed file, then failed at its end): the run stops at its next record.
TEST(Cli, AMetricsFileRemovedMidRunIsNotWrittenInto) {
  const fs::path dir = lifecycle_dir("removed_metrics");
  const std::string err = (dir / "err").string(), metrics = (dir / "rm" / "metrics.jsonl").string();
  const pid_t pid = start_cast(tiny_train(dir, "rm", 100000), err);
  ASSERT_TRUE(under_way(pid, metrics)) << "the run did not start: " << slurp(err);
  fs::remove(metrics);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << said;
  EXPECT_NE(said.find("metrics file " + metrics + ": was removed or replaced while it was written; nothing more is "
                      "appended to it"),
            std::string::npos)
      << said;
  fs::remove_all(dir);
}

// SIGHUP with standard output in a file: the lines stdio still held for it reach it (fortieth
// attack: the handler pointed standard output at /dev/null, and the file stayed empty).
TEST(Cli, SighupKeepsTheLinesOfAStandardOutputFile) {
  const fs::path dir = lifecycle_dir("hangup_file");
  const std::string out = (dir / "out").string(), err = (dir / "err").string();
  const pid_t pid = start_cast(tiny_train(dir, "hup2", 100000), err, "", out);
  ASSERT_TRUE(under_way(pid, (dir / "hup2" / "metrics.jsonl").string())) << "the run did not start: " << slurp(err);
  kill(pid, SIGHUP);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 129) << status << ": " << slurp(err);
  EXPECT_NE(slurp(out).find("cast train: task listops-short, attention full"), std::string::npos) << slurp(out);
  fs::remove_all(dir);
}

TEST(Cli, CompareStopsOnCtrlCAndTheSameCommandResumesIt) {
  const fs::path dir = lifecycle_dir("compare_sigint");
  const std::string out = (dir / "cmp").string();
  const std::string args = fmt::format(
      "compare --data {} --out {} --attention full,cast --dim 16 --heads 2 --layers 1 "
      "--mlp-dim 16 --batch 8 --steps 3000 --log-every 1 --checkpoint-every 0 "
      "--eval-limit 20 --device cpu",
      (dir / "listops").string(), out);
  const CliRun stopped = interrupt(args, out + "/full-seed1/metrics.jsonl", {{3, SIGINT}});
  ASSERT_EQ(stopped.code, 130) << stopped.err;
  EXPECT_EQ(lines(stopped.err), 2) << stopped.err;  // the signal heard, then the stop
  EXPECT_NE(stopped.err.find("resume with: cast " + args + "\n"), std::string::npos) << stopped.err;
  EXPECT_TRUE(fs::exists(out + "/full-seed1/checkpoint.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/results.md"));
  fs::remove_all(dir);
}

TEST(Cli, CastDataStopsOnCtrlCAndSaysTheSetIsUnfinished) {
  const fs::path dir = lifecycle_dir("data_sigint");
  const std::string out = (dir / "pf").string();
  // the unfinished mark is written before the first image: the signal comes while images are drawn
  const CliRun stopped = interrupt("data pathfinder --count 1000000 --out " + out,
                                   out + "/" + cast::data::kDataUnfinishedMark, {{1, SIGINT}});
  ASSERT_EQ(stopped.code, 130) << stopped.err;
  EXPECT_EQ(lines(stopped.err), 2) << stopped.err;
  EXPECT_NE(stopped.err.find("cast: SIGINT: stopping after the example in progress"), std::string::npos) << stopped.err;
  EXPECT_NE(stopped.err.find("cast data: stopped by SIGINT: data folder " + out + " is unfinished"), std::string::npos)
      << stopped.err;
  EXPECT_TRUE(fs::exists(out + "/" + cast::data::kDataUnfinishedMark));
  EXPECT_FALSE(fs::exists(out + "/metadata/0.npy"));
  fs::remove_all(dir);
}

// A rerun of cast data stopped while it draws its examples leaves the set it would replace whole
// and usable (twenty-first attack: it was marked unfinished from the start, so training refused
// a set whose files had not changed).
TEST(Cli, CastDataStoppedBeforeWritingLeavesTheSetUsable) {
  const fs::path dir = lifecycle_dir("data_sigint_early");
  const std::string out = (dir / "ls").string();
  ASSERT_EQ(run("data listops --count 200 --out " + out).code, 0);
  const std::string rows = slurp(out + "/basic_train.tsv");
  // the signal comes once the rerun holds the folder (its pid in the lock file), while it draws
  // 100 000 release-length examples (a minute); other settings: --overwrite lets it replace the set
  const std::string err = (dir / "err").string();
  const pid_t pid = start_cast("data listops --count 100000 --overwrite --out " + out, err);
  wait_for_holder(out, pid);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  const CliRun stopped{WIFEXITED(status) ? WEXITSTATUS(status) : -1, "", slurp(err)};
  ASSERT_EQ(stopped.code, 130) << stopped.err;
  EXPECT_NE(stopped.err.find("stopped by SIGINT before any file of the set was written: data folder " + out +
                             " holds what it held before"),
            std::string::npos)
      << stopped.err;
  EXPECT_FALSE(fs::exists(out + "/" + cast::data::kDataUnfinishedMark));
  EXPECT_EQ(slurp(out + "/basic_train.tsv"), rows);
  // a folder that was not there: it is not made (fortieth attack: "holds what it held before")
  const std::string fresh = (dir / "new").string();
  const pid_t new_pid = start_cast("data listops --count 100000 --out " + fresh, err);
  wait_for_holder(fresh, new_pid);
  kill(new_pid, SIGINT);
  waitpid(new_pid, &status, 0);
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << status << ": " << said;
  EXPECT_NE(said.find("stopped by SIGINT before any file of the set was written: data folder " + fresh +
                      " was not made"),
            std::string::npos)
      << said;
  EXPECT_FALSE(fs::exists(fresh)) << said;
  fs::remove_all(dir);
}

// Another signal right after the first is the same stop (a wrapper may turn a Ctrl-C into SIGTERM
// for its children), said in a line of its own (thirty-ninth attack: it was dropped without a
// word); the run stops after its step as the first signal asked.
TEST(Cli, AnotherSignalRightAfterTheFirstIsTheSameStopAndSaidSo) {
  const fs::path dir = lifecycle_dir("other_signal");
  const std::string err = (dir / "err").string(), metrics = (dir / "slow" / "metrics.jsonl").string();
  const std::string args = fmt::format(
      "train --data {} --run {} --attention full --dim 256 --heads 4 --layers 4 --mlp-dim 1024 --batch 128 --steps 100 "
      "--log-every 1 --checkpoint-every 1 --eval-limit 8 --device cpu",
      (dir / "listops").string(), (dir / "slow").string());
  const pid_t pid = start_cast(args, err);
  wait_for_lines(metrics, 1);
  kill(pid, SIGINT);
  usleep(100000);  // within the half second in which a stop signal is the first one again (a step takes seconds)
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << "status " << status << ": " << said;
  EXPECT_NE(said.find("cast: SIGTERM: the same stop as the SIGINT just before (send a signal again to stop at once)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("cast train: stopped by SIGINT after step"), std::string::npos) << said;
  EXPECT_NO_THROW(cast::read_safetensors((dir / "slow" / "checkpoint.safetensors").string()));
  fs::remove_all(dir);
}

// Training on a folder a cast data is still making (drawing its examples, no file written yet)
// names the writer, where it advised generating the set (twenty-second attack), which the
// writer's lock would refuse.
TEST(Cli, TrainingOnASetBeingMadeNamesItsWriter) {
  const fs::path dir = lifecycle_dir("data_being_made");
  const std::string out = (dir / "ls").string(), err = (dir / "err").string();
  const pid_t pid = start_cast("data listops --count 100000 --out " + out, err);
  wait_for_holder(out, pid);
  const CliRun train = run("train --task listops --data " + out + " --steps 1 --batch 2 --dim 8 --heads 2 --mlp-dim 8 "
                           "--layers 1 --device cpu --run " + (dir / "r").string());
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_NE(train.code, 0);
  EXPECT_NE(train.err.find("is in use by another cast process (pid " + std::to_string(pid)), std::string::npos)
      << train.err;
  fs::remove_all(dir);
}

TEST(Cli, ResumeWritesOnlyWhereTheUserPoints) {
  const fs::path dir = lifecycle_dir("resume_where");
  ASSERT_EQ(run(tiny_train(dir, "base", 6)).code, 0);
  const std::string base = (dir / "base" / "checkpoint.safetensors").string();
  const std::string base_ckpt = slurp(base), base_metrics = slurp((dir / "base" / "metrics.jsonl").string());
  fs::create_directories(dir / "backup");
  fs::copy_file(base, dir / "backup" / "checkpoint.safetensors");
  // a copy resumes beside itself
  CliRun copy = run("train --resume " + (dir / "backup" / "checkpoint.safetensors").string() + " --steps 9");
  EXPECT_EQ(copy.code, 0) << copy.err;
  EXPECT_TRUE(fs::exists(dir / "backup" / "summary.json"));
  // --steps at or below the checkpoint's step: a usage error that changes nothing
  for (const char* steps : {"6", "4"}) {
    CliRun low = run("train --resume " + base + " --steps " + steps);
    EXPECT_EQ(low.code, 2) << low.err;
    EXPECT_NE(low.err.find(std::string("setting 'steps' is ") + steps +
                           ": a resumed run must end after its "
                           "checkpoint's step 6"),
              std::string::npos)
        << low.err;
  }
  // --run to a folder holding another run: refused without --overwrite
  ASSERT_EQ(run(tiny_train(dir, "other", 4)).code, 0);
  const std::string other = slurp((dir / "other" / "checkpoint.safetensors").string());
  CliRun occupied = run("train --resume " + base + " --steps 8 --run " + (dir / "other").string());
  EXPECT_EQ(occupied.code, 2) << occupied.err;  // a folder the rules refuse: a usage error
  EXPECT_NE(occupied.err.find("already holds a run"), std::string::npos) << occupied.err;
  EXPECT_EQ(slurp((dir / "other" / "checkpoint.safetensors").string()), other);
  // a config file on resume: applied where it may change, refused by name where it may not
  const std::string cfg = (dir / "resume.json").string();
  std::ofstream(cfg) << R"({"dim": 32, "steps": 8})";
  CliRun shape = run("train --resume " + base + " --config " + cfg);
  EXPECT_EQ(shape.code, 2) << shape.err;
  EXPECT_NE(shape.err.find("setting 'dim' cannot change when resuming"), std::string::npos) << shape.err;
  std::ofstream(cfg) << R"({"bogus": 1})";
  EXPECT_EQ(run("train --resume " + base + " --config " + cfg).code, 2);
  EXPECT_EQ(run("train --resume " + base + " --task listops --steps 8").code, 2);
  EXPECT_EQ(slurp(base), base_ckpt) << "a refused resume wrote the checkpoint";
  std::ofstream(cfg) << R"({"dim": 16, "steps": 8, "log-every": 2})";
  CliRun applied = run("train --resume " + base + " --config " + cfg);
  EXPECT_EQ(applied.code, 0) << applied.err;
  EXPECT_EQ(cast::train::read_checkpoint_header(base).step, 8);
  EXPECT_EQ(cast::train::read_checkpoint_header(base).config.log_every, 2);
  EXPECT_NE(base_metrics, slurp((dir / "base" / "metrics.jsonl").string()));
  fs::remove_all(dir);
}

// A finished run's files are its results: a new run in its folder does not replace them when
// its checkpoint was moved away, and an older checkpoint put back in place does not rewind it.
TEST(Cli, AFinishedRunIsNeitherReplacedNorRewound) {
  const fs::path dir = lifecycle_dir("finished_kept");
  ASSERT_EQ(run(tiny_train(dir, "base", 3)).code, 0);
  const fs::path base = dir / "base";
  const std::string ckpt = (base / "checkpoint.safetensors").string();
  const std::string older = (dir / "step3.safetensors").string();
  fs::copy_file(ckpt, older);
  ASSERT_EQ(run("train --resume " + ckpt + " --steps 6").code, 0);
  const std::string metrics = slurp((base / "metrics.jsonl").string()), summary = slurp((base / "summary.json").string());
  // step 3's checkpoint put back in place
  fs::copy_file(older, ckpt, fs::copy_options::overwrite_existing);
  CliRun rewind = run("train --resume " + ckpt + " --steps 9");
  EXPECT_EQ(rewind.code, 2) << rewind.err;
  EXPECT_NE(rewind.err.find("is of step 3, but run " + base.string() + " finished at step 6"), std::string::npos)
      << rewind.err;
  // the checkpoint moved away: the folder still holds the finished run's results
  fs::rename(ckpt, dir / "moved.safetensors");
  CliRun again = run(tiny_train(dir, "base", 3));
  EXPECT_EQ(again.code, 2) << again.err;
  EXPECT_NE(again.err.find("holds a finished run's summary.json without its checkpoint.safetensors"),
            std::string::npos)
      << again.err;
  EXPECT_EQ(slurp((base / "metrics.jsonl").string()), metrics);
  EXPECT_EQ(slurp((base / "summary.json").string()), summary);
  // the user said so
  EXPECT_EQ(run(tiny_train(dir, "base", 3) + " --overwrite").code, 0);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- the twelfth attack's leftovers (issue 41)
// A run file its owner made read-only is not replaced (root ignores the bits, so cast reads
// them); a file replaced keeps its mode.
TEST(Cli, ReadOnlyRunFilesAreNotReplacedAndReplacementsKeepTheirMode) {
  const fs::path dir = lifecycle_dir("read_only_files");
  ASSERT_EQ(run(tiny_train(dir, "base", 3)).code, 0);
  const fs::path base = dir / "base";
  const std::string ckpt = (base / "checkpoint.safetensors").string(), metrics = (base / "metrics.jsonl").string();
  fs::permissions(metrics, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  const std::string kept = slurp(metrics), kept_ckpt = slurp(ckpt);
  CliRun resume = run("train --resume " + ckpt + " --steps 5");
  EXPECT_EQ(resume.code, 2) << resume.err;
  EXPECT_EQ(lines(resume.err), 1) << resume.err;
  EXPECT_NE(resume.err.find("run file " + metrics + ": is read-only (mode 0444)"), std::string::npos) << resume.err;
  EXPECT_EQ(slurp(metrics), kept);
  EXPECT_EQ(slurp(ckpt), kept_ckpt);
  EXPECT_EQ(fs::status(metrics).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  // a private checkpoint stays private when the resumed run replaces it
  fs::permissions(metrics, fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(ckpt, fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_EQ(run("train --resume " + ckpt + " --steps 5").code, 0);
  EXPECT_NE(slurp(ckpt), kept_ckpt);
  EXPECT_EQ(fs::status(ckpt).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  fs::remove_all(dir);
}

TEST(Cli, TheRootFolderIsNoOutputFolder) {
  const fs::path dir = lifecycle_dir("root_out");
  const std::string data = (dir / "listops").string();
  for (const std::string& args :
       {"train --data " + data + " --run / --steps 1 --dim 8 --heads 2 --layers 1 --mlp-dim 8 --device cpu",
        "compare --data " + data + " --out / --attention full --steps 1 --dim 8 --heads 2 --layers 1 --mlp-dim 8",
        std::string("data listops-short --count 40 --out /")}) {
    CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(" /: is the root folder of the file system"), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists("/metrics.jsonl"));
  EXPECT_FALSE(fs::exists("/results.json"));
  fs::remove_all(dir);
}

TEST(Cli, OverwriteWithAResumeInPlaceIsRefused) {
  const fs::path dir = lifecycle_dir("overwrite_in_place");
  ASSERT_EQ(run(tiny_train(dir, "base", 3)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string(), kept = slurp(ckpt);
  CliRun r = run("train --resume " + ckpt + " --steps 5 --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--overwrite with --resume " + ckpt + ": resuming into the checkpoint's own folder"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(ckpt), kept);
  fs::remove_all(dir);
}

// What runs otherwise than asked is said in a note line, not done silently.
TEST(Cli, NotesSayWhatRunsOtherwiseThanAsked) {
  const fs::path dir = lifecycle_dir("notes");
  const std::string data = (dir / "listops").string();
  CliRun big = run("train --data " + data + " --run " + (dir / "big").string() +
                   " --steps 1 --batch 1000 --dim 8 --heads 2 --layers 1 --mlp-dim 8 --eval-limit 4 --device cpu");
  ASSERT_EQ(big.code, 0) << big.err;
  EXPECT_NE(big.out.find("note: --batch 1000 is larger than the"), std::string::npos) << big.out;
  const std::string layer_in = std::string(CAST_TEST_DATA_DIR) + "/layer_cast.safetensors";
  CliRun narrowed = run("layer --in " + layer_in + " --out " + (dir / "o.safetensors").string() +
                        " --attention cast --heads 2 --clusters 3 --cluster-size 9");
  ASSERT_EQ(narrowed.code, 0) << narrowed.err;
  // the first four names, not all: a file may hold thousands (sixteenth attack: a line of 389 038 characters)
  EXPECT_NE(narrowed.out.find("note: " + layer_in + " holds 10 F64 tensors (dout, gate_b, gate_w, mask, ...)"),
            std::string::npos)
      << narrowed.out;
  EXPECT_NE(narrowed.out.find("note: cluster size 9 >= the 7 tokens of x in " + layer_in +
                              ": every CAST cluster holds every token (a size above 7 runs as 7)"),
            std::string::npos)
      << narrowed.out;
  CliRun single = run("layer --in " + layer_in + " --out " + (dir / "s.safetensors").string() +
                      " --attention cast --heads 2 --clusters 3 --cluster-size 9 --clustering satopk");
  ASSERT_EQ(single.code, 0) << single.err;
  EXPECT_NE(single.out.find("note: cluster size 9 is more than the 7 tokens of x in " + layer_in +
                            " (a size above 7 runs as 7)"),
            std::string::npos)
      << single.out;
  CliRun wide = run("layer --in " + layer_in + " --out " + (dir / "o.safetensors").string() +
                    " --overwrite --attention cast --heads 2 --clusters 3 --cluster-size 3 --dtype f64");
  ASSERT_EQ(wide.code, 0) << wide.err;
  EXPECT_EQ(wide.out.find("F64 tensor"), std::string::npos) << wide.out;
  EXPECT_EQ(wide.out.find("note: cluster size"), std::string::npos) << wide.out;
  CliRun bench = run("bench attention --device cpu --lengths 16,64 --dim 16 --heads 2 --mechanisms cast-topk "
                     "--cluster-size 32 --repeats 1 --warmup 0");
  ASSERT_EQ(bench.code, 0) << bench.err;
  EXPECT_NE(bench.out.find("note: cluster size 32 >= the 16 tokens of --lengths 16"), std::string::npos) << bench.out;
  EXPECT_EQ(bench.out.find("tokens of --lengths 64"), std::string::npos) << bench.out;
  fs::remove_all(dir);
}

// A comparison's run that fails names itself on the error line (stdout may be elsewhere): here
// the second variant, whose learning rate makes the gradient overflow.
TEST(Cli, CompareNamesTheFailingRunOnItsErrorLine) {
  const fs::path dir = lifecycle_dir("compare_fails");
  const std::string out = (dir / "cmp").string();
  CliRun r = run("compare --data " + (dir / "listops").string() + " --out " + out +
                 " --attention full --weight-decay 0 --vary lr=0.001,1e30 --seeds 1 --steps 3 --dim 16 --heads 2 "
                 "--layers 1 --mlp-dim 16 --batch 4 --eval-limit 4 --device cpu");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("cast compare: error: [2/2] lr=1e30 seed 1 (" + out + "/lr-1e30-seed1): step "),
            std::string::npos)
      << r.err;
  fs::remove_all(dir);
}

// Finite weights whose forward overflows: no panels of weights that are no numbers.
TEST(Cli, AttentionRefusesWeightsThatAreNoNumbers) {
  const fs::path dir = lifecycle_dir("attention_nan");
  ASSERT_EQ(run(tiny_train(dir, "base", 2)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  cast::TensorFile f = cast::read_safetensors(ckpt);
  int scaled = 0;
  for (auto& [name, t] : f.tensors)
    if (name.starts_with("param/") && (name.ends_with(".wq") || name.ends_with(".wk"))) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 1e30f;
      ++scaled;
    }
  ASSERT_GT(scaled, 0) << "no query or key weights found";
  cast::write_safetensors(ckpt, f.tensors, f.metadata);
  const std::string svg = (dir / "att.svg").string();
  CliRun r = run("attention --checkpoint " + ckpt + " --out " + svg + " --clusters 4 --topk 4");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("the attention weights of layer 1, head 1 on test example 0 (full attention) are not finite"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(svg));
  fs::remove_all(dir);
}

// The data folder a checkpoint recorded, gone: the error says whose folder that is.
TEST(Cli, ARecordedDataFolderIsNamedAsTheCheckpointsNotAsTyped) {
  const fs::path dir = lifecycle_dir("recorded_data");
  ASSERT_EQ(run(tiny_train(dir, "base", 2)).code, 0);
  fs::rename(dir / "listops", dir / "moved");
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  CliRun r = run("eval --checkpoint " + ckpt);
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("is the one checkpoint " + ckpt + " recorded; give --data to read another"), std::string::npos)
      << r.err;
  EXPECT_EQ(run("eval --checkpoint " + ckpt + " --data " + (dir / "moved").string()).code, 0);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- the thirteenth attack (issue 41)
// A run refused before it starts leaves what it found as it was: no lock file in a folder of the
// user's, no new folder for a resume whose checkpoint is refused.
TEST(Cli, ARefusedRunLeavesNoTrace) {
  const fs::path dir = lifecycle_dir("no_trace");
  const fs::path mine = dir / "mine";
  fs::create_directories(mine);
  { std::ofstream(mine / "metrics.jsonl") << "my own notes\n"; }
  CliRun own = run(tiny_train(dir, "mine", 2));
  EXPECT_EQ(own.code, 2) << own.err;
  EXPECT_FALSE(fs::exists(mine / ".cast.lock")) << "a refused run left its lock file";
  EXPECT_EQ(slurp((mine / "metrics.jsonl").string()), "my own notes\n");
  ASSERT_EQ(run(tiny_train(dir, "base", 2)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  cast::TensorFile f = cast::read_safetensors(ckpt);
  f.tensors.rbegin()->second.data<float>()[0] = std::nanf("");
  cast::write_safetensors(ckpt, f.tensors, f.metadata);
  CliRun nan = run("train --resume " + ckpt + " --run " + (dir / "branch").string() + " --steps 4");
  EXPECT_EQ(nan.code, 1) << nan.err;
  EXPECT_FALSE(fs::exists(dir / "branch")) << "a resume refused for its checkpoint made the new folder";
  EXPECT_EQ(nan.out.find("cast train:"), std::string::npos) << "the run's header came before its error: " << nan.out;
  // cast data, refused for a link where a data file goes (--overwrite or not)
  const fs::path data = dir / "linked";
  fs::create_directories(data);
  { std::ofstream(dir / "elsewhere.tsv") << "mine\n"; }
  fs::create_symlink(dir / "elsewhere.tsv", data / "basic_train.tsv");
  CliRun linked = run("data listops-short --count 40 --overwrite --out " + data.string());
  EXPECT_EQ(linked.code, 2) << linked.err;
  EXPECT_FALSE(fs::exists(data / ".cast.lock")) << "a refused cast data left its lock file";
  EXPECT_EQ(slurp((dir / "elsewhere.tsv").string()), "mine\n");
  fs::remove_all(dir);
}

// A checkpoint's model settings hold nothing the model does not read.
TEST(Cli, AModelSettingNoModelReadsIsRefused) {
  const fs::path dir = lifecycle_dir("model_key");
  ASSERT_EQ(run(tiny_train(dir, "base", 2)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  cast::TensorFile f = cast::read_safetensors(ckpt);
  nlohmann::json model = nlohmann::json::parse(f.metadata.at("model"));
  model["zzz"] = 1;
  f.metadata["model"] = model.dump();
  cast::write_safetensors(ckpt, f.tensors, f.metadata);
  CliRun r = run("eval --checkpoint " + ckpt);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("'zzz' is no setting of a model"), std::string::npos) << r.err;
  model.erase("zzz");
  model["attention"]["zzz"] = 1;
  f.metadata["model"] = model.dump();
  cast::write_safetensors(ckpt, f.tensors, f.metadata);
  CliRun group = run("eval --checkpoint " + ckpt);
  EXPECT_NE(group.err.find("'attention' holds 'zzz', no setting of attention"), std::string::npos) << group.err;
  fs::remove_all(dir);
}

TEST(Cli, ADoubleDashIsNoValue) {
  const fs::path dir = lifecycle_dir("double_dash");
  CliRun run_dash = run("train --run -- --steps 1 --data " + (dir / "listops").string());
  EXPECT_EQ(run_dash.code, 2) << run_dash.err;
  EXPECT_NE(run_dash.err.find("--run needs a value, and -- is an option"), std::string::npos) << run_dash.err;
  EXPECT_FALSE(fs::exists("--"));
  fs::remove_all(dir);
}

// cast layer: an error is one line (no note about a pass that never ran), and x's width against
// the weights' is blamed on them, not on --heads.
TEST(Cli, LayerErrorsAreOneLineAndBlameTheTensors) {
  const fs::path dir = lifecycle_dir("layer_errors");
  const std::string in = std::string(CAST_TEST_DATA_DIR) + "/layer_cast.safetensors";
  CliRun heads = run("layer --in " + in + " --out " + (dir / "o.safetensors").string() + " --attention cast --heads 3");
  EXPECT_EQ(heads.code, 2) << heads.err;
  EXPECT_EQ(lines(heads.err), 1) << heads.err;
  EXPECT_EQ(heads.out, "") << heads.out;
  cast::TensorFile f = cast::read_safetensors(std::string(CAST_TEST_DATA_DIR) + "/layer_full.safetensors");
  f.tensors["x"] = cast::Tensor::zeros({2, 8, 7}, cast::DType::f64);
  const std::string wrong = (dir / "wrong.safetensors").string();
  cast::write_safetensors(wrong, f.tensors, f.metadata);
  CliRun width = run("layer --in " + wrong + " --out " + (dir / "o.safetensors").string() + " --attention full --heads 2");
  EXPECT_EQ(width.code, 1) << width.err;
  EXPECT_NE(width.err.find("tensor 'x' has width D = 7 (shape [2, 8, 7]), but 'wq' has shape [8, 8], not [7, 7]"),
            std::string::npos)
      << width.err;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- the fourteenth attack (issue 41)
// A mechanism's option in --config that the run's mechanism does not read is said in a note (a
// file may serve several mechanisms, so it is not refused as the same flag is), on train and on
// compare over every mechanism it compares.
TEST(Cli, ConfigOptionsNoMechanismReadsAreNoted) {
  const fs::path dir = lifecycle_dir("config_options");
  const std::string cfg = (dir / "mech.json").string();
  { std::ofstream(cfg) << R"({"attention": "full", "clustering": "satopk"})"; }
  CliRun train = run(tiny_train(dir, "t", 2) + " --config " + cfg);
  EXPECT_EQ(train.code, 0) << train.err;
  EXPECT_NE(train.out.find("note: " + cfg + ": 'clustering' is an option of attention cast; it changes nothing for full"),
            std::string::npos)
      << train.out;
  const std::string only = (dir / "only.json").string();
  { std::ofstream(only) << R"({"topk": 5, "clustering": "satopk"})"; }
  CliRun compare = run("compare --data " + (dir / "listops").string() + " --out " + (dir / "c").string() +
                       " --attention full,cast --config " + only +
                       " --steps 1 --dim 8 --heads 2 --layers 1 --mlp-dim 8 --eval-limit 4 --batch 4");
  EXPECT_EQ(compare.code, 0) << compare.err;
  EXPECT_NE(compare.out.find("note: " + only + ": 'topk' is an option of attention iclustered; it changes nothing for full, cast"),
            std::string::npos)
      << compare.out;
  EXPECT_EQ(compare.out.find("'clustering' is an option"), std::string::npos) << "cast reads it: " << compare.out;
  fs::remove_all(dir);
}

// A checkpoint without a required field names the file once; a file of the user's named
// checkpoint.safetensors is not called a run to resume.
TEST(Cli, CheckpointMessagesNameTheFileOnceAndGiveAdviceThatWorks) {
  const fs::path dir = lifecycle_dir("ckpt_messages");
  ASSERT_EQ(run(tiny_train(dir, "base", 2)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  cast::TensorFile f = cast::read_safetensors(ckpt);
  f.metadata.erase("step");
  const std::string no_step = (dir / "no_step.safetensors").string();
  cast::write_safetensors(no_step, f.tensors, f.metadata);
  CliRun eval = run("eval --checkpoint " + no_step);
  EXPECT_EQ(eval.code, 1) << eval.err;
  EXPECT_NE(eval.err.find(no_step + ": not a cast checkpoint (no 'step' metadata)"), std::string::npos) << eval.err;
  EXPECT_EQ(eval.err.find(no_step), eval.err.rfind(no_step)) << "the path is given twice: " << eval.err;
  fs::create_directories(dir / "mine");
  { std::ofstream(dir / "mine" / "checkpoint.safetensors") << "my notes\n"; }
  CliRun mine = run(tiny_train(dir, "mine", 2));
  EXPECT_EQ(mine.code, 2) << mine.err;
  EXPECT_NE(mine.err.find("which cannot be read as a cast checkpoint; not replacing it"), std::string::npos)
      << mine.err;
  EXPECT_EQ(mine.err.find("--resume"), std::string::npos) << mine.err;
  EXPECT_EQ(slurp((dir / "mine" / "checkpoint.safetensors").string()), "my notes\n");
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- the fifteenth attack (issue 41)
// Metrics records a stopped run wrote after its checkpoint are dropped on resume, as documented,
// and a note says so; a settings value of the wrong type says which type is expected.
TEST(Cli, DroppedRecordsAndWrongTypesAreSaid) {
  const fs::path dir = lifecycle_dir("dropped");
  ASSERT_EQ(run(tiny_train(dir, "base", 3)).code, 0);
  const std::string metrics = (dir / "base" / "metrics.jsonl").string();
  {  // what a process killed at step 5 would have appended after the checkpoint of step 3
    std::ofstream more(metrics, std::ios::app);
    more << R"({"step": 4, "split": "train", "loss": 2.0, "accuracy": 0.0})" << '\n'
         << R"({"step": 5, "split": "train", "loss": 2.0, "accuracy": 0.0})" << '\n';
  }
  CliRun r = run("train --resume " + (dir / "base" / "checkpoint.safetensors").string() + " --steps 6");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("note: 2 metrics records after step 3 (the checkpoint's) are left out"), std::string::npos)
      << r.out;
  const std::string cfg = (dir / "bad.json").string();
  { std::ofstream(cfg) << R"({"recompute": "yes"})"; }
  CliRun wrong = run(tiny_train(dir, "w", 2) + " --config " + cfg);
  EXPECT_EQ(wrong.code, 2) << wrong.err;
  EXPECT_NE(wrong.err.find("setting 'recompute' has the wrong type: \"yes\", where true or false is expected"),
            std::string::npos)
      << wrong.err;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- the fifteenth attack's leftovers
// A cluster count the user never chose, held at a short sequence's token count, is said; CAST's
// weights of the wrong shape name the settings their shape follows from.
TEST(Cli, ADefaultClusterCountHeldAtTheTokensIsSaid) {
  const fs::path dir = lifecycle_dir("held_clusters");
  const std::string clustered = fmt::format(
      "train --data {} --attention clustered --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 8 --steps 1 "
      "--eval-limit 8 --device cpu --max-len 5 --run ",
      (dir / "listops").string());
  CliRun r = run(clustered + (dir / "short").string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("note: the longest sequence has 6 tokens, fewer than the default 8 clusters: the cluster count "
                       "is 6 (give --clusters to choose)"),
            std::string::npos)
      << r.out;
  CliRun chosen = run(clustered + (dir / "chosen").string() + " --clusters 4");
  EXPECT_EQ(chosen.code, 0) << chosen.err;
  // CAST's default cluster size is the default count: held at the tokens, it is full attention
  // (seventeenth attack: only a size given with --cluster-size was said to be)
  std::string cast_short = clustered;
  cast_short.replace(cast_short.find("clustered"), 9, "cast");
  // improved clustered attention's default top-k above the tokens: held there, and said
  std::string improved = clustered;
  improved.replace(improved.find("clustered"), 9, "iclustered");
  CliRun improved_run = run(improved + (dir / "improved").string());
  EXPECT_EQ(improved_run.code, 0) << improved_run.err;
  EXPECT_NE(improved_run.out.find("note: the top-k, 32, is more than the 6 tokens of the longest sequence: every key is "
                                  "a top key, held at 6"),
            std::string::npos)
      << improved_run.out;
  CliRun cast_run = run(cast_short + (dir / "cast").string());
  EXPECT_EQ(cast_run.code, 0) << cast_run.err;
  EXPECT_NE(cast_run.out.find("note: the default cluster size, 6, >= the 6 tokens of the longest sequence: every CAST "
                              "cluster holds every token, which is full attention"),
            std::string::npos)
      << cast_run.out;
  EXPECT_EQ(chosen.out.find("fewer than the default"), std::string::npos) << chosen.out;
  const std::string in = std::string(CAST_TEST_DATA_DIR) + "/layer_cast.safetensors";  // N 7, C 3
  CliRun layer = run("layer --in " + in + " --out " + (dir / "o.st").string() + " --attention clustered --heads 2");
  EXPECT_EQ(layer.code, 0) << layer.err;
  EXPECT_NE(layer.out.find("has 7 tokens, fewer than the default 8 clusters: the cluster count is 7"),
            std::string::npos)
      << layer.out;
  CliRun shape = run("layer --in " + in + " --out " + (dir / "o2.st").string() + " --attention cast --heads 2 "
                     "--clusters 4");
  EXPECT_EQ(shape.code, 1) << shape.err;
  EXPECT_NE(shape.err.find("tensor 'surrogates' must have shape [2, 4, 4], got [2, 3, 4] (--clusters 4; --cast-heads "
                           "per-head: --heads 2 of width 4)"),
            std::string::npos)
      << shape.err;
  fs::remove_all(dir);
}

// --eval-best kept from a checkpoint is said to be the checkpoint's when it is refused, with the
// way to turn it off; a best checkpoint removed is not blamed on validations that never ran; a
// resume whose recorded data folder is gone says whose folder it is, as eval does.
TEST(Cli, WhatAResumeKeepsFromItsCheckpointIsSaidAsTheCheckpoints) {
  const fs::path dir = lifecycle_dir("kept_flags");
  ASSERT_EQ(run(tiny_train(dir, "base", 2) + " --eval-best --eval-every 1").code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  CliRun kept = run("train --resume " + ckpt + " --steps 3 --eval-every 0");
  EXPECT_EQ(kept.code, 2) << kept.err;
  EXPECT_NE(kept.err.find("('eval-best' is kept from checkpoint " + ckpt +
                          "; a --config file holding {\"eval-best\": false} turns it off)"),
            std::string::npos)
      << kept.err;
  const std::string off = (dir / "off.json").string();
  { std::ofstream(off) << R"({"eval-best": false})"; }
  CliRun turned_off = run("train --resume " + ckpt + " --steps 3 --eval-every 0 --config " + off);
  EXPECT_EQ(turned_off.code, 0) << turned_off.err;
  fs::remove(dir / "base" / "best.safetensors");
  CliRun gone = run("train --resume " + ckpt + " --steps 4 --eval-best --eval-every 10");
  EXPECT_EQ(gone.code, 0) << gone.err;
  EXPECT_NE(gone.out.find("holds no best.safetensors (the one the validation of accuracy"), std::string::npos)
      << gone.out;
  EXPECT_EQ(gone.out.find("no validation wrote one"), std::string::npos) << gone.out;
  fs::rename(dir / "listops", dir / "moved");
  CliRun moved = run("train --resume " + ckpt + " --steps 5");
  EXPECT_EQ(moved.code, 1) << moved.err;
  EXPECT_NE(moved.err.find("is the one checkpoint " + ckpt + " recorded; give --data to read another"),
            std::string::npos)
      << moved.err;
  fs::remove_all(dir);
}

// A comparison reads its data folder as a folder, however spelled, and cast plot given the
// comparison's folder names the runs in it.
TEST(Cli, AComparisonKnowsItsDataFolderByAnySpelling) {
  const fs::path dir = lifecycle_dir("cmp_spelling");
  const std::string tiny = " --attention full --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 8 --steps 1 "
                           "--eval-limit 8 --device cpu --out " + (dir / "cmp").string();
  ASSERT_EQ(run("compare --data " + (dir / "listops").string() + tiny).code, 0);
  for (const std::string& spelling : {(dir / "listops" / ".").string(), (dir / "." / "listops").string()}) {
    CliRun again = run("compare --data " + spelling + tiny);
    EXPECT_EQ(again.code, 0) << spelling << ": " << again.err;
    EXPECT_NE(again.out.find("finished earlier"), std::string::npos) << spelling << ": " << again.out;
  }
  // a relative data folder recorded from another working folder: the same set, so the same run
  const std::string opts = " --attention full --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 8 --steps 1 "
                           "--eval-limit 8 --device cpu";
  fs::create_directories(dir / "sub");
  const std::string out = (dir / "sub_out").string();
  ASSERT_EQ(std::system(fmt::format("cd {} && {} compare --data listops --out rel{} > /dev/null 2>&1", dir.string(),
                                    CAST_BINARY, opts)
                            .c_str()),
            0);
  const int from_sub = std::system(fmt::format("cd {}/sub && {} compare --data ../listops --out ../rel{} > {} 2>&1",
                                               dir.string(), CAST_BINARY, opts, out)
                                       .c_str());
  EXPECT_EQ(from_sub, 0) << slurp(out);
  EXPECT_NE(slurp(out).find("finished earlier"), std::string::npos) << slurp(out);
  CliRun plot = run("plot " + (dir / "cmp").string());
  EXPECT_EQ(plot.code, 2) << plot.err;
  EXPECT_NE(plot.err.find("holds runs, not a run's metrics: plot them with `cast plot " +
                          (dir / "cmp" / "full-seed1").string() + "`"),
            std::string::npos)
      << plot.err;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- the sixteenth attack (issue 41)
// --config's values, then the flags': the settings are checked against each other once both are
// in (a file's heads against the preset's dim was refused, quoting a dim nobody gave), and an
// error about a value the file gave names the file, wherever it is found.
TEST(Cli, ConfigValuesAreCheckedWithTheFlagsAndBlamedOnTheFile) {
  const fs::path dir = lifecycle_dir("config_relations");
  const auto file = [&](const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const std::string heads3 = file("h3.json", R"({"heads": 3})"), dim15 = file("d15.json", R"({"dim": 15})"),
                    decay = file("wd.json", R"({"weight-decay": 600})"),
                    clusters = file("c.json", R"({"clusters": 100, "attention": "clustered"})"),
                    listed = file("a.json", R"({"attention": ["full", "cast"]})");
  for (const std::string& ok : {tiny_train(dir, "h", 1) + " --config " + heads3,  // --heads 2 --dim 16 win
                                tiny_train(dir, "w", 1) + " --config " + decay + " --lr 0.001"}) {
    const CliRun r = run(ok);
    EXPECT_EQ(r.code, 0) << ok << "\n" << r.err;
  }
  const std::string cmp = " --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 8 --steps 1 --eval-limit 8 --device cpu "
                          "--data " + (dir / "listops").string() + " --out " + (dir / "cmp").string();
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"train --data " + (dir / "listops").string() + " --run " + (dir / "d").string() + " --heads 2 --config " +
                dim15,
            "config file " + dim15 + ": setting 'dim' is 15: it must be a multiple of 'heads' (2)"},
           {"train --data " + (dir / "listops").string() + " --run " + (dir / "c").string() +
                " --dim 16 --heads 2 --layers 1 --mlp-dim 16 --batch 8 --steps 1 --device cpu --config " + clusters,
            "config file " + clusters + ": setting 'clusters' is 100: more than the"},
           {"compare --attention clustered --config " + clusters + cmp,
            "config file " + clusters + ": setting 'clusters' is 100: more than the"},
           {"compare --config " + listed + cmp,
            "config file " + listed + ": setting 'attention' is [\"full\",\"cast\"], where a string is expected"},
           {"compare --vary lr=" + cmp, "--vary lr: no values after '='"},
           {"compare --attention cast --vary clusters=1,100" + cmp,
            "variant clusters=100: setting 'clusters' is 100: more than the"},
           {"compare --attention 'full, cast'" + cmp,
            "--attention: unknown mechanism ' cast' (full, cast, clustered, iclustered); a space beside a comma"},
       }) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(dir / "cmp"));
  // a comparison's run says what cast train says of its clusters against the sequence
  const CliRun noted = run("compare --attention cast --cluster-size 100" + cmp);
  EXPECT_EQ(noted.code, 0) << noted.err;
  EXPECT_NE(noted.out.find("note: cluster size 100 >= the"), std::string::npos) << noted.out;
  fs::remove_all(dir);
}

// A checkpoint's metadata holds what cast train writes, and nothing else: a key it never writes
// would be dropped by the next checkpoint without a word, and a control character in a stored
// setting would break every message that names it.
TEST(Cli, CheckpointMetadataHoldsOnlyWhatCastTrainWrites) {
  const fs::path dir = lifecycle_dir("ckpt_metadata");
  ASSERT_EQ(run(tiny_train(dir, "base", 2)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  const cast::TensorFile f = cast::read_safetensors(ckpt);
  cast::TensorFile extra = f;
  extra.metadata["bogus"] = "1";
  const std::string with_extra = (dir / "extra.safetensors").string();
  cast::write_safetensors(with_extra, extra.tensors, extra.metadata);
  cast::TensorFile control = f;
  nlohmann::json train = nlohmann::json::parse(control.metadata.at("train"));
  train["data"] = "D\nX";
  control.metadata["train"] = train.dump();
  const std::string with_control = (dir / "control.safetensors").string();
  cast::write_safetensors(with_control, control.tensors, control.metadata);
  cast::TensorFile one_class = f;
  nlohmann::json model = nlohmann::json::parse(one_class.metadata.at("model"));
  model["classes"] = 1;
  one_class.metadata["model"] = model.dump();
  const std::string with_one_class = (dir / "one_class.safetensors").string();
  cast::write_safetensors(with_one_class, one_class.tensors, one_class.metadata);
  cast::TensorFile window = f;  // each sum finite, together more than the run's steps held
  window.metadata["log_window"] = "1e308,1e308,1e308,1e308";
  const std::string with_window = (dir / "window.safetensors").string();
  cast::write_safetensors(with_window, window.tensors, window.metadata);
  for (const auto& [path, message] : std::vector<std::pair<std::string, std::string>>{
           {with_window, "'log_window' is '1e308,1e308,1e308,1e308': its examples are more than the 16 of 2 steps"},
           {with_one_class, "corrupt checkpoint metadata: setting 'classes' is 1: it must be in [2, 1048576]"},
           {with_extra, "metadata key \"bogus\" is none that cast train writes"},
           {with_control, "'train' metadata: setting 'data' holds the control character \\u000A"}}) {
    for (const std::string& args : {"eval --checkpoint " + path, "train --resume " + path + " --steps 4"}) {
      const CliRun r = run(args);
      EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
      EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
      EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    }
  }
  // a run of the task's default data folder records none: said so where that folder is missing
  cast::TensorFile by_default = f;
  train = nlohmann::json::parse(by_default.metadata.at("train"));
  train["data"] = "";
  by_default.metadata["train"] = train.dump();
  const std::string default_ckpt = (dir / "default.safetensors").string(), said = (dir / "said").string();
  cast::write_safetensors(default_ckpt, by_default.tensors, by_default.metadata);
  fs::create_directories(dir / "empty");
  const int status = std::system(
      fmt::format("cd {}/empty && {} eval --checkpoint {} > /dev/null 2> {}", dir.string(), CAST_BINARY, default_ckpt, said)
          .c_str());
  EXPECT_NE(status, 0);
  EXPECT_NE(slurp(said).find("checkpoint " + default_ckpt + " recorded no data folder: its run read the task's "
                             "default, data/listops-short"),
            std::string::npos)
      << slurp(said);
  fs::remove_all(dir);
}

TEST(Cli, ResumingACopyInAReadOnlyFolderFailsBeforeTrainingAndTouchesNothing) {
  const fs::path dir = lifecycle_dir("resume_read_only");
  ASSERT_EQ(run(tiny_train(dir, "base", 4)).code, 0);
  const std::string base = (dir / "base" / "checkpoint.safetensors").string();
  const std::string base_ckpt = slurp(base), base_metrics = slurp((dir / "base" / "metrics.jsonl").string());
  const fs::path ro = dir / "read_only";
  fs::create_directories(ro);
  fs::copy_file(base, ro / "checkpoint.safetensors");
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  // root writes through permissions: an immutable folder stands in for a read-only one
  const bool immutable = geteuid() == 0 && std::system(("chattr +i " + ro.string() + " 2>/dev/null").c_str()) == 0;
  const bool writable = std::ofstream((ro / "probe").string()).good();
  if (!writable) {
    CliRun r = run("train --resume " + (ro / "checkpoint.safetensors").string() + " --steps 8");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("run folder " + ro.string() + ": folder " + ro.string() + " is read-only (permission denied)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(slurp(base), base_ckpt);
    EXPECT_EQ(slurp((dir / "base" / "metrics.jsonl").string()), base_metrics);
  }
  if (immutable) std::system(("chattr -i " + ro.string()).c_str());
  fs::permissions(ro, fs::perms::owner_all);
  fs::remove_all(dir);
  if (writable) GTEST_SKIP() << "no way to make a read-only folder here";
}

TEST(Cli, EvalAndResumeRefuseANonFiniteCheckpointNamingTheTensor) {
  const fs::path dir = lifecycle_dir("nan_ckpt");
  ASSERT_EQ(run(tiny_train(dir, "base", 3)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  cast::TensorFile f = cast::read_safetensors(ckpt);
  const std::string name = f.tensors.rbegin()->first;  // the last tensor: a parameter
  f.tensors[name].data<float>()[0] = std::nanf("");
  cast::write_safetensors(ckpt, f.tensors, f.metadata);
  const std::string poisoned = slurp(ckpt);
  for (const std::string& args : {"eval --checkpoint " + ckpt, "train --resume " + ckpt + " --steps 5"}) {
    CliRun r = run(args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(ckpt + ": '" + name + "' holds nan at element 0"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out.find("accuracy"), std::string::npos) << args << ": " << r.out;
  }
  EXPECT_EQ(slurp(ckpt), poisoned);
  fs::remove_all(dir);
}

// Weights that stay finite but overflow the model's outputs: no accuracy is reported as if it
// meant something (training stops at such a loss too).
TEST(Cli, EvalRefusesALossThatIsNoNumber) {
  const fs::path dir = lifecycle_dir("nan_loss");
  ASSERT_EQ(run(tiny_train(dir, "base", 3)).code, 0);
  const std::string ckpt = (dir / "base" / "checkpoint.safetensors").string();
  cast::TensorFile f = cast::read_safetensors(ckpt);
  ASSERT_TRUE(f.tensors.count("param/head.dense2.weight"));
  cast::Tensor& w = f.tensors["param/head.dense2.weight"];  // the logits' weights: the logits overflow
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = 3e38f;
  cast::write_safetensors(ckpt, f.tensors, f.metadata);
  CliRun r = run("eval --checkpoint " + ckpt);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("checkpoint " + ckpt + ": the validation loss is"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("accuracy"), std::string::npos) << r.out;
  // and in a sweep of mechanisms with the same weights
  CliRun sweep = run("eval --checkpoint " + ckpt + " --attention full,clustered");
  EXPECT_EQ(sweep.code, 1) << sweep.err;
  EXPECT_NE(sweep.err.find("the validation loss is"), std::string::npos) << sweep.err;
  fs::remove_all(dir);
}

TEST(Cli, EvalBestWithoutEvalEveryIsAUsageError) {
  const fs::path dir = lifecycle_dir("eval_best");
  CliRun r = run(tiny_train(dir, "best", 4) + " --eval-best");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("setting 'eval-best' needs 'eval-every' above 0"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("best model"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "best"));
  fs::remove_all(dir);
}

// A trained full-attention model evaluated with clustered and improved clustered attention and
// its own weights (the clustered-attention paper's approximation without retraining): the
// output names the swap; with as many clusters as tokens, improved clustered attention keeps
// every key of each query's cluster, so it equals full attention's accuracy. CAST is refused by
// name, before anything is evaluated.
TEST(Cli, EvalWithAnotherAttentionCarriesTheWeightsOver) {
  const fs::path dir = lifecycle_dir("eval_swap");
  ASSERT_EQ(run(tiny_train(dir, "full", 6)).code, 0);
  const std::string ckpt = (dir / "full" / "checkpoint.safetensors").string();
  const std::string before = slurp(ckpt);
  CliRun full = run("eval --device cpu --eval-limit 40 --checkpoint " + ckpt);
  ASSERT_EQ(full.code, 0) << full.err;
  auto accuracy = [](const std::string& out, const std::string& what) {
    const size_t at = out.find(what);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('%', at) - at);
  };
  CliRun clustered = run("eval --device cpu --eval-limit 40 --attention clustered --clusters 4 --checkpoint " + ckpt);
  ASSERT_EQ(clustered.code, 0) << clustered.err;
  EXPECT_NE(clustered.out.find("attention clustered in place of the trained full, the same weights; clusters 4"),
            std::string::npos)
      << clustered.out;
  // listops-short sequences are at most 49 tokens with the CLS: 49 clusters and 49 top keys hold them all
  CliRun every_key =
      run("eval --device cpu --eval-limit 40 --attention iclustered --clusters 49 --topk 49 --checkpoint " + ckpt);
  ASSERT_EQ(every_key.code, 0) << every_key.err;
  EXPECT_EQ(accuracy(every_key.out, "test accuracy"), accuracy(full.out, "test accuracy")) << every_key.out;
  EXPECT_EQ(accuracy(every_key.out, "validation accuracy"), accuracy(full.out, "validation accuracy")) << every_key.out;
  CliRun cast_swap = run("eval --device cpu --attention cast --checkpoint " + ckpt);
  EXPECT_EQ(cast_swap.code, 2);
  EXPECT_EQ(lines(cast_swap.err), 1) << cast_swap.err;
  EXPECT_NE(cast_swap.err.find("--attention cast: CAST needs surrogate tokens and a gate"), std::string::npos)
      << cast_swap.err;
  EXPECT_EQ(cast_swap.out.find("accuracy"), std::string::npos);
  CliRun unknown = run("eval --device cpu --attention flash --checkpoint " + ckpt);
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("--attention must be full, clustered or iclustered, got 'flash'"), std::string::npos)
      << unknown.err;
  CliRun stray = run("eval --device cpu --clusters 4 --checkpoint " + ckpt);
  EXPECT_EQ(stray.code, 2);
  EXPECT_NE(stray.err.find("--clusters is an option of the mechanism --attention swaps in, and none is given"),
            std::string::npos)
      << stray.err;
  // --figure names what it needs (eleventh attack, L5)
  CliRun figure = run("eval --device cpu --figure " + dir.string() + "/f.svg --checkpoint " + ckpt);
  EXPECT_EQ(figure.code, 2);
  EXPECT_NE(figure.err.find("--figure draws a sweep of --attention"), std::string::npos) << figure.err;
  // a whole number beyond 64 bits is out of range, not "not an integer" (eleventh attack, L4)
  CliRun seed = run("train --seed 9223372036854775808 --steps 1");
  EXPECT_EQ(seed.code, 2);
  EXPECT_NE(seed.err.find("--seed is 9223372036854775808: out of range"), std::string::npos) << seed.err;
  EXPECT_EQ(slurp(ckpt), before);
  fs::remove_all(dir);
}

// --surrogates frozen trains everything but the surrogate tokens, which stay as drawn at the
// start (static clustering directions); the setting is stored in the checkpoint, and a resume
// keeps it.
TEST(Cli, FrozenSurrogatesStayAsDrawn) {
  const fs::path dir = lifecycle_dir("frozen_surrogates");
  std::string args = tiny_train(dir, "frozen", 3);
  args.replace(args.find("--attention full"), std::string("--attention full").size(),
               "--attention cast --surrogates frozen");
  CliRun r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  cast::TensorFile f = cast::read_safetensors((dir / "frozen" / "checkpoint.safetensors").string());
  const cast::nn::ModelConfig config = cast::train::model_from_json(nlohmann::json::parse(f.metadata.at("model")));
  EXPECT_TRUE(config.attention.frozen_surrogates);
  cast::nn::Transformer fresh(config, cast::DType::f32, cast::Device::cpu);
  int surrogates = 0, moved = 0;
  for (auto& [name, t] : fresh.parameters()) {
    const std::vector<double> start = t->to_double_vector(), end = f.tensors.at("param/" + name).to_double_vector();
    if (name.find("surrogates") != std::string::npos) {
      ++surrogates;
      EXPECT_EQ(end, start) << name;
      EXPECT_EQ(f.tensors.at("adam.m/" + name).to_double_vector(), std::vector<double>(start.size(), 0.0)) << name;
    } else if (end != start) {
      ++moved;
    }
  }
  EXPECT_EQ(surrogates, 1);
  EXPECT_GT(moved, 5);
  // a CAST model's attention cannot be swapped for another mechanism at evaluation
  CliRun swap = run("eval --device cpu --attention clustered --checkpoint " +
                    (dir / "frozen" / "checkpoint.safetensors").string());
  EXPECT_EQ(swap.code, 2);
  EXPECT_NE(swap.err.find("--attention clustered: this is a CAST model"), std::string::npos) << swap.err;
  fs::remove_all(dir);
}

// A CAST Top-K run whose clusters hold the whole sequence is full attention: the trainer says so
// before it starts (and trains anyway); a cluster size below the sequence says nothing.
TEST(Cli, CastWithClustersAsLongAsTheSequenceSaysItIsFullAttention) {
  const fs::path dir = lifecycle_dir("cast_whole_sequence");
  const std::string cast_run = "--attention cast --clusters 2";
  for (auto [size, noted] : {std::pair{"1000", true}, std::pair{"2", false}}) {
    std::string args = tiny_train(dir, std::string("kappa") + size, 1);
    args.replace(args.find("--attention full"), std::string("--attention full").size(),
                 cast_run + " --cluster-size " + size);
    const CliRun r = run(args);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("which is full attention") != std::string::npos, noted) << size << ": " << r.out;
  }
  fs::remove_all(dir);
}

// docs/engine.md shows the fast-path table as `cast info --fast-paths` prints it from the registry.
TEST(Cli, DocsShowTheFastPathTableOfTheRegistry) {
  const CliRun r = run("info --fast-paths");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_NE(
      r.out.find("| `combine_clusters` | `combine_clusters_fused` | `ops/attention/combine_clusters_fused.cpp` |"),
      std::string::npos)
      << r.out;
  const std::string doc =
      slurp((fs::path(CAST_TEST_DATA_DIR).parent_path().parent_path() / "docs" / "engine.md").string());
  EXPECT_NE(doc.find(r.out), std::string::npos)
      << "docs/engine.md does not show `cast info --fast-paths` as it prints now:\n"
      << r.out;
}
