// `cast demo <walk>`: one attention layer walked step by step on an input small enough to read
// every number: N 8 tokens (the last one padding), D 8, 2 heads of width 4, batch 1, f64 on the
// CPU. A walk calls the reference step ops of ops/attention/steps.h and ops/attention/clustering.h in the order
// and with the arguments nn/attention.cpp uses, so what it prints is the layer: each step of
// docs/attention.md with its number, function and formula, then the backward in reverse step
// order, one step at a time. It checks itself: nn::Attention on the same input gives the same
// output and clusters, one backward of it the same gradients as the chain of steps, and finite
// differences of the whole layer agree with them.
//
// The printout is exact text (tests/golden/demo_<walk>.txt, and docs/attention.md shows it), so
// everything in it is deterministic: fixed seeds, one thread, the plain-loop matmul, numbers with
// four decimals, error bounds instead of measured errors.
// File order: printing, the tiny layer, the backward helper, the checks, then one section per walk.
#include "commands/commands.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/attention/steps.h"
#include "ops/attention/clustering.h"
#include "ops/ops.h"
#include "commands/cli.h"

namespace cast {

namespace {

// ================================================================ printing
constexpr size_t kColumns = 100;  // no line is wider, so the walks read in a terminal and a doc

// Display columns of UTF-8 text: one per character; none for a combining accent (the bar of Q̄,
// the hat of m̂, U+0300..U+036F), so tables holding these names still line up.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool continuation = (c & 0xC0) == 0x80;
    const bool combining = c == 0xCC || (c == 0xCD && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) < 0xB0);
    if (!continuation && !combining) ++n;
  }
  return n;
}

std::string pad_right(const std::string& s, size_t width) {
  return s + std::string(width > columns(s) ? width - columns(s) : 0, ' ');
}
std::string pad_left(const std::string& s, size_t width) {
  return std::string(width > columns(s) ? width - columns(s) : 0, ' ') + s;
}

// Every line goes through here: trailing blanks are dropped, so the golden files hold none.
void say(const std::string& line) {
  const size_t end = line.find_last_not_of(' ');
  fmt::print("{}\n", end == std::string::npos ? "" : line.substr(0, end + 1));
}

// Four decimals with a sign. A value that rounds to zero prints as +0.0000 whatever its sign, so a
// result that is 0 in exact arithmetic cannot flip between machines.
std::string num(double v) {
  std::string s = fmt::format("{:+.4f}", v);
  return s == "-0.0000" ? "+0.0000" : s;
}
std::string integer(double v) { return fmt::format("{}", static_cast<int64_t>(v)); }

// A step heading: its number (or a name for the parts around the numbered steps), the function,
// and the formula, on one line where it fits.
void heading(const std::string& number, const std::string& function, const std::string& formula) {
  const std::string line = fmt::format("{:<7} {}  {}", number, function, formula);
  say("");
  if (columns(line) <= kColumns) return say(line);
  say(fmt::format("{:<7} {}", number, function));
  say("        " + formula);
}
void note(const std::string& text) { say("  " + text); }

// One labelled group of columns in a table (one head of one tensor, say): cells[row][column].
struct Group {
  std::string label;
  std::vector<std::vector<std::string>> cells;
};

// The width of column c of a group: its widest cell.
size_t cell_width(const Group& g, size_t c) {
  size_t w = 0;
  for (const auto& row : g.cells) w = std::max(w, c < row.size() ? columns(row[c]) : 0);
  return w;
}

std::string group_row(const Group& g, size_t r) {
  std::string s;
  for (size_t c = 0; c < g.cells[r].size(); ++c) {
    if (c) s += ' ';
    s += pad_left(g.cells[r][c], cell_width(g, c));
  }
  return s;
}

size_t group_width(const Group& g) { return std::max(columns(g.label), columns(group_row(g, 0))); }

void print_groups(const std::vector<std::string>& rows, const std::vector<Group>& groups, size_t label_width) {
  std::string header = std::string(4 + label_width, ' ');
  for (size_t i = 0; i < groups.size(); ++i)
    header += std::string(i ? " | " : "") + pad_right(groups[i].label, group_width(groups[i]));
  say(header);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line = "  " + pad_right(rows[r], label_width) + "  ";
    for (size_t i = 0; i < groups.size(); ++i)
      line += std::string(i ? " | " : "") + pad_right(group_row(groups[i], r), group_width(groups[i]));
    say(line);
  }
}

// A table with labelled rows (tokens t0…, clusters c0…): the groups side by side where they fit
// in the line, else one under another.
void table(const std::vector<std::string>& rows, const std::vector<Group>& groups) {
  size_t label_width = 0, width = 0;
  for (const auto& r : rows) label_width = std::max(label_width, columns(r));
  for (const auto& g : groups) width += group_width(g) + 3;
  if (4 + label_width + width - 3 <= kColumns) return print_groups(rows, groups, label_width);
  for (const auto& g : groups) print_groups(rows, {g}, label_width);
}

std::vector<std::string> labels(const std::string& prefix, int64_t n) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

using CellFormat = std::string (*)(double);

// The heads of a (1, H, R, W) tensor as groups "name head h"; a (R, W) or (1, R, W) tensor as one
// group "name".
std::vector<Group> heads(const std::string& name, const Tensor& t, CellFormat format = num) {
  const std::vector<double> v = t.to_double_vector();
  const bool per_head = t.ndim() == 4;
  const int64_t H = per_head ? t.dim(1) : 1, R = t.dim(-2), W = t.dim(-1);
  std::vector<Group> out;
  for (int64_t h = 0; h < H; ++h) {
    Group g{per_head ? fmt::format("{} head {}", name, h) : name, {}};
    for (int64_t r = 0; r < R; ++r) {
      g.cells.emplace_back();
      for (int64_t c = 0; c < W; ++c) g.cells.back().push_back(format(v[(h * R + r) * W + c]));
    }
    out.push_back(g);
  }
  return out;
}

