// cast: the command-line entry point. Library code throws; only this file decides exit codes:
// 0 success, 1 an error (one line on stderr), 2 a usage error, 128 + N a run stopped by signal N
// (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP) after saving its checkpoint.
#include <fcntl.h>
#include <sys/resource.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cpu/runtime.h"
#include "tensor/error.h"
#include "tensor/files.h"
#include "commands/commands.h"
#include "train/memory_estimate.h"
#include "train/stop.h"

static void usage() {
  std::fputs("usage: cast <command> [options]   (cast <command> --help for its options)\n\ncommands:\n", stdout);
  for (const auto& c : cast::commands()) std::printf("  %-10s %s\n", c.name, c.summary);
}

// A standard stream closed at start (`cast train ... >&-`) is opened again, so that no file this
// command opens takes descriptor 0, 1 or 2 and receives the console's lines: standard input and
// error on /dev/null, standard output on /dev/full, where every write fails as it would have on
// the closed descriptor. What the command prints is its result (eval's accuracies), so its loss
// is an error, as with `> /dev/full`, and said as a closed output.
// (The mark survives the restart with the CPU runtime's settings in this variable.)
static void reopen_closed_standard_streams() {
  constexpr const char* kClosedMark = "CAST_STDOUT_CLOSED_AT_START";
  if (const char* mark = std::getenv(kClosedMark)) {  // set by this process before its restart
    if (std::string_view(mark) == "1") cast::files::note_standard_output_closed_at_start();
    unsetenv(kClosedMark);  // not for the processes this one starts
  }
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int opened = -1;
    if (fd == 1) opened = open("/dev/full", O_WRONLY);  // the lowest free descriptor: fd
    if (opened < 0) opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened == 1) {
      cast::files::note_standard_output_closed_at_start();
      setenv(kClosedMark, "1", 1);
    }
    if (opened > 2) close(opened);
  }
}

// What the command printed must have reached standard output: a full disk or device there
// (`cast eval ... > /dev/full`) is an error, not a success with the results lost.
static int check_standard_output(const std::string& name, int code) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
  std::fprintf(stderr, "cast %s: error: cannot write to standard output (%s)\n", name.c_str(),
               cast::files::standard_output_failure(errno).c_str());
  return code == 0 ? 1 : code;
}

// Ctrl-C, SIGTERM and SIGHUP are held from the first instruction until the command's handlers
// are in place (the mask survives the restart below): a signal in the first moments of `cast
// train` then stops it as one a minute later would, instead of killing it before it can say so.
static void hold_stop_signals(bool hold) {
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGHUP);
  sigaddset(&stops, SIGQUIT);
  sigprocmask(hold ? SIG_BLOCK : SIG_UNBLOCK, &stops, nullptr);
}

// The earliest our code runs: before main and the other static initialisers of this binary.
__attribute__((constructor(101))) static void hold_stop_signals_from_the_start() { hold_stop_signals(true); }

// OpenBLAS reserves its buffers as the program loads, before main; where an address-space limit
// (ulimit -v, about 0.8 to 1 GB here) refuses them, the release this project links (Debian 12's)
// retries for ever at full CPU, saying nothing (later releases fail instead). That happens
// before any constructor of ours, but after the executable's pre-initialisation functions: so,
// under such a limit only, one of those sets an alarm that main cancels first thing, and an
// alarm that rings says why cast could not start. A normal start under a limit takes half a
// second here.
constexpr unsigned kLibraryStartSeconds = 15;
static bool g_start_alarm_set = false;

static char g_start_timeout_text[320];  // made before the alarm is set: the handler only writes it

static void library_start_timed_out(int) {
  const ssize_t written = write(STDERR_FILENO, g_start_timeout_text, std::strlen(g_start_timeout_text));
  (void)written;
  _exit(1);
}

static void time_library_start(int, char**, char**) {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  std::snprintf(g_start_timeout_text, sizeof g_start_timeout_text,
                "cast: error: the libraries did not finish loading in %u s: OpenBLAS cannot reserve its buffers under "
                "the address-space limit of %llu MiB (ulimit -v %llu); raise the limit\n",
                kLibraryStartSeconds, static_cast<unsigned long long>(limit.rlim_cur >> 20),
                static_cast<unsigned long long>(limit.rlim_cur >> 10));
  struct sigaction ring {};
  ring.sa_handler = library_start_timed_out;
  sigaction(SIGALRM, &ring, nullptr);
  const unsigned pending = alarm(kLibraryStartSeconds);
  if (pending != 0) {  // an alarm of the caller's, inherited across exec: left as it was
    alarm(pending);
    signal(SIGALRM, SIG_DFL);
    return;
  }
  g_start_alarm_set = true;
}
__attribute__((section(".preinit_array"), used)) static void (*const time_library_start_entry)(int, char**, char**) =
    time_library_start;

static void library_start_done() {
  if (!g_start_alarm_set) return;
  alarm(0);
  signal(SIGALRM, SIG_DFL);
  g_start_alarm_set = false;
}

