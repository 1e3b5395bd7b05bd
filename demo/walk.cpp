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
#include "demo/walk.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/attention/clustering.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::demo {

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

// The heads of a (1, H, R, W) tensor as groups "name head h"; a (R, W) or (1, R, W) tensor as one
// group "name".
std::vector<Group> heads(const std::string& name, const Tensor& t, CellFormat format) {
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

Projections project(const Tensor& x, const Weights& w) {
  return {split_heads(ops::matmul(x, w.wq)), split_heads(ops::matmul(x, w.wk)), split_heads(ops::matmul(x, w.wv))};
}

// The end of every layer: heads merged, projected by W_o, and a padded position set to 0.
Tensor output(const Tensor& heads_out, const Tensor& wo, const Tensor& mask) {
  return ops::mul(ops::matmul(merge_heads(heads_out), wo), ops::reshape(mask, {1, kTokens, 1}));
}

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

}  // namespace cast::demo
