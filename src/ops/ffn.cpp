// GELU and the feed-forward sublayer, forward and backward.
#include <cmath>
#include <numbers>
#include <type_traits>
#include <unsupported/Eigen/SpecialFunctions>

#include "gradflow/branch_op.hpp"
#include "gradflow/gemm.hpp"
#include "gradflow/lane_sum.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

// GELU's tanh approximation (Hendrycks & Gimpel 2016, arXiv 1606.08415, Sec. 2; transformers'
// NewGELUActivation and gelu_pytorch_tanh): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr double kGeluTanhScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluTanhCubic = 0.044715;

// Eigen's vectorised erf (a rational approximation within a few float ulps of std::erf for
// float; std::erf itself for double) or tanh, applied row by row so that column blocks of a
// row-major matrix (one block of hidden units) work too.
template <typename Scalar, typename In, typename Out>
void gelu_forward_rows(const In& x, Out&& y, bool tanh_form) {
  const Scalar inv_sqrt2 = static_cast<Scalar>(1.0 / std::numbers::sqrt2);
  const Scalar scale = static_cast<Scalar>(kGeluTanhScale), cubic = static_cast<Scalar>(kGeluTanhCubic);
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const auto in = x.row(r).array();
    if (tanh_form) {
      y.row(r).array() = Scalar(0.5) * in * (Scalar(1) + (scale * (in + cubic * in.cube())).tanh());
    } else {
      y.row(r).array() = Scalar(0.5) * in * (Scalar(1) + (in * inv_sqrt2).erf());
    }
  }
}

// gelu'(x) for one row: d/dx [x Phi(x)] = Phi(x) + x phi(x); for the tanh form, with
// u = s (x + c x^3) and t = tanh(u), 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2).
template <typename Scalar, typename In>
void gelu_slope_row(const In& in, bool tanh_form, Eigen::Array<Scalar, 1, Eigen::Dynamic>& slope) {
  if (tanh_form) {
    const Scalar scale = static_cast<Scalar>(kGeluTanhScale), cubic = static_cast<Scalar>(kGeluTanhCubic);
    slope = (scale * (in + cubic * in.cube())).tanh();
    slope = Scalar(0.5) * (Scalar(1) + slope) + Scalar(0.5) * in * (Scalar(1) - slope.square()) * scale *
                                                    (Scalar(1) + Scalar(3) * cubic * in.square());
  } else {
    const Scalar inv_sqrt2 = static_cast<Scalar>(1.0 / std::numbers::sqrt2);
    const Scalar inv_sqrt_2pi = static_cast<Scalar>(1.0 / std::sqrt(2.0 * std::numbers::pi));
    slope = Scalar(0.5) * (Scalar(1) + (in * inv_sqrt2).erf()) +
            in * inv_sqrt_2pi * (Scalar(-0.5) * in.square()).exp();
  }
}

// dx (+)= dy * gelu'(x); dy holds K probes of x's rows.
// slope: one row of scratch, kept by the caller so that the loop does not allocate.
template <typename Scalar, typename In, typename DOut, typename DIn>
void gelu_backward_rows(const In& x, const DOut& dy, DIn&& dx, Eigen::Array<Scalar, 1, Eigen::Dynamic>& slope,
                        bool tanh_form, bool accumulate = false) {
  const Eigen::Index tokens = x.rows();
  slope.resize(x.cols());
  for (Eigen::Index r = 0; r < tokens; ++r) {
    gelu_slope_row<Scalar>(x.row(r).array(), tanh_form, slope);
    for (Eigen::Index row = r; row < dy.rows(); row += tokens) {
      if (accumulate) {
        dx.row(row).array() += dy.row(row).array() * slope;
      } else {
        dx.row(row).array() = dy.row(row).array() * slope;
      }
    }
  }
}

template <typename Scalar>
void gelu_forward(const Mat<Scalar>& x, Mat<Scalar>& y, bool tanh_form) {
  y.resize(x.rows(), x.cols());
  gelu_forward_rows<Scalar>(x, y, tanh_form);
}

template <typename Scalar>
void gelu_backward(const Mat<Scalar>& x, const Mat<Scalar>& dy, Mat<Scalar>& dx, bool tanh_form) {
  Eigen::Array<Scalar, 1, Eigen::Dynamic> slope;
  gelu_backward_rows<Scalar>(x, dy, dx, slope, tanh_form, true);
}

