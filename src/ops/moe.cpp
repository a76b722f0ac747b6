// The mixture-of-experts FFN (--ffn moe), a branch op of its own: a softmax router picks the top-k
// of E SwiGLU experts per token and sums their outputs weighted by the gates, plus an optional
// shared expert that every token passes through:
//   p = softmax(x W_router + b_router),  S = the K largest p (ties: the lower expert index),
//   g_e = p_e / sum_{e' in S} p_e'  (renormalized: Mixtral; OLMoE and Qwen-MoE with norm_topk_prob)
//       or p_e                      (softmax: OLMoE and Qwen-MoE as shipped, norm_topk_prob false),
//   y = sum_{e in S} g_e FFN_e(x) + s(x) FFN_shared(x),  s(x) = sigmoid(x W_gate + b_gate) or 1,
//   FFN(x) = (silu(h (x W_1 + b_1)) * h (x W_3 + b_3)) W_2 + b_2   (Shazeer 2020, arXiv 2002.05202),
// with h the FFN's hidden scale (nGPT's s_uv, 1 otherwise). Sources: Jiang et al. 2024 (Mixtral,
// arXiv 2401.04088, Sec. 2.1) and HF transformers' MixtralSparseMoeBlock; Muennighoff et al. 2024
// (OLMoE, arXiv 2409.02060) and OlmoeSparseMoeBlock; Qwen2MoeSparseMoeBlock (shared_expert,
// shared_expert_gate). The routing is piecewise smooth: the derivatives below hold away from ties
// between the K-th and (K+1)-th probability, where the selection is constant.
//
// Work split: one piece per expert (the shared one included), a fixed set whatever the thread
// count; each expert's rows are its routed tokens in token order, and everything summed over
// experts is summed afterwards in a fixed order, so the figures do not depend on --threads.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "gradflow/branch_op.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/gemm.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