std::vector<Group> operator+(std::vector<Group> a, const std::vector<Group>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ================================================================ the tiny layer
constexpr int64_t kTokens = 8, kDim = 8, kHeads = 2, kWidth = kDim / kHeads;
constexpr int64_t kClusters = 2, kClusterSize = 4;  // CAST: C·κ = N
constexpr int64_t kPadded = kTokens - 1;            // the last token is padding
constexpr int64_t kOriginal = 2, kTwin = 5;         // token 5 repeats token 2: equal affinities, a tie
constexpr uint64_t kWeightSeed = 1, kInputSeed = 3, kGradSeed = 7;

nn::AttentionConfig demo_config(nn::Mechanism mechanism) {
  nn::AttentionConfig c;
  c.mechanism = mechanism;
  c.dim = kDim;
  c.heads = kHeads;
  c.clusters = kClusters;
  c.cluster_size = kClusterSize;
  c.bits = 8;  // 8-bit hashes print as short bit strings
  c.topk = 3;  // improved clustered: 3 of the 7 real keys, so both terms of its output count
  c.seed = kWeightSeed;
  c.fused = false;  // the reference step ops (`--reference`)
  return c;
}

// X: a fixed normal draw in which token 5 is a copy of token 2, so both get the same projections
// and affinities and the clustering has a tie to break. Token 7 is padding (its row stays random:
// the layer must ignore whatever is there).
Tensor demo_input() {
  Tensor x = Tensor::normal({1, kTokens, kDim}, kInputSeed, 0, 1.0, DType::f64);
  double* p = x.data<double>();
  std::copy(p + kOriginal * kDim, p + (kOriginal + 1) * kDim, p + kTwin * kDim);
  return x;
}

Tensor demo_mask() {
  std::vector<double> m(kTokens, 1.0);
  m[kPadded] = 0.0;
  return Tensor::from_vector<double>(m, {1, kTokens});
}

// The gradient that arrives at the layer's output: another fixed normal draw.
Tensor demo_dout() { return Tensor::normal({1, kTokens, kDim}, kGradSeed, 0, 1.0, DType::f64); }

struct Weights {
  Tensor wq, wk, wv, wo, s, gate_w, gate_b;  // s, gate_w, gate_b: CAST only
};

// The weights exactly as nn::Attention draws them for this config (plain copies, no gradient).
Weights layer_weights(const nn::AttentionConfig& config) {
  nn::Attention layer(config, DType::f64);
  auto copy = [&](const char* name) {
    auto it = layer.parameters().find(name);
    return it == layer.parameters().end() ? Tensor() : it->second.clone();
  };
  return {copy("wq"), copy("wk"), copy("wv"), copy("wo"), copy("surrogates"), copy("gate_w"), copy("gate_b")};
}

// The finite-difference check varies these, in this order: X, then the weights.
std::vector<Tensor> as_inputs(const Tensor& x, const Weights& w) {
  std::vector<Tensor> v = {x, w.wq, w.wk, w.wv, w.wo};
  if (w.s.defined()) v.insert(v.end(), {w.s, w.gate_w, w.gate_b});
  return v;
}
Weights from_inputs(const std::vector<Tensor>& v) {
  Weights w{v[1], v[2], v[3], v[4], {}, {}, {}};
  if (v.size() > 5) w.s = v[5], w.gate_w = v[6], w.gate_b = v[7];
  return w;
}

// (1, N, D) -> (1, H, N, d) and back, as nn/attention.cpp splits and merges heads.
Tensor split_heads(const Tensor& t) {
  return ops::permute(ops::reshape(t, {1, kTokens, kHeads, kWidth}), {0, 2, 1, 3});
}
Tensor merge_heads(const Tensor& t) { return ops::reshape(ops::permute(t, {0, 2, 1, 3}), {1, kTokens, kDim}); }

struct Projections {
  Tensor q, k, v;  // (1, H, N, d)
};
Projections project(const Tensor& x, const Weights& w) {
  return {split_heads(ops::matmul(x, w.wq)), split_heads(ops::matmul(x, w.wk)), split_heads(ops::matmul(x, w.wv))};
}

// The end of every layer: heads merged, projected by W_o, and a padded position set to 0.
Tensor output(const Tensor& heads_out, const Tensor& wo, const Tensor& mask) {
  return ops::mul(ops::matmul(merge_heads(heads_out), wo), ops::reshape(mask, {1, kTokens, 1}));
}

// ================================================================ the backward, one step at a time
using StepFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs one step again on fresh leaf copies of its inputs, sends `d_output` back through that step
// alone and returns each input's gradient (zeros where none arrives): the step's own backward,
// seen from outside. A walk chains these in reverse step order, adding up the shares of a tensor
// that several steps read (Q feeds steps 1 and 5 of CAST, for one).
std::vector<Tensor> step_grads(const Tensor& d_output, const std::vector<Tensor>& inputs, const StepFn& step) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    leaves.push_back(t.clone());
    leaves.back().set_requires_grad();
  }
  autograd::backward(step(leaves), d_output);
  std::vector<Tensor> grads;
  for (const Tensor& leaf : leaves)
    grads.push_back(leaf.grad().defined() ? leaf.grad() : Tensor::zeros(leaf.shape(), leaf.dtype()));
  return grads;
}

// Gradients by name: "x" and the layer's parameter names, as nn::Attention calls them.
using Grads = std::map<std::string, Tensor>;

// Back through the projections Q = X W_q, K = X W_k, V = X W_v (each split into heads): prints dX,
// the sum of what X gets through each projection and `dx_more` (CAST's gate), and the weight
// gradients.
void back_projections(const Tensor& x, const Weights& w, const Projections& d, const Tensor& dx_more, Grads& grads) {
  const StepFn project_with = [](const std::vector<Tensor>& in) { return split_heads(ops::matmul(in[0], in[1])); };
  const auto q = step_grads(d.q, {x, w.wq}, project_with);
  const auto k = step_grads(d.k, {x, w.wk}, project_with);
  const auto v = step_grads(d.v, {x, w.wv}, project_with);
  Tensor dx = ops::add(ops::add(q[0], k[0]), v[0]);
  if (dx_more.defined()) dx = ops::add(dx, dx_more);
  const bool gate = dx_more.defined();
  heading("back", "matmul (projections)",
          gate ? "dX = dQ W_qᵀ + dK W_kᵀ + dV W_vᵀ + step 3's share;  dW_q = Xᵀ dQ, …"
               : "dX = dQ W_qᵀ + dK W_kᵀ + dV W_vᵀ;  dW_q = Xᵀ dQ, dW_k = Xᵀ dK, dW_v = Xᵀ dV");
  table(labels("t", kTokens), heads("dX", dx.view({kTokens, kDim})));
  table(labels("x", kDim), heads("dW_q", q[1]));
  table(labels("x", kDim), heads("dW_k", k[1]));
  table(labels("x", kDim), heads("dW_v", v[1]));
  grads["x"] = dx, grads["wq"] = q[1], grads["wk"] = k[1], grads["wv"] = v[1];
}

// Back through the end of the layer: out = (merged heads · W_o) ⊙ m. Prints and returns dO (the
// heads' gradient) and dW_o.
Tensor back_output(const Tensor& heads_out, const Weights& w, const Tensor& mask, const Tensor& d_out, Grads& grads) {
  heading("back", "mul, matmul, merge heads", "dO = split((d out ⊙ m) W_oᵀ);  dW_o = merge(O)ᵀ (d out ⊙ m)");
  const auto d =
      step_grads(d_out, {heads_out, w.wo}, [&](const std::vector<Tensor>& in) { return output(in[0], in[1], mask); });
  table(labels("t", kTokens), heads("dO", d[0]));
  table(labels("x", kDim), heads("dW_o", d[1]));
  grads["wo"] = d[1];
  return d[0];
}