template <typename Scalar>
void lower_gram(const Eigen::Ref<const Mat<Scalar>>& rows, Mat<Scalar>& gram) {
  if (rows.cols() == 0) {  // a block with no columns; Eigen's rank update divides by zero
    gram.setZero(rows.rows(), rows.rows());
    return;
  }
  if constexpr (kTiledMultiply && std::is_same_v<Scalar, float>) {
    // On the tiled kernel, the tiles that reach the lower triangle (3/4 of the square at T = 64):
    // 15-25% faster than BLAS's ssyrk, which packs its operand and runs at about 40 GFLOP/s here.
    if (kernel_choice().tiled_products) {
      gram.resize(rows.rows(), rows.rows());
      gram_lower_f32(rows.data(), rows.outerStride(), gram.data(), gram.outerStride(), rows.rows(),
                     rows.cols());
      return;
    }
  }
  gram.setZero(rows.rows(), rows.rows());
  gram.template selfadjointView<Eigen::Lower>().rankUpdate(rows);
}

template <typename Scalar>
double symmetric_inner(const Mat<Scalar>& a, const Mat<Scalar>& b) {
  double diagonal = 0, below = 0;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    diagonal += static_cast<double>(a(i, i)) * static_cast<double>(b(i, i));
    below += lane_dot(&a.coeffRef(i, 0), &b.coeffRef(i, 0), i);  // row-major: a(i, 0 .. i) is contiguous
  }
  return diagonal + 2.0 * below;
}

template <typename Scalar>
void shared_input_gram(int item, const Mat<Scalar>& x, const Mat<Scalar>& d_out,
                       std::vector<Mat<Scalar>>& grams) {
  const Eigen::Index tokens = x.rows();
  if (item == 0) return lower_gram<Scalar>(x, grams[0]);
  lower_gram<Scalar>(d_out.middleRows((item - 1) * tokens, tokens), grams[item]);
}

// The gate's activation act(x) on a block of rows: SiLU for swiglu, GELU for geglu (either form).
template <typename Scalar, typename In, typename Out>
void gate_activation_rows(FfnKind kind, const In& x, Out&& y) {
  if (kind != FfnKind::swiglu) return gelu_forward_rows<Scalar>(x, y, gelu_tanh_form(kind));
  for (Eigen::Index r = 0; r < x.rows(); ++r) {  // silu(x) = x sigmoid(x) (Elfwing et al. 2018)
    const auto in = x.row(r).array();
    y.row(r).array() = in / (Scalar(1) + (-in).exp());
  }
}

// geglu_tanh's slope = gelu_tanh'(pre) * gate, token by token (T, n).
template <typename Scalar, typename In, typename Out>
void tanh_gate_slope_rows(const In& pre, const In& gate, Out&& slope) {
  thread_local Eigen::Array<Scalar, 1, Eigen::Dynamic> row_slope;  // a row of scratch per thread
  for (Eigen::Index r = 0; r < pre.rows(); ++r) {
    gelu_slope_row<Scalar>(pre.row(r).array(), true, row_slope);
    slope.row(r).array() = row_slope * gate.row(r).array();
  }
}

// slope = act'(pre) * gate, the gated unit's d hidden / d pre, token by token (T, n):
// gelu' = Phi(x) + x phi(x); silu' = sigmoid(x) (1 + x (1 - sigmoid(x))).
template <typename Scalar, typename In, typename Out>
void gate_slope_rows(FfnKind kind, const In& pre, const In& gate, Out&& slope) {
  if (kind == FfnKind::geglu_tanh) return tanh_gate_slope_rows<Scalar>(pre, gate, slope);
  const Scalar inv_sqrt2 = static_cast<Scalar>(1.0 / std::numbers::sqrt2);
  const Scalar inv_sqrt_2pi = static_cast<Scalar>(1.0 / std::sqrt(2.0 * std::numbers::pi));
  for (Eigen::Index r = 0; r < pre.rows(); ++r) {
    const auto in = pre.row(r).array();
    if (kind == FfnKind::geglu) {
      slope.row(r).array() = (Scalar(0.5) * (Scalar(1) + (in * inv_sqrt2).erf()) +
                              in * inv_sqrt_2pi * (Scalar(-0.5) * in.square()).exp()) *
                             gate.row(r).array();
    } else {
      const Eigen::Array<Scalar, 1, Eigen::Dynamic> sigmoid = Scalar(1) / (Scalar(1) + (-in).exp());
      slope.row(r).array() = sigmoid * (Scalar(1) + in * (Scalar(1) - sigmoid)) * gate.row(r).array();
    }
  }
}

