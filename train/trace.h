#pragma once
// `--trace`: every node of the tape as it is recorded (the forward) and as its backward runs:
// its op, the implementation that ran it, its input and output shapes, the tensors it holds for
// the backward with their bytes, and its time; then the totals of the pass. Text on stdout, or
// one JSON object per line in a file, for tools.
//
// What "saved bytes" counts: the distinct storage the tape keeps alive, that is every tensor a
// node holds (its named fields: the inputs it keeps and what its forward saved, and its
// outputs), each storage once. A node's "holds +N" is the storage first held by it, so the
// nodes' figures add up to the total.
#include <chrono>
#include <exception>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/trace.h"
#include "tensor/tensor.h"

namespace cast::train {

struct TraceTotals {
  int64_t nodes = 0;
  size_t saved_bytes = 0;                  // distinct storage the tape holds
  size_t saved_bytes_unmade = 0;           // the part no node produced: parameters, inputs, masks, indices
  double forward_ms = 0, backward_ms = 0;  // the sums of the pass's lines (the trace's own work left out)
};

class Trace final : public autograd::TapeObserver {
 public:
  // json_path "": text on stdout (print false: kept in events() only, for tests); else JSON
  // lines, the finished passes' written to json_path by write_file() (kept in memory until
  // then, as many bytes as the file). Installs itself on this thread's tape.
  // An existing file at json_path is replaced only when it is a trace, or with `overwrite`.
  // overwrite: replace a file at json_path that is not a trace; may_overwrite: whether the
  // command's --overwrite would (cast train's replaces a run, never another file); owner: the run
  // folder the command writes, where the trace may replace a trace (train::check_user_output)
  explicit Trace(std::string json_path = "", bool print = true, bool overwrite = false, bool may_overwrite = true,
                 const std::string& owner = "");
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // A pass is one forward and its backward ("layer", "step 3"), on one device (a GPU is
  // synchronized before every time taken).
  void begin_pass(const std::string& label, Device device);
  TraceTotals end_pass();  // prints or stores the totals
  void abort_pass();       // a pass that threw: its events are dropped, the trace waits for the next
  const TraceTotals& totals() const { return totals_; }  // of the pass so far
  void write_file() const;                               // the JSON lines, written atomically (text mode: nothing)

  // The events not yet printed or written (with print false: every event), as the JSON file has
  // them: phase forward | step | backward | totals.
  const std::vector<nlohmann::json>& events() const { return events_; }

  void step_began(const char* step) override;
  void step_ended(const char* step) override;
  void recorded(const autograd::Node& node) override;
  void backward_began() override;
  void before_backward(const autograd::Node& node) override;
  void after_backward(const autograd::Node& node, bool ran) override;
  void backward_ended() override;

 private:
  using Clock = std::chrono::steady_clock;
  double lap_ms();  // since the previous event
  void emit(nlohmann::json event);
  nlohmann::json where_the_time_went() const;
  void rethrow_failure();  // an error kept by step_ended, which runs in a destructor

  void say(const std::string& line) const;

  std::string json_path_;
  bool print_;
  autograd::TapeObserver* previous_;
  std::vector<nlohmann::json> events_;
  std::string label_;
  bool on_gpu_ = false, in_pass_ = false;
  Clock::time_point last_;
  std::string file_text_;  // JSON mode: the finished passes' lines
  std::exception_ptr failure_;
  std::set<const Storage*> held_;  // storage the tape holds in this pass
  std::unordered_map<const autograd::Node*, int64_t> index_;
  int64_t step_nodes_ = 0;
  size_t pass_first_event_ = 0;
  std::string backward_step_;  // the step of the last backward line (text: a header when it changes)
  TraceTotals totals_;
};

// "1.5 KiB": bytes for people.
std::string human_bytes(size_t bytes);

}  // namespace cast::train