// ================================================================ the checks
// max |a − b|, relative to the larger of 1 and max |b|
double difference(const Tensor& a, const Tensor& b) {
  const auto va = a.to_double_vector(), vb = b.to_double_vector();
  if (va.size() != vb.size()) return INFINITY;
  double diff = 0, scale = 1;
  for (size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return std::isnan(diff) ? INFINITY : diff / scale;
}

// One line, "check  <what>: ok" with the bound the difference stays under, or FAIL with the
// difference (which then varies by machine, but the walk has failed anyway).
bool check(const std::string& what, double diff) {
  constexpr double kBound = 1e-12;  // f64 rounding of sums taken in another order
  say(diff <= kBound ? fmt::format("check  {}: ok (difference < 1e-12)", what)
                     : fmt::format("check  {}: FAIL (difference {:.1e})", what, diff));
  return diff <= kBound;
}

// The layer as nn::Attention runs it (reference steps): one forward and one backward of the whole
// composition, for the walk to compare with.
struct LayerRun {
  nn::AttentionOutput result;
  Grads grads;
};
LayerRun run_layer(const nn::AttentionConfig& config, const Tensor& x, const Tensor& mask, const Tensor& d_out) {
  nn::Attention layer(config, DType::f64);
  Tensor leaf = x.clone();
  leaf.set_requires_grad();
  LayerRun run{layer.forward(leaf, mask), {}};
  autograd::backward(run.result.out, d_out);
  run.grads["x"] = leaf.grad();
  for (auto& [name, t] : layer.parameters()) run.grads[name] = t.grad();
  return run;
}

// The chain of steps against one backward of nn::Attention: every gradient the layer has.
bool check_chain(const Grads& chain, const LayerRun& layer) {
  static const std::vector<std::pair<std::string, std::string>> order = {
      {"x", "dX"},    {"wq", "dW_q"},       {"wk", "dW_k"},     {"wv", "dW_v"},
      {"wo", "dW_o"}, {"surrogates", "dS"}, {"gate_w", "dW_φ"}, {"gate_b", "db_φ"}};
  double diff = 0;
  size_t compared = 0;
  std::string listed;
  for (const auto& [name, shown] : order) {
    if (!layer.grads.count(name)) continue;
    ++compared;
    diff = std::max(diff, chain.count(name) ? difference(chain.at(name), layer.grads.at(name)) : INFINITY);
    listed += std::string(listed.empty() ? "" : ", ") + shown;
  }
  if (compared != layer.grads.size()) diff = INFINITY;  // a gradient of the layer the walk does not know
  const bool ok = check("the chain of steps = one backward of nn::Attention", diff);
  note("compared: " + listed);
  return ok;
}

// Finite differences of the whole layer in f64 over X and every weight: autograd::gradcheck.
bool check_finite_differences(const std::vector<Tensor>& values, const std::string& names,
                              const autograd::TensorFn& layer) {
  say(fmt::format("finite differences of the whole layer (f64, central, ε 1e-6) over {}", names));
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < values.size(); ++i) {
    inputs.push_back(values[i].clone());
    inputs.back().set_requires_grad();
  }
  const auto r = autograd::gradcheck(layer, inputs);
  if (r.ok) {
    say("gradient check: ok, max relative error < 1e-6");
  } else {
    say(fmt::format("gradient check: FAIL, max relative error {:.1e}", r.max_error));
    fmt::print("{}", r.report);
  }
  return r.ok;
}

// ================================================================ what every walk shows first
void intro(const std::string& walk, const std::string& what, const std::vector<std::string>& settings) {
  say(fmt::format("cast demo {}: {}", walk, what));
  note("N 8 tokens (t7 is padding), D 8, 2 heads of width d 4, batch 1, f64 on the CPU");
  for (const auto& s : settings) note(s);
  note("weights as nn::Attention draws them (seed 1); reference step ops, plain-loop matmul");
}

void show_input(const Tensor& x, const Tensor& mask) {
  heading("input", "X, m", "X: normal draw (seed 3), token 5 a copy of token 2; m: 1 real, 0 padding");
  table(labels("t", kTokens), heads("X", x.view({kTokens, kDim})) + heads("m", mask.view({kTokens, 1}), integer));
}

void show_projections(const Projections& p) {
  heading("proj", "matmul", "Q = X W_q, K = X W_k, V = X W_v, each split into 2 heads of width d");
  table(labels("t", kTokens), heads("Q", p.q));
  table(labels("t", kTokens), heads("K", p.k));
  table(labels("t", kTokens), heads("V", p.v));
}

void show_output(const Tensor& out) {
  heading("out", "merge heads, matmul, mul", "out = (O's heads side by side) W_o ⊙ m: padding outputs 0");
  table(labels("t", kTokens), heads("out", out.view({kTokens, kDim})));
}

void show_dout(const Tensor& d_out) {
  say("");
  say("backward: the gradient d out arriving at the output is a fixed normal draw (seed 7)");
  table(labels("t", kTokens), heads("d out", d_out.view({kTokens, kDim})));
}

// ================================================================ ties
std::string token_list(const std::vector<int64_t>& ids, const char* separator) {
  std::string s;
  for (int64_t i : ids) s += fmt::format("{}t{}", s.empty() ? "" : separator, i);
  return s;
}

// Where the last place of a selection went to one of several candidates of equal value. `values`:
// one row's candidates, `eligible`: which may be chosen, `chosen`: the k picks. Returns two lines,
// which candidates tied and which got the place, or "" when the last place had no tie;
// `lower_wins` is false when the place did not go to the lower index, the rule of docs/attention.md.
std::string boundary_tie(const std::vector<double>& values, const std::vector<bool>& eligible,
                         const std::vector<int64_t>& chosen, size_t k, bool& lower_wins) {
  std::vector<int64_t> order;
  for (size_t i = 0; i < values.size(); ++i)
    if (eligible[i]) order.push_back(static_cast<int64_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  if (order.size() <= k || values[order[k - 1]] != values[order[k]]) return "";
  const double tied = values[order[k - 1]];
  std::vector<int64_t> all, in, out;
  for (int64_t i : order) {
    if (values[i] != tied) continue;
    all.push_back(i);
    (std::find(chosen.begin(), chosen.end(), i) != chosen.end() ? in : out).push_back(i);
  }
  std::sort(all.begin(), all.end());
  std::sort(in.begin(), in.end());
  std::sort(out.begin(), out.end());
  lower_wins = in.empty() || out.empty() || in.back() < out.front();
  return fmt::format("{} tie at {} for the last place\n       {}: {} in, {} out", token_list(all, " and "), num(tied),
                     lower_wins ? "resolved toward the lower index" : "NOT toward the lower index, WRONG",
                     token_list(in, ", "), token_list(out, ", "));
}

// The ties of a selection per head and cluster: `values` (1, H, C, N), `picks` (1, H, C, k), only
// real tokens eligible. Prints them; false when one broke the rule.
bool show_cluster_ties(const Tensor& values, const Tensor& picks, const Tensor& mask, const std::string& none) {
  const auto v = values.to_double_vector(), p = picks.to_double_vector(), m = mask.to_double_vector();
  const int64_t H = values.dim(1), C = values.dim(2), N = values.dim(3), k = picks.dim(3);
  std::vector<bool> real;
  for (double x : m) real.push_back(x != 0);
  bool any = false, ok = true;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < C; ++c) {
      const std::vector<double> row(v.begin() + (h * C + c) * N, v.begin() + (h * C + c + 1) * N);
      std::vector<int64_t> chosen;
      for (int64_t i = 0; i < k; ++i) chosen.push_back(static_cast<int64_t>(p[(h * C + c) * k + i]));
      bool lower_wins = true;
      const std::string tie = boundary_tie(row, real, chosen, static_cast<size_t>(k), lower_wins);
      if (!tie.empty()) note(fmt::format("tie: head {}, cluster {}, {}", h, c, tie));
      any = any || !tie.empty();
      ok = ok && lower_wins;
    }
  if (!any) note(none);
  return ok;
}