// dx = dy * factors row by row, dy holding K probes of the factors' T rows.
template <typename Factors, typename DOut, typename DIn>
void multiply_probe_rows(const Factors& factors, const DOut& dy, DIn&& dx) {
  const Eigen::Index tokens = factors.rows();
  for (Eigen::Index row = 0; row < dy.rows(); ++row) {
    dx.row(row).array() = dy.row(row).array() * factors.row(row % tokens).array();
  }
}

// Adds ||sum over tokens of dY_k||^2 per probe k, the squared gradient of a bias b in y = x W + b.
template <typename Scalar, typename DOut>
void add_bias_grad_squares(const DOut& d_out, Eigen::Index tokens, std::vector<double>& squares) {
  for (std::size_t k = 0; k < squares.size(); ++k) {
    const auto rows = d_out.middleRows(static_cast<Eigen::Index>(k) * tokens, tokens);
    squares[k] += rows.template cast<double>().colwise().sum().squaredNorm();
  }
}

// A block of kFeatureBlock hidden units per piece: columns of W_1 (and W_3) and rows of W_2
// (Megatron-LM's split, arXiv 1909.08053 Sec. 3); then a block of output columns per piece.
// The hidden scale s multiplies the product x W_1 (not W_1 itself), so dL/dW_1 = s x^T dL/d(s x W_1)
// as in nGPT, where s_uv is a parameter of its own; s = 1 skips the multiplication (same bits).
// A gated FFN scales both x W_1 and x W_3, as nGPT's s_uv scales both halves of uv.
template <typename Scalar>
void ffn_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const FfnOptions& options,
                 FfnCache<Scalar>& cache, Mat<Scalar>& out, WorkPool* pool, bool with_output) {
  const Eigen::Index tokens = x.rows(), hidden = w.matrices[kWeightUp].cols(),
                     width = w.matrices[kWeightDown].cols();
  const Scalar hidden_scale = static_cast<Scalar>(options.hidden_scale);
  const bool gated = ffn_gated(options.kind), bias = w.bias(kWeightUp).size() > 0;
  cache.hidden_pre.resize(tokens, hidden);  // (T, hidden) s x W_1
  cache.hidden.resize(tokens, hidden);      // gelu(s x W_1), or act(s x W_1) * (s x W_3)
  if (gated) {
    cache.gate_pre.resize(tokens, hidden);
    cache.activated.resize(tokens, hidden);
  }
  for_each_piece(pool, feature_blocks(hidden), [&](int block) {
    const FeatureBlock units = feature_block(hidden, block);
    auto pre = cache.hidden_pre.middleCols(units.begin, units.size);
    multiply(x, w.matrices[kWeightUp].middleCols(units.begin, units.size), pre);
    if (bias) pre.rowwise() += w.bias(kWeightUp).segment(units.begin, units.size).transpose();
    if (options.hidden_scale != 1.0) pre *= hidden_scale;
    if (!gated)
      return gelu_forward_rows<Scalar>(pre, cache.hidden.middleCols(units.begin, units.size),
                                       gelu_tanh_form(options.kind));
    auto gate = cache.gate_pre.middleCols(units.begin, units.size);
    multiply(x, w.matrices[kWeightGate].middleCols(units.begin, units.size), gate);
    if (bias) gate.rowwise() += w.bias(kWeightGate).segment(units.begin, units.size).transpose();
    if (options.hidden_scale != 1.0) gate *= hidden_scale;
    auto activated = cache.activated.middleCols(units.begin, units.size);
    gate_activation_rows<Scalar>(options.kind, pre, activated);
    cache.hidden.middleCols(units.begin, units.size) = (activated.array() * gate.array()).matrix();
  });
  if (!with_output) return;
  out.resize(tokens, width);
  for_each_piece(pool, feature_blocks(width), [&](int block) {
    const FeatureBlock columns = feature_block(width, block);
    auto out_columns = out.middleCols(columns.begin, columns.size);
    multiply(cache.hidden, w.matrices[kWeightDown].middleCols(columns.begin, columns.size), out_columns);
    if (bias) out_columns.rowwise() += w.bias(kWeightDown).segment(columns.begin, columns.size).transpose();
  });
}

