#include "train/stop.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "tensor/files.h"
#include "tensor/text.h"

namespace cast::train {

namespace {
// Lock-free, so a signal handler may store to it (a plain int store would do on every target
// this builds for; the atomic says so in the type).
std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free);
// When the first stop signal came (CLOCK_MONOTONIC, ns; 0: not through the handler).
std::atomic<int64_t> g_first_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free);
// One Ctrl-C can arrive twice within microseconds: from the terminal to the whole process group,
// and from a wrapper that forwards what it gets (`timeout`, a scheduler), perhaps as SIGTERM. A
// stop signal this soon after the first is that one again, not the user's second.
constexpr int64_t kSameSignalNs = 500'000'000;

int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// Tests: stop_signal() answers 0 this many more times, then g_polls_signal (0: no such request).
std::atomic<int64_t> g_polls_left{0};
std::atomic<int> g_polls_signal{0};

// The line a second signal prints: set before the work starts (the handler may not format),
// read by the handler only while g_note_ready says it is whole.
char g_second_note[4096] = "";
std::atomic<bool> g_note_ready{false};
char g_first_note[512] = "";
std::atomic<bool> g_first_note_ready{false};
std::atomic<bool> g_output_is_terminal{false};  // standard output, as the handlers were installed
static_assert(std::atomic<bool>::is_always_lock_free);

// Writes a line of up to five pieces to standard error from a signal handler, in one write so
// that no other writer's text falls between its pieces (write and strlen are async-signal-safe;
// the copy is a plain loop).
void say(const char* a, const char* b = "", const char* c = "", const char* d = "", const char* e = "") {
  char line[sizeof(g_second_note) + 256];
  size_t n = 0;
  for (const char* piece : {a, b, c, d, e})
    for (; *piece != '\0' && n + 2 < sizeof(line); ++piece) line[n++] = *piece;
  line[n++] = '\n';
  for (const char* text = line; n > 0;) {
    const ssize_t w = write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w, n -= static_cast<size_t>(w);
  }
}

// The name of a signal a handler here catches, or nullptr; no allocation, so handlers may call it.
const char* known_signal_name(int signal) {
  return signal == SIGINT    ? "SIGINT"
         : signal == SIGTERM ? "SIGTERM"
         : signal == SIGHUP  ? "SIGHUP"
         : signal == SIGQUIT ? "SIGQUIT"
                             : nullptr;
}

// Ends the process by the signal itself (its default action), so that a shell running it in a
// loop sees a death by signal and stops too: an exit with 128 + signal reads as handled.
// signal() and raise() are async-signal-safe.
void die_by(int signal) {
  ::signal(signal, SIG_DFL);
  ::raise(signal);  // pending: the handler runs with its own signal blocked
  sigset_t own;
  sigemptyset(&own);
  sigaddset(&own, signal);
  ::sigprocmask(SIG_UNBLOCK, &own, nullptr);  // delivered here, by the default action
  _exit(128 + signal);                        // not reached; the shell's code for it if it were
}

// Standard output onto /dev/null (open and dup2 are async-signal-safe): after a hangup a write
// to the terminal fails, and the run would end in that error instead of its stop line and code.
void quiet_standard_output() {
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null < 0) return;
  ::dup2(null, STDOUT_FILENO);
  ::close(null);
}