// ================================================================ walk: full attention
int walk_full() {
  const auto config = demo_config(nn::Mechanism::full);
  const Weights w = layer_weights(config);
  const Tensor x = demo_input(), mask = demo_mask(), d_out = demo_dout();
  intro("full", "one full softmax attention layer, step by step (docs/attention.md §1)", {});
  show_input(x, mask);
  Projections p;
  Tensor probs, o, out, scores;
  {
    autograd::NoGradGuard forward_only;  // the backward below runs each step again
    p = project(x, w);
    // The layer's step full_attention(Q, K, V, m) is these two ops.
    probs = ops::attention_probabilities(p.q, p.k, mask);
    o = ops::matmul(probs, p.v);
    out = output(o, w.wo, mask);
    // The scores live inside attention_probabilities: formed here only to print them.
    scores = ops::affine(ops::matmul(p.q, p.k, false, true), 1.0 / std::sqrt(static_cast<double>(kWidth)));
  }
  show_projections(p);
  heading("step 1", "full_attention", "O = softmax(Q Kᵀ/√d + mask) V: P = attention_probabilities(Q, K, m), O = P V");
  std::vector<double> s = scores.to_double_vector();
  for (size_t i = kPadded; i < s.size(); i += kTokens) s[i] = -INFINITY;  // the padded key's column
  const CellFormat with_inf = [](double v) { return std::isinf(v) ? std::string("-inf") : num(v); };
  table(labels("t", kTokens), heads("Q Kᵀ/√d + mask", Tensor::from_vector<double>(s, scores.shape()), with_inf));
  table(labels("t", kTokens), heads("P", probs));
  table(labels("t", kTokens), heads("O = P V", o));
  show_output(out);

  show_dout(d_out);
  Grads grads;
  const Tensor d_o = back_output(o, w, mask, d_out, grads);
  heading("back 1", "full_attention: the product P V", "dP = dO Vᵀ;  dV = Pᵀ dO");
  const auto d_pv =
      step_grads(d_o, {probs, p.v}, [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); });
  table(labels("t", kTokens), heads("dP", d_pv[0]));
  table(labels("t", kTokens), heads("dV", d_pv[1]));
  heading("back 1", "full_attention: attention_probabilities",
          "dS = P ⊙ (dP − Σ_keys P·dP);  dQ = dS K/√d;  dK = dSᵀ Q/√d");
  const auto d_qk = step_grads(d_pv[0], {p.q, p.k}, [&](const std::vector<Tensor>& in) {
    return ops::attention_probabilities(in[0], in[1], mask);
  });
  table(labels("t", kTokens), heads("dQ", d_qk[0]));
  table(labels("t", kTokens), heads("dK", d_qk[1]));
  back_projections(x, w, {d_qk[0], d_qk[1], d_pv[1]}, Tensor(), grads);

  say("");
  const LayerRun layer = run_layer(config, x, mask, d_out);
  bool ok = check("nn::Attention's forward gives the same out", difference(out, layer.result.out));
  ok = check_chain(grads, layer) && ok;
  const auto whole = [&](const std::vector<Tensor>& in) {
    const Weights v = from_inputs(in);
    const Projections pv = project(in[0], v);
    return output(ops::full_attention(pv.q, pv.k, pv.v, mask), v.wo, mask);
  };
  return check_finite_differences(as_inputs(x, w), "X, W_q, W_k, W_v, W_o", whole) && ok ? 0 : 1;
}

// ================================================================ walk: CAST
struct CastForward {
  Projections p;
  Tensor s_q, s_k, a_q, a_k, a_g, members, r_intra, r_inter, o, out;
};

// nn::Attention::forward and forward_cast for per-head CAST with Top-K, f softmax, summaries on and
// W = A_g: the same ops in the same order with the same arguments. Given `members`, the clustering
// is held at them (the finite-difference check).
CastForward cast_forward(const Tensor& x, const Tensor& mask, const Weights& w, const Tensor& members = Tensor()) {
  CastForward f;
  f.p = project(x, w);
  const double factor = 1.0 / std::sqrt(static_cast<double>(kWidth));
  f.s_q = ops::surrogate_scores(f.p.q, w.s, factor);
  f.a_q = ops::cluster_probabilities(f.s_q, ops::AttentionFn::softmax);
  f.s_k = ops::surrogate_scores(f.p.k, w.s, factor);
  f.a_k = ops::cluster_probabilities(f.s_k, ops::AttentionFn::softmax);
  f.a_g = ops::gated_affinity(x, w.gate_w, w.gate_b, f.a_q, f.a_k);
  const Tensor flat = f.a_g.view({kHeads, kTokens, kClusters});
  f.members = members.defined()
                  ? members
                  : ops::cluster_topk(flat, mask, kClusterSize).view({1, kHeads, kClusters, kClusterSize});
  f.r_intra = ops::intra_cluster_attention(f.p.q, f.p.k, f.p.v, f.members);
  f.r_inter = ops::cluster_summaries(f.a_k, f.p.v, mask);
  f.o = ops::combine_clusters(f.a_g, f.r_intra, f.r_inter, f.members);
  f.out = output(f.o, w.wo, mask);
  return f;
}

// A per-slot tensor (1, H, C, κ, w) as groups per head whose rows are the slots "c0 p0", …: each
// row starts with the slot's token (− for an empty slot).
std::vector<Group> slot_groups(const std::string& name, const Tensor& per_slot, const Tensor& members) {
  const int64_t slots = kClusters * kClusterSize, w = per_slot.dim(-1);
  std::vector<Group> out = heads(name, per_slot.view({1, kHeads, slots, w}));
  const auto ids = members.to_double_vector();
  for (int64_t h = 0; h < kHeads; ++h) {
    out[h].label = fmt::format("{} head {} (token)", name, h);
    for (int64_t r = 0; r < slots; ++r) {
      const auto id = static_cast<int64_t>(ids[h * slots + r]);
      out[h].cells[r].insert(out[h].cells[r].begin(), id < 0 ? "−" : fmt::format("t{}", id));
    }
  }
  return out;
}

std::vector<std::string> slot_labels() {
  std::vector<std::string> out;
  for (int64_t c = 0; c < kClusters; ++c)
    for (int64_t p = 0; p < kClusterSize; ++p) out.push_back(fmt::format("c{} p{}", c, p));
  return out;
}

// A (1, N, H) tensor as one group whose columns are the heads.
Group token_by_head(const std::string& name, const Tensor& n_by_h) {
  return heads(name, n_by_h.view({kTokens, kHeads}))[0];
}

// Step 4 in words: the ties the rule broke, where the padding went, the empty slots. False when
// the clustering broke a rule of docs/attention.md.
bool explain_clusters(const CastForward& f, const Tensor& mask) {
  Tensor by_cluster;
  {
    autograd::NoGradGuard display_only;
    by_cluster = ops::permute(f.a_g, {0, 1, 3, 2});  // (1, H, C, N): each cluster's affinities
  }
  const bool ties_ok = show_cluster_ties(by_cluster, f.members, mask, "no tie for a cluster's last place");
  const auto ids = f.members.to_double_vector();
  const bool padding_in = std::find(ids.begin(), ids.end(), static_cast<double>(kPadded)) != ids.end();
  note(padding_in ? "t7 (padding) is in a cluster: WRONG" : "t7 (padding) is in no cluster of either head");
  const auto empty = std::count(ids.begin(), ids.end(), -1.0);
  note(empty ? fmt::format("{} empty slots hold −1", empty)
             : "no slot is empty (−1): every cluster finds κ = 4 real tokens");
  Tensor single;
  {
    autograd::NoGradGuard constant;
    single = ops::cluster_satopk(f.a_g.view({kHeads, kTokens, kClusters}), mask, kClusterSize);
  }
  const auto single_ids = single.to_double_vector();
  note("aside, cluster_satopk (--clustering satopk) on the same A_g: each real token placed once,");
  note(fmt::format("so C·κ = 8 places for 7 real tokens leave {} of the 16 slots empty, −1:",
                   std::count(single_ids.begin(), single_ids.end(), -1.0)));
  table(labels("c", kClusters), heads("I", single.view({1, kHeads, kClusters, kClusterSize}), integer));
  return ties_ok && !padding_in;
}