namespace {

// The op's settings, from the FFN op's options (BlockOps::options, declared in the row below).
struct MoeSettings {
  int experts = 8, active = 2, shared_hidden = 0;
  bool renormalize = true, shared_gate = true;
  double hidden_scale = 1.0;
  explicit MoeSettings(const BlockOps& ops, double scale = 1.0)
      : experts(static_cast<int>(ops.number("experts"))),
        active(static_cast<int>(ops.number("experts_active"))),
        shared_hidden(static_cast<int>(ops.number("shared_expert_hidden"))),
        renormalize(ops.word("router_gates") == "renormalized"),
        shared_gate(shared_hidden > 0 && ops.word("shared_expert_gate") == "sigmoid"),
        hidden_scale(scale) {}
  bool shared() const { return shared_hidden > 0; }
  // Experts as units of work: the routed ones, then the shared one.
  int units() const { return experts + (shared() ? 1 : 0); }
  // The unit of work piece `piece`: the shared expert first, as it has every token's rows and is
  // usually the largest piece, so that the pool does not wait for it at the end.
  int unit_of_piece(int piece) const {
    if (!shared()) return piece;
    return piece == 0 ? experts : piece - 1;
  }
  // Indices in the weight list (moe_weights): the router, three matrices per unit, the shared gate.
  static constexpr int kRouter = 0;
  static int up(int unit) { return 1 + 3 * unit; }
  static int down(int unit) { return 2 + 3 * unit; }
  static int gate(int unit) { return 3 + 3 * unit; }
  int shared_gate_weight() const { return 1 + 3 * units(); }
};

// What one expert keeps between forward, backward and weight_gradients. Its rows are the tokens
// routed to it (every token for the shared expert), in token order; with P probes the cotangents
// hold P blocks of those rows.
template <typename Scalar>
struct ExpertCache {
  std::vector<Eigen::Index> tokens;
  std::vector<Scalar> gates;                // its weight in each routed token's sum: g_e, or s(x)
  Mat<Scalar> x;                            // (m, d) the routed tokens
  Mat<Scalar> up, gate, activated, hidden;  // (m, n) h(x W_1 + b_1), h(x W_3 + b_3), silu(up), silu * gate
  Mat<Scalar> out;                          // (m, d) FFN_e(x), before the gate
  Mat<Scalar> d_out;                        // (P m, d) the gated output's cotangent, g d_y
  Mat<Scalar> d_up, d_gate;                 // (P m, n) dL/d(x W_1 + b_1), dL/d(x W_3 + b_3), h included
  Mat<Scalar> d_x;                          // (P m, d) the routed tokens' cotangent through this expert
  std::vector<Scalar> d_gates;              // (P m) dL/d(gate): <d_y, FFN_e(x)>
  std::vector<double> squares;              // per probe: ||dW_1||^2 + ||dW_2||^2 + ||dW_3||^2 (+ biases)
};

template <typename Scalar>
Scalar sigmoid(Scalar z) {
  return Scalar(1) / (Scalar(1) + std::exp(-z));
}

// Rows `tokens` of `from` (one block of `rows_per_block` rows per probe) into `to`.
template <typename Scalar>
void gather_rows(const Mat<Scalar>& from, const std::vector<Eigen::Index>& tokens,
                 Eigen::Index rows_per_block, Mat<Scalar>& to) {
  const auto m = static_cast<Eigen::Index>(tokens.size()), blocks = from.rows() / rows_per_block;
  to.resize(blocks * m, from.cols());
  for (Eigen::Index k = 0; k < blocks; ++k)
    for (Eigen::Index i = 0; i < m; ++i) to.row(k * m + i) = from.row(k * rows_per_block + tokens[i]);
}

// y = x W + b (b empty: none).
template <typename Scalar>
void linear(const Mat<Scalar>& x, const Mat<Scalar>& w, const Vec<Scalar>& b, Mat<Scalar>& y) {
  y.resize(x.rows(), w.cols());
  multiply(x, w, y);
  if (b.size() > 0) y.rowwise() += b.transpose();
}

// ||X^T D||_F^2 = <X X^T, D D^T>_F without forming X^T D, as the FFN's Gram trick (ffn.cpp).
template <typename Scalar>
double product_square(const Mat<Scalar>& x_gram, const Eigen::Ref<const Mat<Scalar>>& d) {
  const Mat<Scalar> d_gram = d * d.transpose();
  return x_gram.template cast<double>().cwiseProduct(d_gram.template cast<double>()).sum();
}

// ---------------------------------------------------------------------------------------------
// One SwiGLU expert over its rows: forward, backward, JVP and weight gradients.

template <typename Scalar>
void expert_forward(const SublayerWeights<Scalar>& w, int unit, double hidden_scale, ExpertCache<Scalar>& c) {
  if (c.tokens.empty()) {  // no token chose it
    const Eigen::Index n = w.matrices[MoeSettings::up(unit)].cols();
    for (Mat<Scalar>* m : {&c.up, &c.gate, &c.activated, &c.hidden}) m->resize(0, n);
    c.out.resize(0, w.matrices[MoeSettings::down(unit)].cols());
    return;
  }
  const Scalar h = static_cast<Scalar>(hidden_scale);
  linear(c.x, w.matrices[MoeSettings::up(unit)], w.bias(MoeSettings::up(unit)), c.up);
  linear(c.x, w.matrices[MoeSettings::gate(unit)], w.bias(MoeSettings::gate(unit)), c.gate);
  if (hidden_scale != 1.0) {
    c.up *= h;
    c.gate *= h;
  }
  c.activated = c.up.unaryExpr([](Scalar u) { return u * sigmoid(u); });
  c.hidden = c.activated.cwiseProduct(c.gate);
  linear(c.hidden, w.matrices[MoeSettings::down(unit)], w.bias(MoeSettings::down(unit)), c.out);
}

// silu'(u) = sigmoid(u) (1 + u (1 - sigmoid(u))).
template <typename Scalar>
Scalar silu_slope(Scalar u) {
  const Scalar s = sigmoid(u);
  return s * (Scalar(1) + u * (Scalar(1) - s));
}

// From c.d_out (P m, d): d_gates, d_up, d_gate, and with `input` d_x; with `squares` the per-probe
// squared norms of this expert's weight gradients.
template <typename Scalar>
void expert_backward(const SublayerWeights<Scalar>& w, int unit, double hidden_scale, Eigen::Index probes,
                     bool input, bool squares, ExpertCache<Scalar>& c) {
  const auto m = static_cast<Eigen::Index>(c.tokens.size());
  c.squares.assign(static_cast<std::size_t>(probes), 0.0);  // zero for an expert no token chose
  if (m == 0) {                                             // no token chose it: zero gradients
    const Eigen::Index n = w.matrices[MoeSettings::up(unit)].cols();
    c.d_up.resize(0, n);
    c.d_gate.resize(0, n);
    c.d_x.resize(0, c.x.cols());
    return;
  }
  const Scalar h = static_cast<Scalar>(hidden_scale);
  Mat<Scalar> d_hidden(c.d_out.rows(), c.hidden.cols());
  multiply_transposed(c.d_out, w.matrices[MoeSettings::down(unit)], d_hidden);
  c.d_up.resize(d_hidden.rows(), d_hidden.cols());
  c.d_gate.resize(d_hidden.rows(), d_hidden.cols());
  const Mat<Scalar> slope = c.up.unaryExpr([](Scalar u) { return silu_slope(u); });
  for (Eigen::Index k = 0; k < probes; ++k) {
    const auto block = d_hidden.middleRows(k * m, m);
    c.d_up.middleRows(k * m, m) = block.cwiseProduct(c.gate).cwiseProduct(slope);
    c.d_gate.middleRows(k * m, m) = block.cwiseProduct(c.activated);
  }
  if (hidden_scale != 1.0) {
    c.d_up *= h;
    c.d_gate *= h;
  }
  if (input) {
    c.d_x.resize(c.d_out.rows(), c.x.cols());
    multiply_transposed(c.d_up, w.matrices[MoeSettings::up(unit)], c.d_x);
    multiply_transposed(c.d_gate, w.matrices[MoeSettings::gate(unit)], c.d_x, true);
  }
  if (!squares) return;
  const Mat<Scalar> x_gram = c.x * c.x.transpose(), hidden_gram = c.hidden * c.hidden.transpose();
  const bool bias = w.bias(MoeSettings::up(unit)).size() > 0;
  for (Eigen::Index k = 0; k < probes; ++k) {
    double& square = c.squares[static_cast<std::size_t>(k)];
    square += product_square<Scalar>(x_gram, c.d_up.middleRows(k * m, m));
    square += product_square<Scalar>(x_gram, c.d_gate.middleRows(k * m, m));
    square += product_square<Scalar>(hidden_gram, c.d_out.middleRows(k * m, m));
    if (!bias) continue;
    for (const Mat<Scalar>* d : {&c.d_up, &c.d_gate, &c.d_out})
      square += d->middleRows(k * m, m).template cast<double>().colwise().sum().squaredNorm();
  }
}

// The tangent of FFN_e(x) (P m, d) from the tangent of its rows d_x (P m, d) and of its weights.
template <typename Scalar>
void expert_jvp(const SublayerWeights<Scalar>& w, const SublayerWeights<Scalar>* d_w, int unit,
                double hidden_scale, const ExpertCache<Scalar>& c, const Mat<Scalar>& d_x,
                Mat<Scalar>& d_out) {
  const auto m = static_cast<Eigen::Index>(c.tokens.size());
  if (m == 0) {
    d_out.resize(0, c.out.cols());
    return;
  }
  const Eigen::Index probes = d_x.rows() / m;
  const Scalar h = static_cast<Scalar>(hidden_scale);
  const int up = MoeSettings::up(unit), gate = MoeSettings::gate(unit), down = MoeSettings::down(unit);
  Mat<Scalar> d_up(d_x.rows(), c.up.cols()), d_gate(d_x.rows(), c.up.cols());
  multiply(d_x, w.matrices[up], d_up);
  multiply(d_x, w.matrices[gate], d_gate);
  Mat<Scalar> up_w, gate_w, down_w;  // the weights' tangents' terms, the same for every probe
  if (d_w) {
    linear(c.x, d_w->matrices[up], d_w->bias(up), up_w);
    linear(c.x, d_w->matrices[gate], d_w->bias(gate), gate_w);
    linear(c.hidden, d_w->matrices[down], d_w->bias(down), down_w);
  }
  const Mat<Scalar> slope = c.up.unaryExpr([](Scalar u) { return silu_slope(u); });
  Mat<Scalar> d_hidden(d_x.rows(), c.up.cols());
  for (Eigen::Index k = 0; k < probes; ++k) {
    auto du = d_up.middleRows(k * m, m);
    auto dg = d_gate.middleRows(k * m, m);
    if (d_w) {
      du += up_w;
      dg += gate_w;
    }
    if (hidden_scale != 1.0) {
      du *= h;
      dg *= h;
    }
    d_hidden.middleRows(k * m, m) =
        slope.cwiseProduct(du).cwiseProduct(c.gate) + c.activated.cwiseProduct(dg);
  }
  d_out.resize(d_x.rows(), c.out.cols());
  multiply(d_hidden, w.matrices[down], d_out);
  if (d_w)
    for (Eigen::Index k = 0; k < probes; ++k) d_out.middleRows(k * m, m) += down_w;
}

// ---------------------------------------------------------------------------------------------
// The op

template <typename Scalar>
class MoeOp final : public BranchOp<Scalar> {
 public:
  void forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
               Mat<Scalar>& out, WorkPool* pool, bool with_output) override;
  void backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
                const Mat<Scalar>& d_out, Mat<Scalar>* dx, ParamGradSquares* param_grads, WorkPool* pool,
                std::vector<double>* output_dots) override;
  void jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
           const Mat<Scalar>& d_x, Mat<Scalar>& d_out, const SublayerWeights<Scalar>* d_w) override;
  void weight_gradients(const Mat<Scalar>& x, const BranchSettings& settings, const Mat<Scalar>& d_out,
                        SublayerWeights<Scalar>& gradients, bool bias, WorkPool* pool) const override;

 private:
  void route(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const MoeSettings& moe);
  // Per probe and token, dL/d(router logits) (P T, E) from the experts' d_gates.
  void router_backward(const MoeSettings& moe, Eigen::Index probes);

  Mat<Scalar> probs_;                   // (T, E) softmax of the router's logits
  std::vector<int> chosen_;             // (T, K) the selected experts, by falling probability
  std::vector<Eigen::Index> position_;  // (T, K) each selection's row in its expert's cache
  Mat<Scalar> shared_logit_;            // (T, 1) x W_gate + b_gate, with a gated shared expert
  std::vector<ExpertCache<Scalar>> units_;
  Mat<Scalar> out_;                        // (T, d) the output, kept for output_dots
  Mat<Scalar> d_logits_, d_shared_logit_;  // (P T, E), (P T, 1) cotangents
};