namespace {
// One block's dL/d(s x W_1) (and dL/d(s x W_3) when gated) from its dL/d hidden, scaled by s.
template <typename Scalar, typename Block>
void ffn_hidden_backward(const FfnOptions& options, FfnCache<Scalar>& cache, FeatureBlock units,
                         const Block& d_hidden) {
  thread_local Eigen::Array<Scalar, 1, Eigen::Dynamic> gelu_slope;  // a row of scratch per thread
  const auto pre = cache.hidden_pre.middleCols(units.begin, units.size);
  auto d_pre = cache.d_hidden_pre.middleCols(units.begin, units.size);
  const Scalar hidden_scale = static_cast<Scalar>(options.hidden_scale);
  if (!ffn_gated(options.kind)) {
    gelu_backward_rows<Scalar>(pre, d_hidden, d_pre, gelu_slope, gelu_tanh_form(options.kind));
  } else {  // d(a * g) = g a'(pre) d pre + a d gate
    const auto gate = cache.gate_pre.middleCols(units.begin, units.size);
    auto slope = cache.gate_slope.middleCols(units.begin, units.size);
    gate_slope_rows<Scalar>(options.kind, pre, gate, slope);
    multiply_probe_rows(slope, d_hidden, d_pre);
    auto d_gate = cache.d_gate_pre.middleCols(units.begin, units.size);
    multiply_probe_rows(cache.activated.middleCols(units.begin, units.size), d_hidden, d_gate);
    if (options.hidden_scale != 1.0) d_gate *= hidden_scale;
  }
  if (options.hidden_scale != 1.0) d_pre *= hidden_scale;  // now dL/d(x W_1)
}

// The Gram trick (attention.cpp) for one block of hidden units: ||dW_2||^2 over its rows of W_2,
// <H_b H_b^T, dY dY^T>; ||dW_1||^2 (and ||dW_3||^2) over its columns, <X X^T, dH_b dH_b^T>; and
// with biases, the block's ||db_1||^2 (and ||db_3||^2).
template <typename Scalar>
void hidden_block_squares(FfnCache<Scalar>& cache, FeatureBlock units, bool gated, bool bias,
                          Eigen::Index tokens, std::vector<double>& squares) {
  thread_local Mat<Scalar> gram;
  const Mat<Scalar>& x_gram = cache.shared_grams[0];
  lower_gram<Scalar>(cache.hidden.middleCols(units.begin, units.size), gram);
  for (std::size_t k = 0; k < squares.size(); ++k)
    squares[k] += symmetric_inner(gram, cache.shared_grams[1 + k]);
  for (const Mat<Scalar>* d_pre : {&cache.d_hidden_pre, gated ? &cache.d_gate_pre : nullptr}) {
    if (!d_pre) continue;
    const auto block = d_pre->middleCols(units.begin, units.size);
    for (std::size_t k = 0; k < squares.size(); ++k) {
      const auto rows = block.middleRows(static_cast<Eigen::Index>(k) * tokens, tokens);
      lower_gram<Scalar>(rows, gram);
      squares[k] += symmetric_inner(x_gram, gram);
      if (bias) squares[k] += rows.template cast<double>().colwise().sum().squaredNorm();
    }
  }
}
}  // namespace