// Steps 1–7 and the output; false when the clustering broke a rule.
bool show_cast_forward(const CastForward& f, const Weights& w, const Tensor& x, const Tensor& mask) {
  const auto tokens = labels("t", kTokens), clusters = labels("c", kClusters);
  heading("step 1", "surrogate_scores", "Ŝ_q = Q Sᵀ/√d,  Ŝ_k = K Sᵀ/√d  (S: the C surrogate tokens of each head)");
  table(clusters, heads("S", w.s.view({1, kHeads, kClusters, kWidth})));
  table(tokens, heads("Ŝ_q", f.s_q) + heads("Ŝ_k", f.s_k));
  heading("step 2", "cluster_probabilities", "A_q = softmax over the clusters of Ŝ_q,  A_k likewise (f softmax)");
  table(tokens, heads("A_q", f.a_q) + heads("A_k", f.a_k));
  heading("step 3", "gated_affinity", "g = sigmoid(X W_φ + b_φ);  A_g = A_k + g ⊙ (A_q − A_k)");
  Tensor g;
  {
    autograd::NoGradGuard display_only;  // g lives inside the step: formed here only to print it
    g = ops::sigmoid(ops::add(ops::matmul(x, w.gate_w), w.gate_b));
  }
  table(tokens, std::vector<Group>{token_by_head("g (head 0, 1)", g)} + heads("A_g", f.a_g));
  heading("step 4", "cluster_topk", "I_c = the κ real tokens of largest A_g[:, c], kept in ascending order");
  table(clusters, heads("I", f.members, integer));
  const bool clusters_ok = explain_clusters(f, mask);
  heading("step 5", "intra_cluster_attention", "R_intra[c] = softmax(Q[I_c] K[I_c]ᵀ/√d + slot mask) V[I_c]");
  table(slot_labels(), slot_groups("R_intra", f.r_intra, f.members));
  heading("step 6", "cluster_summaries", "P = A_k ⊙ m normalised over the tokens;  R_inter = Pᵀ V");
  table(clusters, heads("R_inter", f.r_inter));
  heading("step 7", "combine_clusters",
          "O = W R_inter + Σ_{(c,p): I_c[p] = i} W[i,c] (R_intra[c][p] − R_inter[c]),  W = A_g");
  table(tokens, heads("O", f.o));
  show_output(f.out);
  return clusters_ok;
}

// The backward of the CAST layer, one step at a time in reverse order; prints each gradient once
// it is complete and returns the gradients of X and the weights.
Grads cast_backward(const CastForward& f, const Weights& w, const Tensor& x, const Tensor& mask, const Tensor& d_out) {
  const auto tokens = labels("t", kTokens), clusters = labels("c", kClusters);
  Grads grads;
  const Tensor d_o = back_output(f.o, w, mask, d_out, grads);
  heading("back 7", "combine_clusters",
          "dW = dO R_interᵀ + slot terms;  dR_intra = W[i,c] dO_i;  dR_inter = Wᵀ dO − Σ_p W[i,c] dO_i");
  const auto d7 = step_grads(d_o, {f.a_g, f.r_intra, f.r_inter}, [&](const std::vector<Tensor>& in) {
    return ops::combine_clusters(in[0], in[1], in[2], f.members);
  });
  table(tokens, heads("dW = dA_g", d7[0]));
  table(slot_labels(), slot_groups("dR_intra", d7[1], f.members));
  table(clusters, heads("dR_inter", d7[2]));
  heading("back 6", "cluster_summaries", "dV = P dR_inter;  dA_k through P (real tokens only)");
  const auto d6 = step_grads(d7[2], {f.a_k, f.p.v},
                             [&](const std::vector<Tensor>& in) { return ops::cluster_summaries(in[0], in[1], mask); });
  note("dV and dA_k: shares, added to those of steps 5 and 3 below");
  heading("back 5", "intra_cluster_attention", "dQc = dS Kc/√d, dKc = dSᵀ Qc/√d, dVc = Pᵀ dR_intra, to the tokens");
  const auto d5 = step_grads(d7[1], {f.p.q, f.p.k, f.p.v}, [&](const std::vector<Tensor>& in) {
    return ops::intra_cluster_attention(in[0], in[1], in[2], f.members);
  });
  const Tensor dv = ops::add(d5[2], d6[1]);
  table(tokens, heads("dV (steps 5 + 6)", dv));
  heading("back 4", "cluster_topk", "no gradient: the clusters I are a constant of the backward");
  heading("back 3", "gated_affinity", "dA_q = g ⊙ dA_g;  dA_k = (1 − g) ⊙ dA_g;  dg = Σ_c dA_g ⊙ (A_q − A_k)");
  const auto d3 = step_grads(d7[0], {x, w.gate_w, w.gate_b, f.a_q, f.a_k}, [](const std::vector<Tensor>& in) {
    return ops::gated_affinity(in[0], in[1], in[2], in[3], in[4]);
  });
  const Tensor da_k = ops::add(d3[4], d6[0]);
  const Tensor dg = ops::sum(ops::mul(d7[0], ops::sub(f.a_q, f.a_k)), 3);  // (1, H, N), printed only
  table(tokens, heads("dA_q", d3[3]) + heads("dA_k (steps 3 + 6)", da_k));
  table({"head 0", "head 1"}, heads("dg (tokens t0 … t7)", dg.view({kHeads, kTokens})));
  const Tensor dw_by_head = ops::permute(d3[1], {1, 0});  // (H, D): W_φ's column for each head as a row
  table({"head 0", "head 1"},
        heads("dW_φ (column of head h, rows x0 … x7)", dw_by_head) + heads("db_φ", d3[2].view({kHeads, 1})));
  heading("back 2", "cluster_probabilities", "dŜ = A ⊙ (dA − Σ_c A·dA), for the queries and the keys");
  const StepFn softmax = [](const std::vector<Tensor>& in) {
    return ops::cluster_probabilities(in[0], ops::AttentionFn::softmax);
  };
  const auto d2q = step_grads(d3[3], {f.s_q}, softmax), d2k = step_grads(da_k, {f.s_k}, softmax);
  table(tokens, heads("dŜ_q", d2q[0]) + heads("dŜ_k", d2k[0]));
  heading("back 1", "surrogate_scores", "dQ = dŜ_q S/√d,  dK = dŜ_k S/√d,  dS = (dŜ_qᵀ Q + dŜ_kᵀ K)/√d");
  const double factor = 1.0 / std::sqrt(static_cast<double>(kWidth));
  const StepFn scores = [&](const std::vector<Tensor>& in) { return ops::surrogate_scores(in[0], in[1], factor); };
  const auto d1q = step_grads(d2q[0], {f.p.q, w.s}, scores), d1k = step_grads(d2k[0], {f.p.k, w.s}, scores);
  const Tensor dq = ops::add(d1q[0], d5[0]), dk = ops::add(d1k[0], d5[1]), ds = ops::add(d1q[1], d1k[1]);
  table(tokens, heads("dQ (steps 1 + 5)", dq));
  table(tokens, heads("dK (steps 1 + 5)", dk));
  table(clusters, heads("dS", ds.view({1, kHeads, kClusters, kWidth})));
  grads["surrogates"] = ds, grads["gate_w"] = d3[1], grads["gate_b"] = d3[2];
  back_projections(x, w, {dq, dk, dv}, d3[0], grads);
  return grads;
}