// Router, top-k and gates; each expert's rows and its gathered input.
template <typename Scalar>
void MoeOp<Scalar>::route(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const MoeSettings& moe) {
  const Eigen::Index tokens = x.rows();
  linear(x, w.matrices[MoeSettings::kRouter], w.bias(MoeSettings::kRouter), probs_);
  for (Eigen::Index t = 0; t < tokens; ++t) {  // a stable softmax per token
    auto row = probs_.row(t);
    row = (row.array() - row.maxCoeff()).exp().matrix();
    row /= row.sum();
  }
  units_.resize(static_cast<std::size_t>(moe.units()));
  for (auto& unit : units_) {
    unit.tokens.clear();
    unit.gates.clear();
  }
  const auto k_active = static_cast<std::size_t>(moe.active);
  chosen_.resize(static_cast<std::size_t>(tokens) * k_active);
  position_.resize(chosen_.size());
  std::vector<int> order(static_cast<std::size_t>(moe.experts));
  for (Eigen::Index t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    // A NaN probability (a diverged stack) sorts last, so that the order stays a strict weak one.
    const auto key = [&](int e) {
      const Scalar p = probs_(t, e);
      return std::isnan(p) ? -std::numeric_limits<Scalar>::infinity() : p;
    };
    std::partial_sort(order.begin(), order.begin() + moe.active, order.end(), [&](int a, int b) {
      const Scalar pa = key(a), pb = key(b);
      return pa > pb || (pa == pb && a < b);
    });
    Scalar total = 0;
    for (int j = 0; j < moe.active; ++j) total += probs_(t, order[static_cast<std::size_t>(j)]);
    for (std::size_t j = 0; j < k_active; ++j) {
      const int e = order[j];
      ExpertCache<Scalar>& unit = units_[static_cast<std::size_t>(e)];
      chosen_[static_cast<std::size_t>(t) * k_active + j] = e;
      position_[static_cast<std::size_t>(t) * k_active + j] = static_cast<Eigen::Index>(unit.tokens.size());
      unit.tokens.push_back(t);
      unit.gates.push_back(moe.renormalize ? probs_(t, e) / total : probs_(t, e));
    }
  }
  if (moe.shared()) {
    ExpertCache<Scalar>& shared = units_.back();
    shared.tokens.resize(static_cast<std::size_t>(tokens));
    std::iota(shared.tokens.begin(), shared.tokens.end(), Eigen::Index{0});
    shared.gates.assign(static_cast<std::size_t>(tokens), Scalar(1));
    if (moe.shared_gate) {
      const int g = moe.shared_gate_weight();
      linear(x, w.matrices[static_cast<std::size_t>(g)], w.bias(static_cast<std::size_t>(g)), shared_logit_);
      for (Eigen::Index t = 0; t < tokens; ++t)
        shared.gates[static_cast<std::size_t>(t)] = sigmoid(shared_logit_(t, 0));
    }
  }
  for (auto& unit : units_) gather_rows(x, unit.tokens, tokens, unit.x);
}

