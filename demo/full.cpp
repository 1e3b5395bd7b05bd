// `cast demo full`: full softmax attention, step by step (demo/walk.h).
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

}  // namespace cast::demo