int walk_cast() {
  const auto config = demo_config(nn::Mechanism::cast);
  const Weights w = layer_weights(config);
  const Tensor x = demo_input(), mask = demo_mask(), d_out = demo_dout();
  intro("cast", "one CAST attention layer, step by step (docs/attention.md §2)",
        {"C 2 clusters of κ 4, Top-K clustering, f softmax, summaries on, mixing weights W = A_g"});
  show_input(x, mask);
  CastForward f;
  {
    autograd::NoGradGuard forward_only;  // the backward below runs each step again
    f = cast_forward(x, mask, w);
  }
  show_projections(f.p);
  bool ok = show_cast_forward(f, w, x, mask);
  show_dout(d_out);
  const Grads grads = cast_backward(f, w, x, mask, d_out);

  say("");
  const LayerRun layer = run_layer(config, x, mask, d_out);
  const double forward_diff =
      std::max(difference(f.out, layer.result.out), difference(f.members, layer.result.clusters));
  ok = check("nn::Attention's forward gives the same out and clusters", forward_diff) && ok;
  ok = check_chain(grads, layer) && ok;
  note(fmt::format("the finite differences hold the clusters at I above, as the backward does (±ε on t{} or t{}",
                   kOriginal, kTwin));
  note("alone would break their tie)");
  const auto whole = [&](const std::vector<Tensor>& in) {
    return cast_forward(in[0], mask, from_inputs(in), f.members).out;
  };
  return check_finite_differences(as_inputs(x, w), "X, W_q, W_k, W_v, W_o, S, W_φ, b_φ", whole) && ok ? 0 : 1;
}

// ================================================================ walks: clustered, improved clustered
struct ClusteredForward {
  Projections p;
  Tensor planes, hashes, assignment, centroids, a_c, v_c, top_keys, o, out;
};

// nn::Attention::forward and forward_clustered: the same ops in the same order with the same
// arguments. Given `fixed`, its planes, hashes, assignment and top keys are used instead of being
// computed (the finite-difference check holds them, as the backward does).
ClusteredForward clustered_forward(const nn::AttentionConfig& c, const Tensor& x, const Tensor& mask, const Weights& w,
                                   const ClusteredForward* fixed = nullptr) {
  ClusteredForward f;
  f.p = project(x, w);
  if (fixed) {
    f.planes = fixed->planes, f.hashes = fixed->hashes, f.assignment = fixed->assignment;
  } else {
    autograd::NoGradGuard constant;
    // a layer's first forward draws its planes from (seed, forward count 0), as nn/attention.cpp does
    const uint64_t draw = c.seed * 0x9E3779B97F4A7C15ull + 0;
    f.planes = Tensor::normal({c.bits, kWidth + 1}, draw, 0, 1.0, DType::f64, Device::cpu);
    f.hashes = ops::lsh_hash(f.p.q.view({kHeads, kTokens, kWidth}), f.planes);
    f.assignment = ops::hamming_kmeans(f.hashes, mask, kClusters, c.iterations, draw).view({1, kHeads, kTokens});
  }
  f.centroids = ops::cluster_centroids(f.p.q, f.assignment, kClusters);
  if (c.mechanism == nn::Mechanism::clustered) {
    f.v_c = ops::full_attention(f.centroids, f.p.k, f.p.v, mask);  // A^c V in one step
    f.o = ops::broadcast_to_members(f.v_c, f.assignment);
  } else {
    f.a_c = ops::centroid_attention(f.centroids, f.p.k, mask);
    if (fixed) {
      f.top_keys = fixed->top_keys;
    } else {
      autograd::NoGradGuard constant;
      f.top_keys = ops::topk(f.a_c, std::min<int64_t>(c.topk, kTokens), mask);
    }
    f.o = ops::improved_clustered_output(f.p.q, f.p.k, f.p.v, f.a_c, f.top_keys, f.assignment);
  }
  f.out = output(f.o, w.wo, mask);
  return f;
}

// The hashes (H, N) as bit strings, bit 7 first, and their values.
std::vector<Group> hash_groups(const Tensor& hashes, int64_t bits) {
  const auto v = hashes.to_double_vector();
  std::vector<Group> out;
  for (int64_t h = 0; h < kHeads; ++h) {
    Group g{fmt::format("hash head {}", h), {}};
    for (int64_t i = 0; i < kTokens; ++i) {
      const auto value = static_cast<uint64_t>(v[h * kTokens + i]);
      std::string b;
      for (int64_t bit = bits - 1; bit >= 0; --bit) b += (value >> bit) & 1 ? '1' : '0';
      g.cells.push_back({b, fmt::format("= {:3}", value)});
    }
    out.push_back(g);
  }
  return out;
}

// Steps 1–3, shared by both clustered walks; false when the padded token is in a cluster.
bool show_clustering(const ClusteredForward& f, const nn::AttentionConfig& c) {
  heading("step 1", "lsh_hash", "bit b = [q·a_b + a_b0 > 0]: 8 random hyperplanes a_b with a bias a_b0");
  table(labels("a", c.bits), heads("a_b (4 weights, then the bias a_b0)", f.planes));
  table(labels("t", kTokens), hash_groups(f.hashes, c.bits));
  heading("step 2", "hamming_kmeans",
          "2 centroids from 2 random real queries' hashes, 10 Lloyd steps by Hamming distance");
  table({"head 0", "head 1"}, {Group{"cluster of t0 t1 t2 t3 t4 t5 t6 t7",
                                     heads("", f.assignment.view({kHeads, kTokens}), integer)[0].cells}});
  const auto a = f.assignment.to_double_vector();
  const bool padded_out = a[kPadded] == -1 && a[kTokens + kPadded] == -1;
  note(padded_out ? "t7 (padding) is in no cluster (−1) in either head" : "t7 (padding) is in a cluster: WRONG");
  heading("step 3", "cluster_centroids", "Q̄_j = the mean of the queries in cluster j");
  table(labels("c", kClusters), heads("Q̄", f.centroids));
  return padded_out;
}