template <typename Scalar>
void MoeOp<Scalar>::forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                            const BranchSettings& settings, Mat<Scalar>& out, WorkPool* pool,
                            bool with_output) {
  const MoeSettings moe(settings.ops, settings.hidden_scale);
  route(x, w, moe);
  for_each_piece(pool, moe.units(), [&](int piece) {
    const int unit = moe.unit_of_piece(piece);
    expert_forward(w, unit, moe.hidden_scale, units_[static_cast<std::size_t>(unit)]);
  });
  out_.setZero(x.rows(), x.cols());  // summed in a fixed order: unit by unit, rows in token order
  for (const ExpertCache<Scalar>& unit : units_)
    for (std::size_t i = 0; i < unit.tokens.size(); ++i)
      out_.row(unit.tokens[i]) += unit.gates[i] * unit.out.row(static_cast<Eigen::Index>(i));
  if (with_output) out = out_;
}

template <typename Scalar>
void MoeOp<Scalar>::router_backward(const MoeSettings& moe, Eigen::Index probes) {
  const Eigen::Index tokens = probs_.rows();
  const auto k_active = static_cast<std::size_t>(moe.active);
  d_logits_.setZero(probes * tokens, moe.experts);
  Eigen::Matrix<Scalar, 1, Eigen::Dynamic> d_probs(moe.experts);
  for (Eigen::Index k = 0; k < probes; ++k) {
    for (Eigen::Index t = 0; t < tokens; ++t) {
      d_probs.setZero();
      Scalar total = 0, gated = 0;  // S = sum of the chosen p; sum_j g_j dL/dg_j
      for (std::size_t j = 0; j < k_active; ++j) {
        const int e = chosen_[static_cast<std::size_t>(t) * k_active + j];
        const ExpertCache<Scalar>& unit = units_[static_cast<std::size_t>(e)];
        const auto row = static_cast<std::size_t>(k) * unit.tokens.size() +
                         static_cast<std::size_t>(position_[static_cast<std::size_t>(t) * k_active + j]);
        d_probs(e) = unit.d_gates[row];
        total += probs_(t, e);
        gated += unit.gates[row % unit.tokens.size()] * unit.d_gates[row];
      }
      if (moe.renormalize) {  // g_e = p_e / S: dL/dp_e = (dL/dg_e - sum_j g_j dL/dg_j) / S for chosen e
        for (std::size_t j = 0; j < k_active; ++j) {
          const int e = chosen_[static_cast<std::size_t>(t) * k_active + j];
          d_probs(e) = (d_probs(e) - gated) / total;
        }
      }
      // softmax: dL/dz = p * (dL/dp - <p, dL/dp>)
      const Scalar inner = probs_.row(t).dot(d_probs);
      d_logits_.row(k * tokens + t) = probs_.row(t).cwiseProduct((d_probs.array() - inner).matrix());
    }
  }
}

