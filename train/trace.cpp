#include "train/trace.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <utility>

#include "autograd/tape.h"
#include "tensor/files.h"
#include "train/run_folder.h"
#ifdef CAST_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace cast::train {

using nlohmann::json;

std::string human_bytes(size_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < size_t{1} << 30) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
}

namespace {

std::string shape_text(const json& t) {
  std::string dims;
  for (const auto& d : t["shape"]) dims += (dims.empty() ? "" : ",") + std::to_string(d.get<int64_t>());
  return fmt::format("{}[{}]", t["dtype"].get<std::string>(), dims);
}

json tensor_json(const char* name, const Tensor& t) {
  json j = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}};
  if (name) j["name"] = name;
  return j;
}

// The node's fields. Each storage seen for the first time in this pass is added to `held` and
// counted; first seen as an input, it is one no node made (the inputs of a node come before it).
class FieldList final : public autograd::FieldVisitor {
 public:
  explicit FieldList(std::set<const Storage*>& held) : held_(held) {}
  void input(const char* name, const Tensor& t) override {
    if (!t.defined()) return;
    inputs.push_back(tensor_json(name, t));
    hold(t, false);
  }
  void saved(const char* name, const Tensor& t) override {
    if (!t.defined()) return;
    json j = tensor_json(name, t);
    j["bytes"] = t.nbytes();
    saved_fields.push_back(j);
    hold(t, true);
  }
  void output(const Tensor& t) {
    outputs.push_back(tensor_json(nullptr, t));
    hold(t, true);
  }
  json inputs = json::array(), saved_fields = json::array(), outputs = json::array();
  size_t new_bytes = 0, new_unmade_bytes = 0;

 private:
  void hold(const Tensor& t, bool made_here) {
    const Storage* s = t.impl()->storage.get();
    if (!held_.insert(s).second) return;
    new_bytes += s->bytes;
    if (!made_here) new_unmade_bytes += s->bytes;
  }
  std::set<const Storage*>& held_;
};

std::string implementation(const autograd::Node& node, Device device) {
  std::string s = fmt::format("{} {}", node.fast_path ? "fast" : "reference", device_name(device));
  if (node.fast_path && std::string(node.fast_path) != node.name()) s += fmt::format(" (in {})", node.fast_path);
  return s;
}

// One event as a line of text.
std::string text_line(const json& e) {
  const std::string phase = e["phase"];
  if (phase == "step") {
    if (e["event"] == "begin") return fmt::format("      ── {}", e["step"].get<std::string>());
    return fmt::format("         no node: its integer results are constants of the backward ({:.3f} ms)",
                       e["ms"].get<double>());
  }
  if (phase == "totals")
    return fmt::format(
        "trace {}: {} nodes, saved {} ({} of it held but made by no node: parameters, inputs, "
        "masks, indices), forward {:.3f} ms, backward {:.3f} ms",
        e["pass"].get<std::string>(), e["nodes"].get<int64_t>(), human_bytes(e["saved_bytes"].get<size_t>()),
        human_bytes(e["saved_bytes_unmade"].get<size_t>()), e["forward_ms"].get<double>(),
        e["backward_ms"].get<double>());
  const std::string head = fmt::format("{:>6}  {:<31} {:<15}", e["index"].get<int64_t>(), e["op"].get<std::string>(),
                                       e["implementation"].get<std::string>());
  if (phase == "backward")
    return e["ran"].get<bool>() ? fmt::format("{} {:>9.3f} ms", head, e["ms"].get<double>())
                                : fmt::format("{}  skipped: no gradient reached its outputs", head);
  std::string io;
  for (const auto& t : e["inputs"])
    io += fmt::format("{}{} {}", io.empty() ? "" : ", ", t["name"].get<std::string>(), shape_text(t));
  io += " →";
  for (const auto& t : e["outputs"]) io += " " + shape_text(t);
  std::string saves;
  for (const auto& t : e["saved"])
    saves += fmt::format("{}{} {} {}", saves.empty() ? "  saves " : ", ", t["name"].get<std::string>(), shape_text(t),
                         human_bytes(t["bytes"].get<size_t>()));
  return fmt::format("{} {:>9.3f} ms  holds +{:<9} {}{}", head, e["ms"].get<double>(),
                     human_bytes(e["new_bytes"].get<size_t>()), io, saves);
}

}  // namespace