// The OpenMP settings cast itself reads or sets, checked before the runtime's own use of them:
// OMP_NUM_THREADS beyond what a process may start (100000) kills the runtime inside its first
// parallel region, by signal; a value the runtime cannot read it ignores after a warning of its
// own, which the restart (cpu/runtime.h) would print a second time. Each is refused here with one
// line instead. OMP_NUM_THREADS may be a list ("4,2").
static bool openmp_settings_are_sane() {
  const auto refuse = [](const char* name, const char* value, const char* want) {
    std::fprintf(stderr, "cast: error: %s=%s: %s\n", name, value, want);
    return false;
  };
  if (const char* value = std::getenv("OMP_NUM_THREADS")) {
    for (const char* p = value;;) {
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(p, &end, 10);
      if (end == p || !std::isdigit(static_cast<unsigned char>(*p)) || errno != 0 || n < 1 || (*end != ',' && *end))
        return refuse("OMP_NUM_THREADS", value, "not a thread count (whole numbers from 1 to 4096, comma-separated)");
      if (n > 4096) return refuse("OMP_NUM_THREADS", value, "more threads than cast starts (at most 4096)");
      if (*end == '\0') break;
      p = end + 1;
    }
  }
  if (const char* value = std::getenv("OMP_WAIT_POLICY")) {
    const std::string v = value;
    if (strcasecmp(v.c_str(), "active") != 0 && strcasecmp(v.c_str(), "passive") != 0)
      return refuse("OMP_WAIT_POLICY", value, "not a wait policy (active or passive)");
  }
  // a stack per thread: one the system cannot give ends the runtime at its first parallel region
  // with its own line only, after cast has made its outputs' folders
  if (const char* value = std::getenv("OMP_STACKSIZE")) {
    std::string v = value;
    uint64_t unit = 1024;  // the runtime's default unit: KiB
    if (!v.empty() && std::string_view("bBkKmMgG").find(v.back()) != std::string_view::npos) {
      const char u = static_cast<char>(std::tolower(static_cast<unsigned char>(v.back())));
      unit = u == 'b' ? 1 : u == 'k' ? 1024 : u == 'm' ? 1024 * 1024 : uint64_t{1} << 30;
      v.pop_back();
    }
    if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
      return refuse("OMP_STACKSIZE", value, "not a stack size (a whole number with B, K, M or G)");
    const uint64_t count = std::stoull(v);  // at most 12 digits: no overflow here
    // a product past 2^64 would wrap to a small size the runtime refuses with its own warning
    const uint64_t bytes = count > UINT64_MAX / unit ? UINT64_MAX : count * unit;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const uint64_t memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
    if (memory > 0 && bytes > memory / 4)
      return refuse("OMP_STACKSIZE", value, "more stack per thread than a quarter of this machine's memory");
    if (bytes < 16 * 1024) return refuse("OMP_STACKSIZE", value, "below the OpenMP runtime's least stack, 16K");
  }
  if (const char* value = std::getenv("GOMP_SPINCOUNT")) {
    std::string v = value;
    const bool word = strcasecmp(value, "infinite") == 0 || strcasecmp(value, "infinity") == 0;
    if (!v.empty() && std::string_view("kMGT").find(v.back()) != std::string_view::npos) v.pop_back();  // 10k
    if (!word && (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 15))
      return refuse("GOMP_SPINCOUNT", value, "not a spin count (a whole number, with k, M, G or T, or infinite)");
  }
  return true;
}

// A stop signal heard (its line said "stopping") after the last point where the command could
// stop: said, so that the line is not left unanswered. A command that finished its work exits 0;
// one whose terminal went away (SIGHUP) had its last lines shown nowhere, and exits 129. cast data
// says its own line.
static int signal_that_came_too_late(const std::string& name) {
  const int signal = cast::train::stop_signal();
  if (signal == 0 || name == "data" || (name != "train" && name != "compare" && name != "eval")) return 0;
  const std::string heard = cast::train::signal_name(signal);
  if (signal == SIGHUP && cast::files::standard_output_was_terminal()) {
    std::fprintf(stderr, "cast %s: %s came as it finished: the work is done, but its terminal went away before its "
                 "last lines could be shown\n", name.c_str(), heard.c_str());
    return 128 + signal;
  }
  std::fprintf(stderr, "cast %s: %s came as it finished: the work was done, not stopped\n", name.c_str(),
               heard.c_str());
  return 0;
}

static bool working_folder_exists() {
  std::vector<char> buffer(4096);
  while (::getcwd(buffer.data(), buffer.size()) == nullptr) {
    if (errno != ERANGE) return errno != ENOENT;  // only a removed folder is known to be gone
    buffer.resize(buffer.size() * 2);
  }
  return true;
}