template <typename Scalar>
void MoeOp<Scalar>::backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                             const BranchSettings& settings, const Mat<Scalar>& d_out, Mat<Scalar>* dx,
                             ParamGradSquares* param_grads, WorkPool* pool,
                             std::vector<double>* output_dots) {
  const MoeSettings moe(settings.ops, settings.hidden_scale);
  const Eigen::Index tokens = x.rows(), probes = d_out.rows() / tokens;
  for_each_piece(pool, moe.units(), [&](int piece) {
    const int index = moe.unit_of_piece(piece);
    ExpertCache<Scalar>& unit = units_[static_cast<std::size_t>(index)];
    const auto m = static_cast<Eigen::Index>(unit.tokens.size());
    gather_rows(d_out, unit.tokens, tokens, unit.d_out);
    unit.d_gates.assign(static_cast<std::size_t>(probes * m), Scalar(0));
    for (Eigen::Index k = 0; k < probes; ++k) {
      for (Eigen::Index i = 0; i < m; ++i) {
        const auto row = unit.d_out.row(k * m + i);
        unit.d_gates[static_cast<std::size_t>(k * m + i)] = row.dot(unit.out.row(i));
        unit.d_out.row(k * m + i) *= unit.gates[static_cast<std::size_t>(i)];
      }
    }
    expert_backward(w, index, moe.hidden_scale, probes, dx != nullptr, param_grads != nullptr, unit);
  });
  router_backward(moe, probes);
  if (moe.shared_gate) {  // s = sigmoid(z): dL/dz = s (1 - s) dL/ds
    const ExpertCache<Scalar>& shared = units_.back();
    d_shared_logit_.resize(probes * tokens, 1);
    for (Eigen::Index k = 0; k < probes; ++k)
      for (Eigen::Index t = 0; t < tokens; ++t) {
        const Scalar s = shared.gates[static_cast<std::size_t>(t)];
        d_shared_logit_(k * tokens + t, 0) =
            s * (Scalar(1) - s) * shared.d_gates[static_cast<std::size_t>(k * tokens + t)];
      }
  }
  if (output_dots) {
    output_dots->assign(static_cast<std::size_t>(probes), 0.0);
    for (Eigen::Index k = 0; k < probes; ++k)
      (*output_dots)[static_cast<std::size_t>(k)] = d_out.middleRows(k * tokens, tokens)
                                                        .template cast<double>()
                                                        .cwiseProduct(out_.template cast<double>())
                                                        .sum();
  }
  if (dx) {  // the router's and the shared gate's terms, then each unit's rows, in a fixed order
    multiply_transposed(d_logits_, w.matrices[MoeSettings::kRouter], *dx, true);
    if (moe.shared_gate)
      multiply_transposed(d_shared_logit_, w.matrices[static_cast<std::size_t>(moe.shared_gate_weight())],
                          *dx, true);
    for (const ExpertCache<Scalar>& unit : units_) {
      const auto m = static_cast<Eigen::Index>(unit.tokens.size());
      for (Eigen::Index k = 0; k < probes; ++k)
        for (Eigen::Index i = 0; i < m; ++i)
          dx->row(k * tokens + unit.tokens[static_cast<std::size_t>(i)]) += unit.d_x.row(k * m + i);
    }
  }
  if (!param_grads) return;
  param_grads->assign(static_cast<std::size_t>(probes), 0.0);
  const Mat<Scalar> x_gram = x * x.transpose();
  const bool bias = w.bias(MoeSettings::kRouter).size() > 0;
  for (Eigen::Index k = 0; k < probes; ++k) {
    double& square = (*param_grads)[static_cast<std::size_t>(k)];
    for (const Mat<Scalar>* d : {&d_logits_, moe.shared_gate ? &d_shared_logit_ : nullptr}) {
      if (!d) continue;
      square += product_square<Scalar>(x_gram, d->middleRows(k * tokens, tokens));
      if (bias)
        square += d->middleRows(k * tokens, tokens).template cast<double>().colwise().sum().squaredNorm();
    }
    for (const ExpertCache<Scalar>& unit : units_) square += unit.squares[static_cast<std::size_t>(k)];
  }
}