// Run 1: a block of hidden units per piece back through W_2's rows and the activation (and, with
// param_grads, the shared Grams as pieces of their own); run 2: a block of dx's columns per piece
// back through W_1 (and W_3), and the parameter-gradient squares per block of hidden units.
template <typename Scalar>
void ffn_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const FfnOptions& options,
                  FfnCache<Scalar>& cache, const Mat<Scalar>& d_out, Mat<Scalar>* dx,
                  ParamGradSquares* param_grads, WorkPool* pool, std::vector<double>* output_dots) {
  const Eigen::Index tokens = x.rows(), hidden = w.matrices[kWeightUp].cols(), rows = d_out.rows(),
                     width = x.cols();
  const Eigen::Index probes = rows / tokens;
  const bool gated = ffn_gated(options.kind), bias = w.bias(kWeightUp).size() > 0;
  cache.d_hidden.resize(rows, hidden);
  cache.d_hidden_pre.resize(rows, hidden);
  if (gated) {
    cache.d_gate_pre.resize(rows, hidden);
    cache.gate_slope.resize(tokens, hidden);
  }
  const int blocks = feature_blocks(hidden), grams = param_grads ? static_cast<int>(1 + probes) : 0;
  if (param_grads) cache.shared_grams.resize(1 + probes);
  if (output_dots) cache.output_dots.reset(blocks, probes);
  for_each_piece(pool, blocks + grams, [&](int piece) {
    if (piece >= blocks) return shared_input_gram(piece - blocks, x, d_out, cache.shared_grams);
    const FeatureBlock units = feature_block(hidden, piece);
    auto d_hidden = cache.d_hidden.middleCols(units.begin, units.size);
    multiply_transposed(d_out, w.matrices[kWeightDown].middleRows(units.begin, units.size),
                        d_hidden);  // (K*T, n)
    ffn_hidden_backward(options, cache, units, d_hidden);
    if (!output_dots) return;  // <d_out, H W_2> = <d_out W_2^T, H> over this block's units
    const auto hidden_units = cache.hidden.middleCols(units.begin, units.size);
    for (Eigen::Index k = 0; k < probes; ++k)
      cache.output_dots.parts[piece][k] =
          row_major_dot(d_hidden.middleRows(k * tokens, tokens), hidden_units);
  });
  if (output_dots) cache.output_dots.sum_into(*output_dots);
  if (!dx && !param_grads) return;
  const int dx_pieces = dx ? feature_blocks(width) : 0;
  if (param_grads) cache.squares.reset(blocks, probes);
  cache.d_input.resize(rows, width);
  for_each_piece(pool, dx_pieces + (param_grads ? blocks : 0), [&](int piece) {
    if (piece >= dx_pieces) {
      const int block = piece - dx_pieces;
      return hidden_block_squares(cache, feature_block(hidden, block), gated, bias, tokens,
                                  cache.squares.parts[block]);
    }
    const FeatureBlock c = feature_block(width, piece);
    auto d_input = cache.d_input.middleCols(c.begin, c.size);
    multiply_transposed(cache.d_hidden_pre, w.matrices[kWeightUp].middleRows(c.begin, c.size), d_input);
    if (gated)
      multiply_transposed(cache.d_gate_pre, w.matrices[kWeightGate].middleRows(c.begin, c.size), d_input,
                          true);
    dx->middleCols(c.begin, c.size) += d_input;
  });
  if (!param_grads) return;
  cache.squares.sum_into(*param_grads);
  if (bias) add_bias_grad_squares<Scalar>(d_out, tokens, *param_grads);  // b_2
}

template <typename Scalar>
void ffn_jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const FfnOptions& options,
             FfnCache<Scalar>& cache, const Mat<Scalar>& d_x, Mat<Scalar>& d_out,
             const SublayerWeights<Scalar>* d_w) {
  cache.d_hidden.noalias() = d_x * w.matrices[kWeightUp];  // (P*T, hidden)
  if (d_w) {                                               // product rule: d(x W + b) = dx W + x dW + db
    cache.d_hidden.noalias() += x * d_w->matrices[kWeightUp];
    if (d_w->bias(kWeightUp).size() > 0) cache.d_hidden.rowwise() += d_w->bias(kWeightUp).transpose();
  }
  if (options.hidden_scale != 1.0) cache.d_hidden *= static_cast<Scalar>(options.hidden_scale);
  if (!ffn_gated(options.kind)) {
    cache.d_hidden_pre.setZero(cache.d_hidden.rows(), cache.d_hidden.cols());
    gelu_backward(cache.hidden_pre, cache.d_hidden, cache.d_hidden_pre,
                  gelu_tanh_form(options.kind));  // GELU's Jacobian is diagonal
  } else {  // d(a * g) = g a'(pre) d pre + a d gate, with d gate = s d_x W_3
    cache.gate_slope.resize(cache.hidden_pre.rows(), cache.hidden_pre.cols());
    gate_slope_rows<Scalar>(options.kind, cache.hidden_pre, cache.gate_pre, cache.gate_slope);
    cache.d_gate_pre.noalias() = d_x * w.matrices[kWeightGate];
    if (d_w) {
      cache.d_gate_pre.noalias() += x * d_w->matrices[kWeightGate];
      if (d_w->bias(kWeightGate).size() > 0) cache.d_gate_pre.rowwise() += d_w->bias(kWeightGate).transpose();
    }
    if (options.hidden_scale != 1.0) cache.d_gate_pre *= static_cast<Scalar>(options.hidden_scale);
    cache.d_hidden_pre.resize(cache.d_hidden.rows(), cache.d_hidden.cols());
    multiply_probe_rows(cache.gate_slope, cache.d_hidden, cache.d_hidden_pre);
    multiply_probe_rows(cache.activated, cache.d_gate_pre, cache.d_gate_pre);
    cache.d_hidden_pre += cache.d_gate_pre;
  }
  d_out.noalias() = cache.d_hidden_pre * w.matrices[kWeightDown];  // (P*T, d)
  if (d_w) {
    d_out.noalias() += cache.hidden * d_w->matrices[kWeightDown];
    if (d_w->bias(kWeightDown).size() > 0) d_out.rowwise() += d_w->bias(kWeightDown).transpose();
  }
}