int main(int argc, char** argv) {
  library_start_done();
  cast::ops::restore_stderr_after_restart();
  reopen_closed_standard_streams();
  // A reader gone (`cast train | head -1`) or a file-size limit (ulimit -f) fails the write that
  // meets it, with EPIPE or EFBIG, instead of killing the process: the command then says so and
  // keeps its work (training saves its checkpoint first).
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
  if (!openmp_settings_are_sane()) return 2;
  cast::ops::restart_with_cpu_runtime(argv);  // passive OpenMP waits, the BLAS kernels for this CPU
  if (const std::string refusal = cast::ops::blas_core_refusal(); !refusal.empty()) {
    std::fprintf(stderr, "cast: error: OPENBLAS_CORETYPE=%s: %s\n", std::getenv("OPENBLAS_CORETYPE"), refusal.c_str());
    return 2;
  }
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    hold_stop_signals(false);
    usage();
    const int code = argc < 2 ? 2 : 0;
    if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
    std::fprintf(stderr, "cast: error: cannot write to standard output (%s)\n",
                 cast::files::standard_output_failure(errno).c_str());
    return code == 0 ? 1 : code;
  }
  const std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : cast::commands()) {
    if (name != c.name) continue;
    // A working folder removed under the shell: every relative path, the defaults (runs/, data/)
    // among them, names nothing, and each would fail later in words of its own
    if (name != "info" && !working_folder_exists()) {
      std::fprintf(stderr,
                   "cast %s: error: the working folder was removed (getcwd: no such file or folder), so no relative "
                   "path, the default runs/ and data/ among them, can be found or made: cd into a folder that exists\n",
                   cast::visible(name).c_str());
      return 2;
    }
    // Under an address-space limit that leaves the BLAS no room for its work buffers, its first
    // product would retry to map them without end: refused first (the commands that size their
    // work refuse it later with the work's size; plot, data and info run no products)
    const bool help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                      std::find(args.begin(), args.end(), "-h") != args.end();
    if (name != "info" && name != "plot" && name != "data" && !help) {
      try {
        cast::train::require_blas_room("");
      } catch (const cast::Error& e) {
        std::fprintf(stderr, "cast %s: error: %s\n", cast::visible(name).c_str(), e.what());
        return 1;
      }
    }
    // Ctrl-C, SIGTERM or SIGHUP while training: the current step is finished and saved first (SIGQUIT:
    // at once).
    // `cast eval`: the evaluation stops between batches (nothing is written, so nothing to save).
    // `cast data`: the generator stops between examples and says the set is unfinished.
    if (name == "train" || name == "compare" || name == "eval" || name == "data") {
      cast::train::install_stop_handlers();
      cast::train::set_first_signal_note(
          name == "eval"   ? ": stopping after the batch in progress; send it again to stop at once"
          : name == "data" ? ": stopping after the example in progress; send it again to stop at once"
                           : ": stopping once the step (or evaluation batch) in progress is done and saved; send it "
                             "again to stop at once");
    } else {
      cast::train::install_exit_handlers();  // nothing to save: a write in progress leaves no temporary file
    }
    hold_stop_signals(false);  // a signal that came meanwhile arrives now
    try {
      const int code = check_standard_output(name, c.run(args));
      return code == 0 ? signal_that_came_too_late(name) : code;
    } catch (const cast::train::Stopped& e) {  // the shell's convention: 128 + the signal
      std::fprintf(stderr, "cast %s: %s\n", name.c_str(), e.what());
      return 128 + e.signal();
    } catch (const cast::UsageError& e) {
      std::fprintf(stderr, "cast %s: error: %s\n", name.c_str(), e.what());
      return 2;
    } catch (const cast::Error& e) {
      std::fprintf(stderr, "cast %s: error: %s\n", name.c_str(), e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr,
                   "cast %s: error: out of memory (a size in the settings or an input file is more than this "
                   "machine holds)\n",
                   name.c_str());
      return 1;
    } catch (const std::length_error&) {
      std::fprintf(stderr, "cast %s: error: a size in the settings or an input file is beyond what can be allocated\n",
                   name.c_str());
      return 1;
    } catch (const std::filesystem::filesystem_error& e) {
      // what() is "filesystem error: cannot create directories: <reason> [path]": the operation
      // is said with the path, not the reason alone; a status() query's name is no operation of
      // the user's, so the reason stands alone there, in cast's words
      std::string what = e.what();
      if (what.rfind("filesystem error: ", 0) == 0) what.erase(0, std::strlen("filesystem error: "));
      if (const size_t bracket = what.find(" ["); bracket != std::string::npos) what.erase(bracket);
      if (what.rfind("status: ", 0) == 0) what = cast::files::reason(e.code().value());
      std::fprintf(stderr, "cast %s: error: %s: %s\n", name.c_str(), e.path1().c_str(), what.c_str());
      return 1;
    } catch (const std::system_error& e) {
      // fmt's print to the console fails with "cannot write to file": standard output is the one
      // file written without a name
      if (std::string(e.what()).find("cannot write to file") != std::string::npos)
        std::fprintf(stderr, "cast %s: error: cannot write to standard output (%s)\n", name.c_str(),
                     cast::files::standard_output_failure(e.code().value()).c_str());
      else std::fprintf(stderr, "cast %s: unexpected error: %s\n", name.c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cast %s: unexpected error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  hold_stop_signals(false);
  std::fprintf(stderr, "cast: unknown command '%s' (cast --help lists them)\n", cast::visible(name).c_str());
  return 2;
}