extern "C" void on_stop_signal(int signal) {
  // A second signal: the user does not want to wait for the step to finish. _exit, unlink, write
  // and clock_gettime are async-signal-safe; exit() and the stdio it flushes are not. SIGQUIT
  // (Ctrl-\) asks for that at once: it is never a first signal.
  if (signal == SIGQUIT) {
    files::remove_temporaries_now();
    say("cast: stopped at once by SIGQUIT", g_note_ready.load() ? g_second_note : "");
    ::prctl(PR_SET_DUMPABLE, 0);  // SIGQUIT's default action: a stop, not a core file in the user's folder
    die_by(signal);
  }
  if (const int first_signal = g_stop.load(); first_signal != 0) {
    // a signal this soon after the first is that stop delivered again (a wrapper forwards what it
    // gets, or turns a Ctrl-C into SIGTERM for its children): said, when it is another signal
    const int64_t first = g_first_ns.load();
    if (first != 0 && now_ns() - first < kSameSignalNs) {
      if (signal != first_signal) {
        const char *name = known_signal_name(signal), *before = known_signal_name(first_signal);
        say("cast: ", name ? name : "signal", ": the same stop as the ", before ? before : "signal",
            " just before (send a signal again to stop at once)");
      }
      return;
    }
    files::remove_temporaries_now();  // a checkpoint being written: its temporary file goes
    const char* name = known_signal_name(signal);
    say("cast: stopped at once by a second ", name ? name : "signal", g_note_ready.load() ? g_second_note : "");
    die_by(signal);
  }
  // the terminal is gone: progress lines go nowhere (a file keeps what stdio holds for it)
  if (signal == SIGHUP && g_output_is_terminal.load()) quiet_standard_output();
  g_first_ns.store(now_ns());
  g_stop.store(signal);
  if (g_first_note_ready.load()) {  // heard at once: a step may take a minute to finish
    const char* name = known_signal_name(signal);
    say("cast: ", name ? name : "signal", g_first_note);
  }
}
}  // namespace

void set_second_signal_note(const std::string& note) {
  g_note_ready.store(false);  // a handler running meanwhile prints no note, never a torn one
  const size_t n = std::min(note.size(), sizeof(g_second_note) - 1);
  std::memcpy(g_second_note, note.data(), n);
  g_second_note[n] = '\0';
  g_note_ready.store(true);
}

void set_first_signal_note(const std::string& note) {
  g_first_note_ready.store(false);
  const size_t n = std::min(note.size(), sizeof(g_first_note) - 1);
  std::memcpy(g_first_note, note.data(), n);
  g_first_note[n] = '\0';
  g_first_note_ready.store(true);
}

namespace {
// A command with nothing to save: a stop ends it at once, its temporary files removed first.
extern "C" void on_exit_signal(int signal) {
  files::remove_temporaries_now();
  const char* name = known_signal_name(signal);
  say("cast: stopped by ", name ? name : "signal");
  die_by(signal);
}

void install(void (*handler)(int)) {
  g_output_is_terminal.store(::isatty(STDOUT_FILENO) != 0);
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in progress go on instead of failing with EINTR
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {  // SIGHUP: the terminal went away
    // A signal ignored when the process started stays ignored: a shell ignores SIGINT for the
    // jobs a script puts in the background, and nohup-style launchers do the same on purpose.
    struct sigaction before {};
    if (sigaction(signal, nullptr, &before) == 0 && before.sa_handler == SIG_IGN) continue;
    sigaction(signal, &action, nullptr);
  }
}
}  // namespace

void install_exit_handlers() { install(on_exit_signal); }

void install_stop_handlers() { install(on_stop_signal); }

int stop_signal() {
  if (g_polls_signal.load() != 0 && g_polls_left.fetch_sub(1) <= 0) {
    g_stop.store(g_polls_signal.load());
    g_polls_signal.store(0);
  }
  return g_stop.load();
}
int stop_signal_within(int milliseconds) {
  for (int waited = 0;; waited += 5) {
    if (const int signal = stop_signal()) return signal;
    if (waited >= milliseconds) return 0;
    ::usleep(5000);
  }
}
void request_stop(int signal) { g_stop.store(signal); }
void request_stop_after_polls(int signal, int64_t polls) {
  g_polls_left.store(polls);
  g_polls_signal.store(signal);
}
void clear_stop() {
  g_stop.store(0);
  g_first_ns.store(0);
  g_polls_signal.store(0);
}

std::string signal_name(int signal) {
  const char* name = known_signal_name(signal);
  return name ? name : fmt::format("signal {}", signal);
}

std::string shell_quote(const std::string& word) { return text::shell_word(word); }

}  // namespace cast::train