template <typename Scalar>
void MoeOp<Scalar>::jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                        const BranchSettings& settings, const Mat<Scalar>& d_x, Mat<Scalar>& d_out,
                        const SublayerWeights<Scalar>* d_w) {
  const MoeSettings moe(settings.ops, settings.hidden_scale);
  const Eigen::Index tokens = x.rows(), probes = d_x.rows() / tokens;
  const auto k_active = static_cast<std::size_t>(moe.active);
  // The router's logits' tangent, then the chosen gates' (the selection is constant near x).
  const auto logit_tangent = [&](int weight, Mat<Scalar>& tangent) {
    const auto index = static_cast<std::size_t>(weight);
    tangent.resize(d_x.rows(), w.matrices[index].cols());
    multiply(d_x, w.matrices[index], tangent);
    if (!d_w) return;
    Mat<Scalar> from_weights;
    linear(x, d_w->matrices[index], d_w->bias(index), from_weights);
    for (Eigen::Index k = 0; k < probes; ++k) tangent.middleRows(k * tokens, tokens) += from_weights;
  };
  Mat<Scalar> d_logits, d_shared;
  logit_tangent(MoeSettings::kRouter, d_logits);
  if (moe.shared_gate) logit_tangent(moe.shared_gate_weight(), d_shared);
  d_out.setZero(d_x.rows(), x.cols());
  for (int index = 0; index < moe.units(); ++index) {
    const ExpertCache<Scalar>& unit = units_[static_cast<std::size_t>(index)];
    const auto m = static_cast<Eigen::Index>(unit.tokens.size());
    Mat<Scalar> d_rows, d_expert;
    gather_rows(d_x, unit.tokens, tokens, d_rows);
    expert_jvp(w, d_w, index, moe.hidden_scale, unit, d_rows, d_expert);
    for (Eigen::Index k = 0; k < probes; ++k)
      for (Eigen::Index i = 0; i < m; ++i)
        d_out.row(k * tokens + unit.tokens[static_cast<std::size_t>(i)]) +=
            unit.gates[static_cast<std::size_t>(i)] * d_expert.row(k * m + i);
  }
  for (Eigen::Index k = 0; k < probes; ++k) {
    for (Eigen::Index t = 0; t < tokens; ++t) {
      const Eigen::Index row = k * tokens + t;
      const auto p = probs_.row(t);
      const Scalar mean = p.dot(d_logits.row(row));  // dp = p * (dz - <p, dz>)
      Scalar total = 0, d_total = 0;
      for (std::size_t j = 0; j < k_active; ++j) {
        const int e = chosen_[static_cast<std::size_t>(t) * k_active + j];
        total += p(e);
        d_total += p(e) * (d_logits(row, e) - mean);
      }
      for (std::size_t j = 0; j < k_active; ++j) {
        const int e = chosen_[static_cast<std::size_t>(t) * k_active + j];
        const ExpertCache<Scalar>& unit = units_[static_cast<std::size_t>(e)];
        const Scalar dp = p(e) * (d_logits(row, e) - mean);
        const Scalar d_gate = moe.renormalize ? (dp - p(e) / total * d_total) / total : dp;
        d_out.row(row) += d_gate * unit.out.row(position_[static_cast<std::size_t>(t) * k_active + j]);
      }
      if (moe.shared_gate) {
        const Scalar s = units_.back().gates[static_cast<std::size_t>(t)];
        d_out.row(row) += s * (Scalar(1) - s) * d_shared(row, 0) * units_.back().out.row(t);
      }
    }
  }
}