Trace::Trace(std::string json_path, bool print, bool overwrite, bool may_overwrite, const std::string& owner)
    : json_path_(std::move(json_path)), print_(print) {
  if (!json_path_.empty()) {  // a file that cannot be written is refused now, not after the work
    // '-' reads as standard output elsewhere; here it would be a file named '-' in the folder
    CAST_CHECK_USAGE(json_path_ != "-",
                     "--trace -: the trace goes to standard output with --trace alone; give a file name to write JSON "
                     "lines");
    // a trace in the run folder the command is about to make is checked once that folder is made
    if (!owner.empty() && !files::exists(owner) && files::same_path(folder_of(json_path_), owner)) {
      previous_ = autograd::set_tape_observer(this);
      return;
    }
    files::output_target(json_path_, "--trace", files::Link::follow_once);
    // every line of a trace has its phase; no other file the engine writes has one
    check_user_output(json_path_, "--trace", "a cast trace", "\"phase\":", overwrite, owner,
                      may_overwrite ? "pass --overwrite to replace it, or choose another path"
                                    : "choose another path: --overwrite replaces a run, not another file");
  }
  previous_ = autograd::set_tape_observer(this);
}

void Trace::say(const std::string& line) const {
  if (print_ && json_path_.empty()) fmt::print("{}\n", line);
}

Trace::~Trace() { autograd::set_tape_observer(previous_); }

double Trace::lap_ms() {
#ifdef CAST_WITH_CUDA
  if (on_gpu_) cuda::synchronize();
#endif
  const auto now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
  return ms;
}

void Trace::emit(json event) {
  event["pass"] = label_;
  say(text_line(event));
  events_.push_back(std::move(event));
  last_ = Clock::now();  // the trace's own work counts towards no node
}

