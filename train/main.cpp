// cast: the command-line entry point. Library code throws; only this file decides exit codes:
// 0 success, 1 an error (one line on stderr), 2 a usage error.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "train/commands.h"

static void usage() {
  std::fputs("usage: cast <command> [options]   (cast <command> --help for its options)\n\ncommands:\n", stdout);
  for (const auto& c : cast::commands()) std::printf("  %-10s %s\n", c.name, c.summary);
}

// OpenMP threads that wait by spinning steal the core from whatever else runs on the machine,
// and a step then waits on a descheduled thread: with one other busy process a training run
// took 9x its idle time. Passive waiting (threads sleep at barriers) keeps that near 2x and
// costs nothing measurable idle (bench/RESULTS.md). libgomp reads the setting when it loads,
// before main, so it is set here and the program restarts itself once; a value the user set
// is kept.
static void wait_passively(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run on with the default
}

int main(int argc, char** argv) {
  wait_passively(argv);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : cast::commands()) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const cast::Error& e) {
      std::fprintf(stderr, "cast %s: error: %s\n", name.c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cast %s: unexpected error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "cast: unknown command '%s' (cast --help lists them)\n", name.c_str());
  return 2;
}
