#pragma once
// What a trace of the tape needs from the engine: two scopes that name where a node comes from,
// and an observer the tape calls as it records and runs nodes. Printing lives in train/trace.h.
//
// The scopes cost a thread-local pointer each; the observer is a null check when nobody traces.
namespace cast::autograd {

struct Node;

// Names the step of docs/attention.md (surrogate_scores, cluster_topk, ...) that the ops inside
// run for. Nodes recorded in the scope carry the name; an inner scope inside a named one (a step
// op called by ops::run_step under the same name) changes nothing.
class StepScope {
 public:
  explicit StepScope(const char* step);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  bool opened_;
};

// Marks the nodes recorded inside as run by a fast path of ops/attention/fast_paths.h (by its name).
class FastPathScope {
 public:
  explicit FastPathScope(const char* fast_path);
  ~FastPathScope();
  FastPathScope(const FastPathScope&) = delete;
  FastPathScope& operator=(const FastPathScope&) = delete;

 private:
  const char* previous_;
};

const char* current_step();       // nullptr outside every step
const char* current_fast_path();  // nullptr: the reference ops

// Called by the tape of this thread while installed. Every call happens after the work it
// reports: recorded() after the op's forward ran, after_backward() after the node's backward.
class TapeObserver {
 public:
  virtual void step_began(const char* step) = 0;
  virtual void step_ended(const char* step) = 0;  // runs in StepScope's destructor: must not throw
  virtual void recorded(const Node& node) = 0;
  virtual void backward_began() = 0;
  virtual void before_backward(const Node& node) = 0;
  virtual void after_backward(const Node& node, bool ran) = 0;  // ran: false when no gradient reached it
  virtual void backward_ended() = 0;

 protected:
  ~TapeObserver() = default;
};

// Installs `observer` on this thread's tape (nullptr removes it); returns the previous one.
TapeObserver* set_tape_observer(TapeObserver* observer);
TapeObserver* tape_observer();

}  // namespace cast::autograd
