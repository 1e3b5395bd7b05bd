#include "autograd/trace.h"

namespace cast::autograd {

namespace {
thread_local const char* step_now = nullptr;
thread_local const char* fast_path_now = nullptr;
thread_local TapeObserver* observer_now = nullptr;
}  // namespace

StepScope::StepScope(const char* step) : opened_(step_now == nullptr) {
  if (!opened_) return;
  step_now = step;
  if (observer_now) observer_now->step_began(step);
}

StepScope::~StepScope() {
  if (!opened_) return;
  if (observer_now) observer_now->step_ended(step_now);
  step_now = nullptr;
}

FastPathScope::FastPathScope(const char* fast_path) : previous_(fast_path_now) { fast_path_now = fast_path; }
FastPathScope::~FastPathScope() { fast_path_now = previous_; }

const char* current_step() { return step_now; }
const char* current_fast_path() { return fast_path_now; }

TapeObserver* set_tape_observer(TapeObserver* observer) {
  TapeObserver* previous = observer_now;
  observer_now = observer;
  return previous;
}
TapeObserver* tape_observer() { return observer_now; }

}  // namespace cast::autograd
