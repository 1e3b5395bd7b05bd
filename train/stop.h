#pragma once
// Stopping a run on request (Ctrl-C, SIGTERM): the signal handler only raises a flag; the
// trainer polls it between steps, finishes the step, writes a checkpoint and throws
// Interrupted, so the work is kept and only main decides the exit code (128 + signal).
#include <string>

#include "tensor/error.h"

namespace cast::train {

// SIGINT, SIGTERM and SIGHUP: the first one raises the flag (after this, a second one ends the process
// at once with 128 + its number; the last checkpoint written stays, as every write is atomic).
// One within half a second of the first is that stop delivered again (another signal than the
// first says so). SIGQUIT ends the process at once, as a second signal does. A signal the
// process was started ignoring stays ignored.
void install_stop_handlers();
// The other commands, which have nothing to save: SIGINT, SIGTERM, SIGHUP or SIGQUIT removes the temporary
// file of a write in progress (files::write_atomic), says so in one line and exits 128 + signal.
void install_exit_handlers();
int stop_signal();              // the signal that asked to stop, 0 when none did
int stop_signal_within(int milliseconds);  // the same, waiting up to that long for one to come
void request_stop(int signal);  // what the handler does; tests call it to stop at a known step
// Tests: the stop request comes at the (polls + 1)-th poll of stop_signal() from now, to stop
// inside an evaluation (one poll a step, one a batch) at a known batch.
void request_stop_after_polls(int signal, int64_t polls);
void clear_stop();
// What a second signal's line says after "cast: stopped at once by a second SIGINT" (for a run:
// which checkpoint stays and how to resume); set before the work starts.
void set_second_signal_note(const std::string& note);
// What the first signal's line says at once after "cast: SIGTERM: " (what the command does
// before it stops), so that a stop that waits for a long step is seen to have been heard.
void set_first_signal_note(const std::string& note);

// "SIGINT", "SIGTERM", "SIGHUP", or "signal N".
std::string signal_name(int signal);
// A word as a POSIX shell reads it back: itself when safe, else in single quotes.
std::string shell_quote(const std::string& word);

// A stop request honoured: main prints the line and exits with 128 + the signal.
class Stopped : public Error {
 public:
  Stopped(int signal, const std::string& what) : Error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// A run stopped: what was written and the command that continues the work.
class Interrupted : public Stopped {
 public:
  Interrupted(int signal, std::string what_happened, std::string resume_command)
      : Stopped(signal, what_happened + "; resume with: " + resume_command), what_happened_(std::move(what_happened)) {}
  const std::string& what_happened() const { return what_happened_; }

 private:
  std::string what_happened_;
};

// A stop request seen during an evaluation, which stops there: its caller says what was kept.
class EvaluationStopped : public Stopped {
 public:
  explicit EvaluationStopped(int signal)
      : Stopped(signal, fmt::format("stopped by {} during an evaluation", signal_name(signal))) {}
};

}  // namespace cast::train