// The two terms of the improved clustered output, in plain loops from A^c, T and the projections,
// only to print them (the op forms both inside): for a query i in cluster j,
// term 1 = m̂_j softmax(Q_i K_Tᵀ/√d) V_T and term 2 = Σ_{l ∉ T_j} A^c_jl V_l.
struct Terms {
  Tensor m_hat, first, second;  // (1, H, C, 1), (1, H, N, d), (1, H, C, d)
};
Terms improved_terms(const ClusteredForward& f) {
  const auto q = f.p.q.to_double_vector(), k = f.p.k.to_double_vector(), v = f.p.v.to_double_vector();
  const auto a_c = f.a_c.to_double_vector(), top = f.top_keys.to_double_vector(), a = f.assignment.to_double_vector();
  const int64_t T = f.top_keys.dim(3), N = kTokens, C = kClusters, d = kWidth;
  std::vector<double> m_hat(kHeads * C, 0.0), first(kHeads * N * d, 0.0), second(kHeads * C * d, 0.0);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t j = 0; j < C; ++j) {
      const double* row = &a_c[(h * C + j) * N];
      std::vector<bool> in_top(N, false);
      for (int64_t t = 0; t < T; ++t)
        if (top[(h * C + j) * T + t] >= 0) in_top[static_cast<int64_t>(top[(h * C + j) * T + t])] = true;
      for (int64_t l = 0; l < N; ++l) {
        if (in_top[l]) m_hat[h * C + j] += row[l];
        for (int64_t e = 0; e < d && !in_top[l]; ++e) second[(h * C + j) * d + e] += row[l] * v[(h * N + l) * d + e];
      }
    }
    for (int64_t i = 0; i < N; ++i) {
      const auto j = static_cast<int64_t>(a[h * N + i]);
      if (j < 0) continue;  // padding: no cluster, output 0
      std::vector<double> s(T, -INFINITY);
      double most = -INFINITY, total = 0;
      for (int64_t t = 0; t < T; ++t) {
        const auto l = static_cast<int64_t>(top[(h * C + j) * T + t]);
        if (l < 0) continue;
        s[t] = 0;
        for (int64_t e = 0; e < d; ++e) s[t] += q[(h * N + i) * d + e] * k[(h * N + l) * d + e] / std::sqrt(double(d));
        most = std::max(most, s[t]);
      }
      for (int64_t t = 0; t < T; ++t) total += std::exp(s[t] - most);
      for (int64_t t = 0; t < T; ++t) {
        const auto l = static_cast<int64_t>(top[(h * C + j) * T + t]);
        if (l < 0) continue;
        const double weight = m_hat[h * C + j] * std::exp(s[t] - most) / total;
        for (int64_t e = 0; e < d; ++e) first[(h * N + i) * d + e] += weight * v[(h * N + l) * d + e];
      }
    }
  }
  return {Tensor::from_vector<double>(m_hat, {1, kHeads, C, 1}), Tensor::from_vector<double>(first, {1, kHeads, N, d}),
          Tensor::from_vector<double>(second, {1, kHeads, C, d})};
}

// Steps 4–5 of clustered attention.
void show_clustered_output(const ClusteredForward& f, const Tensor& mask) {
  Tensor a_c;
  {
    autograd::NoGradGuard display_only;
    a_c = ops::centroid_attention(f.centroids, f.p.k, mask);  // the probabilities full_attention forms inside
  }
  heading("step 4", "centroid_attention", "A^c = softmax(Q̄ Kᵀ/√d + key mask);  V^c = A^c V");
  table(labels("c", kClusters), heads("A^c", a_c));
  table(labels("c", kClusters), heads("V^c", f.v_c));
  note("the layer forms V^c in one step, full_attention(Q̄, K, V, m), with the centroids as queries");
  heading("step 5", "broadcast_to_members", "O_i = V^c_j for the cluster j of query i; 0 for padding");
  table(labels("t", kTokens), heads("O", f.o));
}

// Step 4 and §4 of improved clustered attention; false when the printed terms miss the op's O.
bool show_improved_output(const ClusteredForward& f, const Tensor& mask) {
  const auto clusters = labels("c", kClusters), tokens = labels("t", kTokens);
  heading("step 4", "centroid_attention", "A^c = softmax(Q̄ Kᵀ/√d + key mask)");
  table(clusters, heads("A^c", f.a_c));
  heading("step §4", "topk", "T_j = the 3 keys of largest A^c_j, never a masked one, ties toward the lower index");
  table(clusters, heads("T", f.top_keys, integer));
  bool ok = show_cluster_ties(f.a_c, f.top_keys, mask, "no tie for a cluster's last top key");
  const Terms terms = improved_terms(f);
  heading("step §4", "improved_clustered_output",
          "O_i = m̂_j softmax(Q_i K_Tᵀ/√d) V_T + Σ_{l ∉ T_j} A^c_jl V_l,  m̂_j = Σ_{l ∈ T_j} A^c_jl");
  table(clusters, heads("m̂", terms.m_hat));
  table(tokens, heads("term 1", terms.first));
  table(clusters, heads("term 2 (per cluster)", terms.second));
  table(tokens, heads("O", f.o));
  Tensor sum;
  {
    autograd::NoGradGuard display_only;
    sum = ops::add(terms.first, ops::broadcast_to_members(terms.second, f.assignment));
  }
  return check("O = term 1 + its cluster's term 2", difference(sum, f.o)) && ok;
}

// The backward of both clustered layers, one step at a time in reverse order.
Grads clustered_backward(const ClusteredForward& f, bool improved, const Weights& w, const Tensor& x,
                         const Tensor& mask, const Tensor& d_out) {
  const auto tokens = labels("t", kTokens), clusters = labels("c", kClusters);
  Grads grads;
  const Tensor d_o = back_output(f.o, w, mask, d_out, grads);
  Tensor d_centroids, dq, dk, dv;
  if (!improved) {
    heading("back 5", "broadcast_to_members", "dV^c_j = Σ_{i in cluster j} dO_i");
    const auto d5 = step_grads(
        d_o, {f.v_c}, [&](const std::vector<Tensor>& in) { return ops::broadcast_to_members(in[0], f.assignment); });
    table(clusters, heads("dV^c", d5[0]));
    heading("back 4", "full_attention (Q̄ as queries)", "dA^c = dV^c Vᵀ, dV = A^cᵀ dV^c;  dQ̄ = dS K/√d, dK = dSᵀ Q̄/√d");
    const auto d4 = step_grads(d5[0], {f.centroids, f.p.k, f.p.v}, [&](const std::vector<Tensor>& in) {
      return ops::full_attention(in[0], in[1], in[2], mask);
    });
    d_centroids = d4[0], dk = d4[1], dv = d4[2];
    table(tokens, heads("dV", dv));
  } else {
    heading("back §4", "improved_clustered_output",
            "both terms: to Q, K_T, V_T and V, and to A^c through m̂ and term 2");
    const auto d = step_grads(d_o, {f.p.q, f.p.k, f.p.v, f.a_c}, [&](const std::vector<Tensor>& in) {
      return ops::improved_clustered_output(in[0], in[1], in[2], in[3], f.top_keys, f.assignment);
    });
    table(clusters, heads("dA^c", d[3]));
    table(tokens, heads("dV", d[2]));
    heading("back §4", "topk", "no gradient: the top keys T are a constant of the backward");
    heading("back 4", "centroid_attention", "dS = A^c ⊙ (dA^c − Σ A^c·dA^c);  dQ̄ = dS K/√d,  dK = dSᵀ Q̄/√d");
    const auto d4 = step_grads(d[3], {f.centroids, f.p.k}, [&](const std::vector<Tensor>& in) {
      return ops::centroid_attention(in[0], in[1], mask);
    });
    d_centroids = d4[0], dk = ops::add(d[1], d4[1]), dq = d[0], dv = d[2];
  }
  table(clusters, heads("dQ̄", d_centroids));
  table(tokens, heads(improved ? "dK (§4 + step 4)" : "dK", dk));
  heading("back 3", "cluster_centroids", "dQ_i = dQ̄_j / |j| for each query i of cluster j");
  const auto d3 = step_grads(d_centroids, {f.p.q}, [&](const std::vector<Tensor>& in) {
    return ops::cluster_centroids(in[0], f.assignment, kClusters);
  });
  dq = improved ? ops::add(dq, d3[0]) : d3[0];
  table(tokens, heads(improved ? "dQ (§4 + step 3)" : "dQ", dq));
  heading("back 1–2", "lsh_hash, hamming_kmeans", "no gradient: the hashes and the assignment are constants");
  back_projections(x, w, {dq, dk, dv}, Tensor(), grads);
  return grads;
}