void Trace::rethrow_failure() {
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void Trace::begin_pass(const std::string& label, Device device) {
  label_ = label;
  on_gpu_ = device == Device::cuda;
  in_pass_ = true;
  held_.clear();
  index_.clear();
  totals_ = TraceTotals{};
  say(fmt::format("trace {}: forward, every node as it is recorded (ms: its forward, since the line before)", label));
  pass_first_event_ = events_.size();
  lap_ms();
}

void Trace::step_began(const char* step) {
  if (!in_pass_) return;
  rethrow_failure();
  lap_ms();  // work between steps belongs to no node shown
  step_nodes_ = 0;
  emit({{"phase", "step"}, {"event", "begin"}, {"step", step}});
}

void Trace::step_ended(const char* step) {
  if (!in_pass_ || step_nodes_ > 0) return;
  try {  // called from a destructor: an error (stdout full) waits for the next call that may throw
    const double ms = lap_ms();
    totals_.forward_ms += ms;
    emit({{"phase", "step"}, {"event", "no node"}, {"step", step}, {"ms", ms}});
  } catch (...) {
    if (!failure_) failure_ = std::current_exception();
  }
}

void Trace::recorded(const autograd::Node& node) {
  if (!in_pass_) return;
  rethrow_failure();
  const double ms = lap_ms();
  totals_.forward_ms += ms;
  FieldList fields(held_);
  node.fields(fields);
  for (const Tensor& out : node.outputs) fields.output(out);
  const Device device = node.outputs.empty() ? Device::cpu : node.outputs[0].device();
  index_[&node] = ++totals_.nodes;
  ++step_nodes_;
  totals_.saved_bytes += fields.new_bytes;
  totals_.saved_bytes_unmade += fields.new_unmade_bytes;
  json e = {{"phase", "forward"},
            {"index", totals_.nodes},
            {"op", node.name()},
            {"implementation", implementation(node, device)},
            {"fast_path", node.fast_path ? json(node.fast_path) : json()},
            {"device", device_name(device)},
            {"step", node.step ? json(node.step) : json()},
            {"inputs", fields.inputs},
            {"outputs", fields.outputs},
            {"saved", fields.saved_fields},
            {"new_bytes", fields.new_bytes},
            {"ms", ms}};
  emit(std::move(e));
}

void Trace::backward_began() {
  if (!in_pass_) return;
  rethrow_failure();
  backward_step_.clear();
  say(fmt::format("trace {}: backward, every node in reverse", label_));
}

void Trace::before_backward(const autograd::Node&) {
  if (in_pass_) lap_ms();
}

void Trace::after_backward(const autograd::Node& node, bool ran) {
  if (!in_pass_) return;
  const double ms = ran ? lap_ms() : 0.0;
  totals_.backward_ms += ms;
  const std::string step = node.step ? node.step : "";
  if (step != backward_step_ && !step.empty()) say(fmt::format("      ── {}", step));
  backward_step_ = step;
  auto it = index_.find(&node);
  const int64_t index = it == index_.end() ? 0 : it->second;
  if (it != index_.end()) index_.erase(it);  // the tape frees the node next
  const Device device = node.outputs.empty() ? Device::cpu : node.outputs[0].device();
  emit({{"phase", "backward"},
        {"index", index},
        {"op", node.name()},
        {"implementation", implementation(node, device)},
        {"step", node.step ? json(node.step) : json()},
        {"ran", ran},
        {"ms", ms}});
}

void Trace::backward_ended() {
  if (in_pass_) index_.clear();  // the nodes are gone
}

TraceTotals Trace::end_pass() {
  rethrow_failure();
  json by = where_the_time_went();
  emit({{"phase", "totals"},
        {"nodes", totals_.nodes},
        {"saved_bytes", totals_.saved_bytes},
        {"saved_bytes_unmade", totals_.saved_bytes_unmade},
        {"forward_ms", totals_.forward_ms},
        {"backward_ms", totals_.backward_ms},
        {"by", by}});
  say(fmt::format("trace {}: where the time went, by step of docs/attention.md (else by op), most first", label_));
  for (const json& row : by)
    say(fmt::format("  {:<31} {:>5} nodes  forward {:>9.3f} ms  backward {:>9.3f} ms  holds {}",
                    row["name"].get<std::string>(), row["nodes"].get<int64_t>(), row["forward_ms"].get<double>(),
                    row["backward_ms"].get<double>(), human_bytes(row["new_bytes"].get<size_t>())));
  in_pass_ = false;
  if (!json_path_.empty()) {  // a finished pass is kept as its lines: as much memory as the file takes
    for (json& e : events_) {
      if (file_text_.empty()) e["digest"] = files::kDigestSlot;  // that nobody changed the file since
      file_text_ += e.dump() + "\n";
    }
    events_.clear();
  } else if (print_) {
    events_.clear();  // printed: a long `cast train --trace` keeps nothing
  }
  return totals_;
}

void Trace::abort_pass() {
  if (!in_pass_) return;
  in_pass_ = false;
  events_.resize(pass_first_event_);
  index_.clear();
}

// The pass's events summed by step (a node outside every step: by its op), most time first.
json Trace::where_the_time_went() const {
  struct Row {
    int64_t nodes = 0;
    double forward_ms = 0, backward_ms = 0;
    size_t new_bytes = 0;
  };
  std::map<std::string, Row> rows;
  for (size_t i = pass_first_event_; i < events_.size(); ++i) {
    const json& e = events_[i];
    const std::string phase = e["phase"];
    if (phase == "totals" || (phase == "step" && e["event"] == "begin")) continue;
    Row& row = rows[e["step"].is_string() ? e["step"].get<std::string>() : e["op"].get<std::string>()];
    if (phase == "forward") {
      ++row.nodes;
      row.new_bytes += e["new_bytes"].get<size_t>();
    }
    (phase == "backward" ? row.backward_ms : row.forward_ms) += e["ms"].get<double>();
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.forward_ms + a.second.backward_ms > b.second.forward_ms + b.second.backward_ms;
  });
  json by = json::array();
  for (const auto& [name, r] : sorted)
    by.push_back({{"name", name},
                  {"nodes", r.nodes},
                  {"forward_ms", r.forward_ms},
                  {"backward_ms", r.backward_ms},
                  {"new_bytes", r.new_bytes}});
  return by;
}

void Trace::write_file() const {
  if (!json_path_.empty()) files::write_stamped(json_path_, file_text_, "--trace");
}

}  // namespace cast::train
