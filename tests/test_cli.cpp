// The binary as a user meets it: exit codes, one-line errors on stderr, --help, JSON configs.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

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
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
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
                           "text 20000"), std::string::npos) << train.out;
  EXPECT_NE(train.out.find("--attention <value>            full | cast | clustered | iclustered; default cast"),
            std::string::npos);
  EXPECT_EQ(train.out.find("; default \n"), std::string::npos) << "a setting without its default";
  CliRun bench = run("bench --help");
  EXPECT_NE(bench.out.find("usage: cast bench attention|train|gemm"), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("cast bench attention --lengths"), std::string::npos);
  EXPECT_NE(bench.out.find("cast bench train --task"), std::string::npos);
  for (const char* command : {"train", "compare", "eval", "data", "clusters", "plot", "layer", "bench", "info", "demo"}) {
    CliRun help = run(std::string(command) + " --help");
    EXPECT_EQ(help.code, 0) << command;
    EXPECT_NE(help.out.find("examples:\n  cast " + std::string(command)), std::string::npos) << command << ":\n" << help.out;
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
      {"bench attention --lengths 0", "--lengths: '0' is not a length"},
      {"bench attention --repeats 0", "--repeats is 0"},
      {"bench attention --mechanisms bogus", "--mechanisms: unknown 'bogus'"},
      {"data listops --count -1", "--count is -1: it must be in [0, 10000000]"},
      {"data pathfinder --count 99999999", "--count is 99999999: it must be in [0, 1000000]"},
      {"data pathfinder --max-length 100", "--max-length and --min-length are ListOps options"},
      {"data listops --max-length 40 --min-length 39", "strictly between the shortest (39) and the longest (40): none"},
      {"data listops --max-length 3", "strictly between the shortest (0) and the longest (3)"},
      {"compare --task bogus", "unknown task 'bogus'"},
      {"train --task bogus", "unknown task 'bogus'"},
      {"compare --vary tf32=yes", "setting 'tf32': 'yes' is not 'true' or 'false'"},
      {"data listops --seed -3", "--seed is -3"},
      {"compare --seeds 1,x", "--seeds: 'x' is not a seed"},
      {"compare --seeds 1,,2", "--seeds: '1,,2' has an empty item"},
      {"compare --attention full,full", "--attention: 'full' is listed twice"},
      {"compare --attention full,bogus", "unknown mechanism 'bogus'"},
      {"compare --vary summaries", "--vary expects SETTING=V1,V2,..., got 'summaries'"},
      {"compare --vary colour=red,blue", "'colour' is not a setting of cast train"},
      {"compare --vary heads=2,two", "setting 'heads': 'two' is not a whole number"},
      {"compare --vary summaries=on,maybe", "setting 'summaries' is 'maybe': it must be one of on | off"},
      {"compare --vary seed=1,2", "--vary seed: use --attention, --seeds or --out for that"},
      {"compare --attention cast,full --vary f=softmax,laplace", "--attention names one mechanism when --vary is given"},
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
  for (const auto& [args, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"bench train --task text --batch-size 4096", "a full training step of batch 4096 at length 4096 needs about"},
           {"bench attention --lengths 1048576 --batch 512 --mechanisms full", "full attention at N 1048576 (batch 512"},
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
  for (const char* c : {"train", "eval", "data", "bench", "layer", "clusters", "info"})
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
  for (auto [args, code] : std::vector<std::pair<const char*, int>>{
           {"eval --checkpoint /nonexistent/c.safetensors", 1}, {"train --steps many", 2}, {"train --bogus 1", 2},
           {"layer --in /nonexistent.safetensors --out /tmp/x.safetensors", 1}, {"data --task sudoku", 2},
           {"bench --mechanisms full,magic --lengths 8", 2}}) {
    CliRun r = run(args);
    EXPECT_EQ(r.code, code) << args;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << args;
  }
}

TEST(Cli, DemoPassesItsGradientChecks) {
  CliRun demo = run("demo");
  EXPECT_EQ(demo.code, 0) << demo.out;
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