int walk_clustered_kind(nn::Mechanism mechanism) {
  const bool improved = mechanism == nn::Mechanism::iclustered;
  const auto config = demo_config(mechanism);
  const Weights w = layer_weights(config);
  const Tensor x = demo_input(), mask = demo_mask(), d_out = demo_dout();
  if (improved)
    intro("iclustered", "one improved clustered attention layer, step by step (docs/attention.md §4)",
          {"C 2 clusters, 8 hash bits, 10 Lloyd steps, the top 3 keys of each cluster"});
  else
    intro("clustered", "one clustered attention layer, step by step (docs/attention.md §3)",
          {"C 2 clusters, 8 hash bits, 10 Lloyd steps"});
  show_input(x, mask);
  ClusteredForward f;
  {
    autograd::NoGradGuard forward_only;  // the backward below runs each step again
    f = clustered_forward(config, x, mask, w);
  }
  show_projections(f.p);
  bool ok = show_clustering(f, config);
  if (improved) ok = show_improved_output(f, mask) && ok;
  else show_clustered_output(f, mask);
  show_output(f.out);
  show_dout(d_out);
  const Grads grads = clustered_backward(f, improved, w, x, mask, d_out);

  say("");
  const LayerRun layer = run_layer(config, x, mask, d_out);
  double forward_diff =
      std::max(difference(f.out, layer.result.out), difference(f.assignment, layer.result.assignment));
  if (improved) forward_diff = std::max(forward_diff, difference(f.top_keys, layer.result.top_keys));
  ok = check(improved ? "nn::Attention's forward gives the same out, assignment and top keys"
                      : "nn::Attention's forward gives the same out and assignment",
             forward_diff) &&
       ok;
  ok = check_chain(grads, layer) && ok;
  note(improved ? "the finite differences hold the assignment and the top keys as above, as the backward does"
                : "the finite differences hold the assignment as above, as the backward does");
  const auto whole = [&](const std::vector<Tensor>& in) {
    return clustered_forward(config, in[0], mask, from_inputs(in), &f).out;
  };
  return check_finite_differences(as_inputs(x, w), "X, W_q, W_k, W_v, W_o", whole) && ok ? 0 : 1;
}

int walk_clustered() { return walk_clustered_kind(nn::Mechanism::clustered); }
int walk_iclustered() { return walk_clustered_kind(nn::Mechanism::iclustered); }

// ================================================================ walk: one op (softmax, layernorm)
void print_tensor(const char* name, const Tensor& t) {
  auto v = t.to_double_vector();
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:+.5f}", i ? " " : "", v[i]);
  fmt::print("  {:<10} {:<16} {}\n", name, shape_str(t.shape()), s);
}

int walk_softmax() {
  fmt::print("forward: y = softmax(x) over the last axis, the third key masked out\n");
  Tensor x = Tensor::from_vector<double>({0.5, -1.0, 2.0, 0.0, 1.5, 1.5, -0.5, 0.25}, {2, 4});
  x.set_requires_grad();
  Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1}, {1, 4});
  Tensor y = ops::softmax(x, mask);
  print_tensor("x", x);
  print_tensor("y", y);
  fmt::print("backward: dx = y ⊙ (dy − Σ y·dy), with dy = [1, 0, 0, 0] in every row\n");
  Tensor dy = Tensor::from_vector<double>({1, 0, 0, 0, 1, 0, 0, 0}, {2, 4});
  autograd::backward(y, dy);
  print_tensor("dx", x.grad());
  fmt::print("gradient check (f64 central differences, relative error must be <= 1e-6):\n");
  std::vector<Tensor> in = {Tensor::uniform({3, 5}, 1, 0, -1, 1, DType::f64),
                            Tensor::uniform({5}, 2, 0, 0.5, 1.5, DType::f64),
                            Tensor::uniform({5}, 3, 0, -1, 1, DType::f64)};
  for (Tensor& t : in) t.set_requires_grad();
  auto softmax_check = autograd::gradcheck([](const std::vector<Tensor>& v) { return ops::softmax(v[0]); }, {in[0]});
  auto ln_check =
      autograd::gradcheck([](const std::vector<Tensor>& v) { return ops::layernorm(v[0], v[1], v[2]); }, in);
  fmt::print("  softmax:   {} max relative error {:.2e}\n", softmax_check.ok ? "ok  " : "FAIL",
             softmax_check.max_error);
  fmt::print("  layernorm: {} max relative error {:.2e}\n", ln_check.ok ? "ok  " : "FAIL", ln_check.max_error);
  return softmax_check.ok && ln_check.ok ? 0 : 1;
}

// ================================================================ the command
struct Walk {
  const char* name;
  const char* summary;
  int (*run)();
  bool layer;  // an attention layer (one thread, the plain-loop matmul)
};

const std::vector<Walk>& walks() {
  static const std::vector<Walk> list = {
      {"cast", "CAST: surrogate scores, gated affinity, Top-K clusters, intra-cluster attention, summaries", walk_cast,
       true},
      {"clustered", "clustered attention: LSH hashes, Hamming k-means, centroids, centroid attention", walk_clustered,
       true},
      {"iclustered", "improved clustered attention: clustered, plus each cluster's top keys and two terms",
       walk_iclustered, true},
      {"full", "full softmax attention: scores, probabilities with the padded key masked, output", walk_full, true},
      {"softmax", "one op: softmax with a mask, then layernorm, with their gradient checks", walk_softmax, false},
  };
  return list;
}

std::string walk_names() {
  std::string names;
  for (const Walk& w : walks()) names += std::string(names.empty() ? "" : ", ") + w.name;
  return names;
}

}  // namespace

int command_demo(const std::vector<std::string>& argv) {
  cli::Args args("demo",
                 "Walk one attention layer (or one op) step by step on a tiny f64 input: every intermediate of\n"
                 "the forward, the backward one step at a time, and a finite-difference gradient check.\n"
                 "walks: " +
                     walk_names() + " (no walk: the list)");
  args.usage("cast demo [walk]");
  args.example("cast demo cast");
  args.example("cast demo full");
  args.example("cast demo");
  std::vector<std::string> rest = argv;
  std::string name;
  if (!rest.empty() && rest[0].rfind("-", 0) != 0) {  // the walk, before any option
    name = rest[0];
    rest.erase(rest.begin());
  }
  if (!args.parse(rest)) return 0;
  if (name.empty()) {
    fmt::print("cast demo <walk>: one attention layer (or one op) step by step, forward and backward\n");
    for (const Walk& w : walks()) fmt::print("  {:<11} {}\n", w.name, w.summary);
    return 0;
  }
  for (const Walk& w : walks()) {
    if (name != w.name) continue;
    if (w.layer) {
      // One thread and the plain-loop matmul: every sum in one fixed order, whatever the machine's
      // cores and BLAS, so the printout is the same text everywhere.
      omp_set_num_threads(1);
      ops::set_cpu_gemm(ops::CpuGemm::loops);
    }
    return w.run();
  }
  throw UsageError(fmt::format("unknown walk '{}' (the walks: {})", name, walk_names()));
}

}  // namespace cast