template <typename Scalar>
void MoeOp<Scalar>::weight_gradients(const Mat<Scalar>& x, const BranchSettings& settings,
                                     const Mat<Scalar>& d_out, SublayerWeights<Scalar>& gradients, bool bias,
                                     WorkPool* pool) const {
  const MoeSettings moe(settings.ops, settings.hidden_scale);
  if (d_out.rows() != x.rows() || d_logits_.rows() != x.rows())
    throw std::logic_error("weight_gradients follows a backward of one probe's cotangent");
  const int count = moe.shared_gate ? moe.shared_gate_weight() + 1 : 1 + 3 * moe.units();
  gradients.resize(static_cast<std::size_t>(count));
  const auto product = [&](const Mat<Scalar>& input, const Mat<Scalar>& d, int index) {
    const auto i = static_cast<std::size_t>(index);
    gradients.matrices[i].resize(input.cols(), d.cols());
    if (input.rows() == 0) {
      gradients.matrices[i].setZero();
    } else {
      multiply_first_transposed(input, d, gradients.matrices[i]);
    }
    if (bias) {
      gradients.biases[i] =
          input.rows() == 0 ? Vec<Scalar>::Zero(d.cols()) : Vec<Scalar>(d.colwise().sum().transpose());
    } else {
      gradients.biases[i].resize(0);
    }
  };
  // One piece per unit (its three matrices), then the router's and the shared gate's.
  for_each_piece(pool, moe.units() + 1, [&](int piece) {
    if (piece == moe.units()) {
      product(x, d_logits_, MoeSettings::kRouter);
      if (moe.shared_gate) product(x, d_shared_logit_, moe.shared_gate_weight());
      return;
    }
    const int index = moe.unit_of_piece(piece);
    const ExpertCache<Scalar>& unit = units_[static_cast<std::size_t>(index)];
    product(unit.x, unit.d_up, MoeSettings::up(index));
    product(unit.hidden, unit.d_out, MoeSettings::down(index));
    product(unit.x, unit.d_gate, MoeSettings::gate(index));
  });
}

// ---------------------------------------------------------------------------------------------
// The row: weights, cost, options, config.json keys.

// The router (d, E), then W_1, W_2, W_3 of each expert and of the shared one, then the shared
// gate (d, 1). Each has a random stream of its own, after the FFN's (WeightMatrix's values); the
// router and the shared gate are drawn like W_1 (HF's _init_weights draws every nn.Linear alike).
std::vector<WeightSpec> moe_weights(const ModelConfig& config) {
  const MoeSettings moe(block_ops(config));
  const Eigen::Index d = config.width, hidden = config.ffn_hidden();
  std::vector<WeightSpec> specs;
  const auto add = [&specs](std::string name, WeightMatrix role, Eigen::Index rows, Eigen::Index cols) {
    specs.push_back({std::move(name), role, 16 + static_cast<std::uint64_t>(specs.size()), rows, cols});
  };
  add("W_router", WeightMatrix::up, d, moe.experts);
  for (int unit = 0; unit < moe.units(); ++unit) {
    const bool shared = unit == moe.experts;
    const std::string suffix = shared ? ".shared" : fmt::format(".e{}", unit);
    const Eigen::Index n = shared ? moe.shared_hidden : hidden;
    add("W_1" + suffix, WeightMatrix::up, d, n);
    add("W_2" + suffix, WeightMatrix::down, n, d);
    add("W_3" + suffix, WeightMatrix::gate, d, n);
  }
  if (moe.shared_gate) add("W_gate.shared", WeightMatrix::up, d, 1);
  return specs;
}

BranchCost moe_cost(const ModelConfig& config) {
  const MoeSettings moe(block_ops(config));
  const double d = config.width, t = config.seq, n = config.ffn_hidden(), shared = moe.shared_hidden;
  BranchCost cost;
  cost.forward_flops = 2 * t * d * moe.experts + 6 * t * moe.active * d * n + 6 * t * d * shared;
  cost.probe_scalars = 3 * moe.active * t * (n + d) + 3 * t * (shared + d) + t * moe.experts;
  cost.fixed_scalars = moe.active * t * (4 * n + 2 * d) + t * (4 * shared + 2 * d) + 2 * t * moe.experts;
  return cost;
}