template <typename Scalar>
void ffn_weight_gradients(const Mat<Scalar>& x, const FfnOptions& options, const FfnCache<Scalar>& cache,
                          const Mat<Scalar>& d_out, SublayerWeights<Scalar>& gradients, bool bias,
                          WorkPool* pool) {
  gradients.resize(ffn_weight_count(options.kind));
  gradients.matrices[kWeightUp].resize(x.cols(), cache.d_hidden_pre.cols());
  gradients.matrices[kWeightDown].resize(cache.hidden.cols(), d_out.cols());
  if (ffn_gated(options.kind)) gradients.matrices[kWeightGate].resize(x.cols(), cache.d_gate_pre.cols());
  // One product per piece (piece = FfnWeight): x^T dL/d(x W_1), H^T dY, x^T dL/d(x W_3) (s applied
  // in both); with biases, db = 1^T of the same cotangent (s (x W + b) and H W_2 + b_2, summed
  // over tokens).
  const Mat<Scalar>* d_raw[3] = {&cache.d_hidden_pre, &d_out, &cache.d_gate_pre};
  for_each_piece(pool, ffn_weight_count(options.kind), [&](int piece) {
    multiply_first_transposed(piece == kWeightDown ? cache.hidden : x, *d_raw[piece],
                              gradients.matrices[piece]);
    if (bias) {
      gradients.biases[piece] = d_raw[piece]->colwise().sum().transpose();
    } else {
      gradients.biases[piece].resize(0);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The FFN as a branch op (branch_op.hpp): its row in the table.
namespace {
FfnOptions ffn_options(const BranchSettings& settings) {
  return {settings.hidden_scale, settings.ops.ffn};
}

template <typename Scalar>
class FfnOp final : public BranchOp<Scalar> {
 public:
  void forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
               Mat<Scalar>& out, WorkPool* pool, bool with_output) override {
    ffn_forward(x, w, ffn_options(settings), cache_, out, pool, with_output);
  }
  void backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
                const Mat<Scalar>& d_out, Mat<Scalar>* dx, ParamGradSquares* param_grads, WorkPool* pool,
                std::vector<double>* output_dots) override {
    ffn_backward(x, w, ffn_options(settings), cache_, d_out, dx, param_grads, pool, output_dots);
  }
  void jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
           const Mat<Scalar>& d_x, Mat<Scalar>& d_out, const SublayerWeights<Scalar>* d_w) override {
    ffn_jvp(x, w, ffn_options(settings), cache_, d_x, d_out, d_w);
  }
  void weight_gradients(const Mat<Scalar>& x, const BranchSettings& settings, const Mat<Scalar>& d_out,
                        SublayerWeights<Scalar>& gradients, bool bias, WorkPool* pool) const override {
    ffn_weight_gradients(x, ffn_options(settings), cache_, d_out, gradients, bias, pool);
  }

 private:
  FfnCache<Scalar> cache_;
};

// In FfnWeight's order. The streams are WeightMatrix's values, as before the table; W_3 has its
// own stream and is drawn like W_1, as HF's _init_weights draws every nn.Linear alike.
std::vector<WeightSpec> ffn_weights(const ModelConfig& config) {
  const Eigen::Index d = config.width, hidden = config.ffn_hidden();
  const auto spec = [](const char* name, WeightMatrix role, Eigen::Index rows, Eigen::Index cols) {
    return WeightSpec{name, role, static_cast<std::uint64_t>(role), rows, cols};
  };
  std::vector<WeightSpec> specs = {spec("W_1", WeightMatrix::up, d, hidden),
                                   spec("W_2", WeightMatrix::down, hidden, d)};
  if (ffn_gated(block_ops(config).ffn)) specs.push_back(spec("W_3", WeightMatrix::gate, d, hidden));
  return specs;
}

BranchCost ffn_cost(const ModelConfig& config) {
  const double d = config.width, t = config.seq, hidden = config.ffn_hidden();
  const double matrices = ffn_weight_count(block_ops(config).ffn);
  BranchCost cost;
  cost.forward_flops = 2 * t * d * hidden * matrices;
  cost.probe_scalars = 2 * matrices * t * hidden;  // the hidden activations' cotangents
  return cost;
}
}  // namespace

BranchOpRow ffn_op_row() {
  return {.name = "ffn",
          .serves = [](SublayerKind kind,
                       const BlockOps& ops) { return kind == SublayerKind::ffn && ops.ffn_op == "ffn"; },
          .ffn_words = {{"gelu", FfnKind::gelu, "gelu (GELU MLP)"},
                        {"swiglu", FfnKind::swiglu, "swiglu (gated, SiLU; a third matrix W_3)"},
                        {"geglu", FfnKind::geglu, "geglu (gated, GELU; a third matrix W_3)"},
                        {"gelu_tanh", FfnKind::gelu_tanh, "gelu_tanh (GELU MLP, tanh approximation: GPT-2)"},
                        {"geglu_tanh", FfnKind::geglu_tanh, "geglu_tanh (gated, tanh GELU: Gemma)"}},
          .weights = ffn_weights,
          .cost = ffn_cost,
          .make_float = [] { return std::unique_ptr<BranchOp<float>>(new FfnOp<float>); },
          .make_double = [] { return std::unique_ptr<BranchOp<double>>(new FfnOp<double>); }};
}

template <typename Scalar>
void rotation_forward(const Mat<Scalar>& x, Mat<Scalar>& out) {
  out.resize(x.rows(), x.cols());
  for (Eigen::Index c = 0; c + 1 < x.cols(); c += 2) {  // (a, b) -> (-b, a)
    out.col(c) = -x.col(c + 1);
    out.col(c + 1) = x.col(c);
  }
}

template <typename Scalar>
void rotation_backward(const Mat<Scalar>& d_out, Mat<Scalar>& dx) {
  for (Eigen::Index c = 0; c + 1 < d_out.cols(); c += 2) {  // transpose of the rotation
    dx.col(c) += d_out.col(c + 1);
    dx.col(c + 1) -= d_out.col(c);
  }
}

#define GRADFLOW_INSTANTIATE_FFN(Scalar)                                                                     \
  template void gelu_forward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&, bool);                                \
  template void gelu_backward<Scalar>(const Mat<Scalar>&, const Mat<Scalar>&, Mat<Scalar>&, bool);           \
  template void ffn_forward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&, const FfnOptions&,   \
                                    FfnCache<Scalar>&, Mat<Scalar>&, WorkPool*, bool);                       \
  template void ffn_backward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&, const FfnOptions&,  \
                                     FfnCache<Scalar>&, const Mat<Scalar>&, Mat<Scalar>*, ParamGradSquares*, \
                                     WorkPool*, std::vector<double>*);                                       \
  template void lower_gram<Scalar>(const Eigen::Ref<const Mat<Scalar>>&, Mat<Scalar>&);                      \
  template double symmetric_inner<Scalar>(const Mat<Scalar>&, const Mat<Scalar>&);                           \
  template void shared_input_gram<Scalar>(int, const Mat<Scalar>&, const Mat<Scalar>&,                       \
                                          std::vector<Mat<Scalar>>&);                                        \
  template void ffn_jvp<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&, const FfnOptions&,       \
                                FfnCache<Scalar>&, const Mat<Scalar>&, Mat<Scalar>&,                         \
                                const SublayerWeights<Scalar>*);                                             \
  template void ffn_weight_gradients<Scalar>(const Mat<Scalar>&, const FfnOptions&, const FfnCache<Scalar>&, \
                                             const Mat<Scalar>&, SublayerWeights<Scalar>&, bool, WorkPool*); \
  template void rotation_forward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&);                                  \
  template void rotation_backward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&);
GRADFLOW_INSTANTIATE_FFN(float)
GRADFLOW_INSTANTIATE_FFN(double)

}  // namespace gradflow