void moe_check(const ModelConfig& config) {
  const MoeSettings moe(block_ops(config));
  const BlockOps ops = block_ops(config);
  for (const auto& [key, flag] :
       {std::pair{"experts", "--experts"}, std::pair{"experts_active", "--experts-active"},
        std::pair{"shared_expert_hidden", "--shared-expert-hidden"}}) {
    const double value = ops.number(key);
    if (value != std::floor(value))
      throw InputError(
          fmt::format("{} {} must be a whole number; try {} {}", flag, value, flag, std::floor(value)));
  }
  if (moe.active > moe.experts)
    throw InputError(
        fmt::format("--experts-active {} exceeds --experts {}: each token picks that many of the "
                    "experts; try --experts-active {}",
                    moe.active, moe.experts, std::min(2, moe.experts)));
  if (config.op_options.count("shared_expert_gate") && !moe.shared())
    throw InputError(
        fmt::format("--shared-expert-gate {} gates the shared expert, and there is none; add "
                    "--shared-expert-hidden N (e.g. {}) or omit --shared-expert-gate",
                    ops.word("shared_expert_gate"), config.ffn_hidden()));
}

PlacementOption number_option(std::string_view key, std::string_view flag, std::string_view help,
                              double value, NumberRange range, std::string_view fix) {
  PlacementOption option;
  option.key = key;
  option.flag = flag;
  option.help = help;
  option.default_value = value;
  option.range = range;
  option.fix = fix;
  option.when_unused = UnusedOption::refuse;
  option.in_run_config = option.in_sweep_model = true;
  option.whole = true;  // each is a count: moe_check refuses a fraction
  return option;
}

PlacementOption word_option(std::string_view key, std::string_view flag, std::string_view help,
                            std::string_view value, std::vector<std::string_view> choices,
                            std::string_view fix) {
  PlacementOption option;
  option.key = key;
  option.flag = flag;
  option.help = help;
  option.default_value = std::string(value);
  option.choices = std::move(choices);
  option.fix = fix;
  option.when_unused = UnusedOption::refuse;
  option.in_run_config = option.in_sweep_model = true;
  return option;
}
}  // namespace

BranchOpRow moe_op_row() {
  constexpr double kMaxExperts = 4096;
  return {
      .name = "moe",
      .serves = [](SublayerKind kind,
                   const BlockOps& ops) { return kind == SublayerKind::ffn && ops.ffn_op == "moe"; },
      .ffn_words = {{"moe", FfnKind::swiglu,
                     "moe (mixture of SwiGLU experts, top-k routed: --experts, --experts-active)"}},
      .options =
          {number_option("experts", "--experts", "Routed experts E of --ffn moe (units)", 8,
                         NumberRange{1, kMaxExperts, true, true}, "try --experts 8"),
           number_option("experts_active", "--experts-active",
                         "Experts each token is routed to (top-k) with --ffn moe", 2,
                         NumberRange{1, kMaxExperts, true, true}, "try --experts-active 2"),
           number_option("shared_expert_hidden", "--shared-expert-hidden",
                         "Hidden width of a shared expert every token passes (Qwen-MoE, DeepSeek) with --ffn "
                         "moe (units); 0 means none",
                         0, NumberRange{0, kMaxWidth, true, true}, "try --shared-expert-hidden 0"),
           word_option("router_gates", "--router-gates",
                       "Gates of the chosen experts with --ffn moe: renormalized (softmax probabilities "
                       "divided by their sum over the top-k: Mixtral) or softmax (as they are: OLMoE, "
                       "Qwen-MoE with norm_topk_prob false)",
                       "renormalized", {"renormalized", "softmax"}, "try --router-gates renormalized"),
           word_option(
               "shared_expert_gate", "--shared-expert-gate",
               "The shared expert's weight with --ffn moe: sigmoid (sigmoid(x W_gate), Qwen-MoE) or none "
               "(1)",
               "sigmoid", {"sigmoid", "none"}, "try --shared-expert-gate sigmoid")},
      .check = moe_check,
      // Mixtral's num_local_experts, OLMoE's and Qwen-MoE's num_experts choose the op.
      .config_json = {{"experts", {"num_local_experts", "num_experts"}, "", ""},
                      {"experts_active", {"num_experts_per_tok"}, "", ""},
                      {"ffn_hidden", {"moe_intermediate_size"}, "", ""},
                      {"shared_expert_hidden", {"shared_expert_intermediate_size"}, "", ""},
                      {"router_gates", {"norm_topk_prob"}, "renormalized", "softmax"}},
      .weights = moe_weights,
      .cost = moe_cost,
      .make_float = [] { return std::unique_ptr<BranchOp<float>>(new MoeOp<float>); },
      .make_double = [] { return std::unique_ptr<BranchOp<double>>(new MoeOp<double>); }};
}

}  // namespace gradflow
