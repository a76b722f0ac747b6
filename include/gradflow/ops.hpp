// Numerical ops as forward/backward pairs (llm.c style). Pure functions: no I/O, no globals.
//
// Shapes: T tokens, n features. Forward inputs are one sequence, (T, n). Backward cotangents
// carry K probes stacked as K blocks of T rows, (K*T, n); row r of a cotangent pairs with row
// r % T of the saved forward values. Every backward ADDS into its input cotangent (dx += ...),
// so several consumers of one value can accumulate into the same buffer.
#pragma once
#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "gradflow/config.hpp"
#include "gradflow/work_pool.hpp"

namespace gradflow {

template <typename Scalar>
using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Scalar>
using Vec = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

// ---------------------------------------------------------------------------------------------
// Normalisation over groups of `n / groups` consecutive columns of each row (groups = 1: the
// whole token; groups = heads: per-head q/k/v norm). gamma = 1 and no bias, as at init.
//   rms:   y = x / sqrt(mean(x^2) + eps)                      (Zhang & Sennrich 2019, arXiv 1910.07467)
//   layer: y = (x - mean) / sqrt(var + eps)                   (Ba et al. 2016, arXiv 1607.06450)
//   dyt:   y = tanh(alpha x), alpha = kDytAlpha               (Zhu et al. 2025, arXiv 2503.10622)
// inv_scale (T, groups) holds 1 / sqrt(. + eps); unused by dyt.
template <typename Scalar>
void norm_forward(NormKind kind, int groups, const Mat<Scalar>& x, Mat<Scalar>& y, Mat<Scalar>& inv_scale,
                  double eps = kNormEps);
template <typename Scalar>
void norm_backward(NormKind kind, int groups, const Mat<Scalar>& y, const Mat<Scalar>& inv_scale,
                   const Mat<Scalar>& dy, Mat<Scalar>& dx);

// Unit-normalise each row: y = x / max(norm(x), kUnitFloor) (nGPT's Norm, arXiv 2410.01131 Eq. 1).
inline constexpr double kUnitFloor = 1e-12;  // torch.nn.functional.normalize's clamp
template <typename Scalar>
void unit_rows_forward(int groups, const Mat<Scalar>& x, Mat<Scalar>& y, Mat<Scalar>& inv_norm);
template <typename Scalar>
void unit_rows_backward(int groups, const Mat<Scalar>& y, const Mat<Scalar>& inv_norm, const Mat<Scalar>& dy,
                        Mat<Scalar>& dx);

// ---------------------------------------------------------------------------------------------
// A fixed linear map of the m width fractions of each row (Frac-Connections, Zhu et al. 2025,
// arXiv 2503.14125, Eq. 4-5: H = Reshape(h, (m, d/m)), then fixed mixing of the fractions):
//   y[:, f w : (f+1) w] = sum_g weights[f m + g] x[:, g w : (g+1) w],   w = n / m,
// each output fraction summing its inputs in increasing g and skipping zero weights.
// x (rows, n), y (rows, n); weights m x m, row-major by output fraction. The map is linear, so its
// JVP is the forward applied to the tangent; the backward adds the transpose:
//   dx[:, g w : (g+1) w] += sum_f weights[f m + g] dy[:, f w : (f+1) w].
template <typename Scalar>
void mix_fractions_forward(int fractions, const std::vector<double>& weights, const Mat<Scalar>& x,
                           Mat<Scalar>& y);
template <typename Scalar>
void mix_fractions_backward(int fractions, const std::vector<double>& weights, const Mat<Scalar>& dy,
                            Mat<Scalar>& dx);

// ---------------------------------------------------------------------------------------------
// GELU, erf form: gelu(x) = x Phi(x) (Hendrycks & Gimpel 2016, arXiv 1606.08415); with tanh_form,
// its tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (ibid., Sec. 2; GPT-2's
// and Gemma's). The backward adds dy * gelu'(x) into dx; dy may hold K probes of x's rows.
template <typename Scalar>
void gelu_forward(const Mat<Scalar>& x, Mat<Scalar>& y, bool tanh_form = false);
template <typename Scalar>
void gelu_backward(const Mat<Scalar>& x, const Mat<Scalar>& dy, Mat<Scalar>& dx, bool tanh_form = false);

// SiLU (Swish-1): silu(x) = x sigmoid(x) (Elfwing et al. 2018, arXiv 1702.03118; Ramachandran et
// al. 2017, arXiv 1710.05941), SwiGLU's gate activation.
template <typename Scalar>
void silu_forward(const Mat<Scalar>& x, Mat<Scalar>& y);
template <typename Scalar>
void silu_backward(const Mat<Scalar>& x, const Mat<Scalar>& dy, Mat<Scalar>& dx);

// ---------------------------------------------------------------------------------------------
// Rotary position embeddings (Su et al. 2021, RoFormer, arXiv 2104.09864, Eq. 34), in the
// half-split layout of GPT-NeoX and HF's rotate_half: within each head's first `rotary_dims`
// dims, the pair (i, i + rotary_dims/2) of the token at position p is rotated by the angle
// p theta^(-2i/rotary_dims). The remaining dims of a head pass through (partial rotary).
// Rotary frequencies rescaled for contexts longer than the training's (transformers/
// modeling_rope_utils.py): linear divides every frequency by `factor`
// (_compute_linear_scaling_rope_parameters); llama3 (_compute_llama3_parameters, Llama 3.1 and
// later) keeps the frequencies whose wavelength is below original_max_positions / high_freq_factor,
// divides those above original_max_positions / low_freq_factor by `factor`, and between the two
// interpolates by s = (original_max_positions / wavelength - low) / (high - low).
enum class RopeScaling { none, linear, llama3 };
struct RopeFrequencies {
  RopeScaling scaling = RopeScaling::none;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_positions = 8192;
};
// Pair i's frequency theta^(-2i/rotary_dims), rescaled as `scaling` says.
double rotary_frequency(int pair, int rotary_dims, double theta, const RopeFrequencies& scaling);

template <typename Scalar>
struct RotaryTable {
  Mat<Scalar> cos, sin;  // (T, rotary_dims / 2)
  int rotary_dims = 0;
};
// The table for positions first_position .. first_position + tokens - 1 (angles in double).
template <typename Scalar>
void rotary_table(int tokens, int rotary_dims, double theta, int first_position, RotaryTable<Scalar>& table,
                  const RopeFrequencies& scaling = {});
// Rotates x (rows K*T, `heads` heads) in place; row r is at position r % T. inverse = true
// rotates by minus the angle: the transpose, i.e. the backward (and the JVP is the forward).
template <typename Scalar>
void rotary_apply(const RotaryTable<Scalar>& table, int heads, bool inverse, Mat<Scalar>& x);

// ---------------------------------------------------------------------------------------------
// What a weight matrix is, for base init's rule, a placement's init gain and step_rel's kind
// (kMatrixKinds' order). gate: W_3 of swiglu / geglu, drawn like up.
enum class WeightMatrix { q, k, v, o, up, down, gate };

// Weights of one sublayer's branch op, y = x W + b with W (d_in, d_out), in the order of the op's
// weight list (branch_op.hpp, BranchOpRow::weights): attention's AttentionWeight, the FFN's
// FfnWeight. The biases follow the same order and are empty without --bias (zero at init, as HF's
// nn.Linear biases under _init_weights).
template <typename Scalar>
struct SublayerWeights {
  std::vector<Mat<Scalar>> matrices;
  std::vector<Vec<Scalar>> biases;
  bool has_bias() const { return !biases.empty() && biases.front().size() > 0; }
  // Bias i, or an empty vector when the list has none.
  const Vec<Scalar>& bias(std::size_t i) const {
    static const Vec<Scalar> none;
    return i < biases.size() ? biases[i] : none;
  }
  // Sizes the lists for `count` weights, keeping the buffers already there.
  void resize(std::size_t count) {
    matrices.resize(count);
    biases.resize(count);
  }
};
// Attention's weights: W_Q, W_O (d, d); W_K, W_V (d, kv_heads * head_dim).
enum AttentionWeight : int { kWeightQ, kWeightK, kWeightV, kWeightO, kAttentionWeights };
// The FFN's: W_1 up (d, hidden), W_2 down (hidden, d), and a gated FFN's W_3 gate (d, hidden).
enum FfnWeight : int { kWeightUp, kWeightDown, kWeightGate };
inline int ffn_weight_count(FfnKind kind) {
  return ffn_gated(kind) ? 3 : 2;
}

// Squared Frobenius norms of dL/dW summed over the sublayer's matrices, one entry per probe.
using ParamGradSquares = std::vector<double>;

// ||X^T dY||_F^2 for dW = X^T dY without forming dW: <X X^T, dY dY^T>_F, with (T, T) Gram
// matrices, 4-16x fewer FLOPs than the product at T = 64. lower_gram forms at least the lower
// triangle of rows rows^T (in float on AVX-512 the tiled kernel's tiles that reach it, elsewhere
// a symmetric rank-k update, half a GEMM); symmetric_inner is <A, B>_F of two
// symmetric matrices from their lower triangles. W_Q, W_K and W_V share their input's Gram.
template <typename Scalar>
void lower_gram(const Eigen::Ref<const Mat<Scalar>>& rows, Mat<Scalar>& gram);
template <typename Scalar>
double symmetric_inner(const Mat<Scalar>& a, const Mat<Scalar>& b);

// The Grams that several pieces of a backward read: item 0 the input x's, item 1 + k probe k's
// d_out's. Each is one piece of the backward's first run (so they are formed once, in parallel),
// and complete for every piece of the next run.
template <typename Scalar>
void shared_input_gram(int item, const Mat<Scalar>& x, const Mat<Scalar>& d_out,
                       std::vector<Mat<Scalar>>& grams);

// The ops below take an optional WorkPool (work_pool.hpp) and split their work into pieces fixed
// by the shapes alone: attention heads, and blocks of this many hidden units or output columns
// (the last block may be narrower). Per-piece partial sums are added in piece order.
inline constexpr Eigen::Index kFeatureBlock = 128;
struct FeatureBlock {
  Eigen::Index begin, size;
};
inline int feature_blocks(Eigen::Index features) {
  return static_cast<int>((features + kFeatureBlock - 1) / kFeatureBlock);
}
inline FeatureBlock feature_block(Eigen::Index features, int block) {
  const Eigen::Index begin = block * kFeatureBlock;
  return {begin, std::min(kFeatureBlock, features - begin)};
}

// Each piece's per-probe partial sums of one op (parameter-gradient squares, <d_out, out>), added
// in piece order: the same bits whichever thread ran which piece.
struct PiecePartials {
  std::vector<std::vector<double>> parts;  // [piece][probe]
  void reset(int pieces, Eigen::Index probes) {
    parts.resize(pieces);
    for (auto& part : parts) part.assign(probes, 0.0);
  }
  // sums[k] = sum over pieces, in order, of parts[piece][k]; sums resized to the probe count.
  void sum_into(std::vector<double>& sums) const {
    const std::size_t probes = parts.empty() ? 0 : parts.front().size();
    sums.assign(probes, 0.0);
    for (const auto& part : parts)
      for (std::size_t k = 0; k < probes; ++k) sums[k] += part[k];
  }
};

// ---------------------------------------------------------------------------------------------
// Causal multi-head attention (Vaswani et al. 2017, arXiv 1706.03762, Eq. 1):
//   out = concat_h softmax(mask(Q_h K_h^T * score_scale)) V_h  W_O,   Q = x W_Q, K = x W_K, V = x W_V,
// with optional normalisation of q/k/v after the projection.
enum class QkvNorm {
  none,
  per_head_qkv,     // HybridNorm: N on each head's q, k and v (Zhuo et al. 2025, arXiv 2503.04598, Eq. 5)
  full_qk,          // OLMo 2: N over the full q and k (arXiv 2501.00656, Sec. 3.3)
  per_head_qk_unit  // nGPT: unit-normalised q and k per head (arXiv 2410.01131, Eq. 15-16)
};
// Grouped-query attention (Ainslie et al. 2023, arXiv 2305.13245): K and V have kv_heads heads,
// each shared by heads / kv_heads consecutive query heads (HF's repeat_kv). Rotary embeddings
// rotate q and k after the projection and after any q/k norm (HF Llama, Qwen3, OLMo 2).
struct AttentionOptions {
  int heads = 1;
  NormKind norm = NormKind::rms;  // the kind used by per_head_qkv and full_qk
  QkvNorm qkv_norm = QkvNorm::none;
  double score_scale = 1.0;  // 1/sqrt(d_h) usually; sqrt(d_h) for nGPT
  int kv_heads = 0;          // 0: = heads
  double norm_eps = kNormEps;
  double rope_theta = 0.0;  // 0: no rotary embedding
  int rotary_dims = 0;      // dims rotated per head (even)
  RopeFrequencies rope_scaling{};
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
};
template <typename Scalar>
struct AttentionCache {                  // what the forward saves for the backward, plus backward scratch
  Mat<Scalar> q_raw, k_raw, v_raw;       // (T, d) scratch: projections before any q/k/v norm
  Mat<Scalar> q, k, v;                   // (T, d) after it (and after rotary embeddings); k, v (T, kv width)
  Mat<Scalar> q_unrotated, k_unrotated;  // (T, .) q and k before rotary embeddings, when used
  RotaryTable<Scalar> rotary;
  Mat<Scalar> q_inv, k_inv, v_inv;              // norm statistics
  std::vector<Mat<Scalar>> probs;               // heads x (T, T) softmax outputs
  Mat<Scalar> context;                          // (T, d) concatenated head outputs
  Mat<Scalar> d_context, d_q, d_k, d_v, d_raw;  // (K*T, d) scratch
  Mat<Scalar> d_q_raw, d_k_raw, d_v_raw;        // (K*T, d) scratch of the normalised projections
  Mat<Scalar> d_k_shared, d_v_shared;           // (K*T, kv width) grouped-query sums over each group
  Mat<Scalar> d_input;                          // (K*T, d) the input's cotangent, before dx +=
  Mat<Scalar> d_probs, d_scores;                // (T, T) scratch of the JVP
  std::vector<Mat<Scalar>> shared_grams;        // shared_input_gram: x's, then d_out's per probe
  PiecePartials head_squares, projection_squares, output_dots;  // per-piece partial sums
};
// with_output = false stops before the output projection (out is left untouched): the backward
// needs only the cached activations, and then output_dots gives <d_out_k, out> per probe.
template <typename Scalar>
void attention_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                       const AttentionOptions& options, AttentionCache<Scalar>& cache, Mat<Scalar>& out,
                       WorkPool* pool = nullptr, bool with_output = true);
// dx += the input's cotangent; dx = nullptr stops at the weights' cotangents (dQ, dK, dV and
// d_out, for attention_weight_gradients) and skips dx's three products, as --update needs;
// param_grads and output_dots must then be null.
// param_grads, when given, receives each probe's squared norm of dL/d{W_Q, W_K, W_V, W_O}.
template <typename Scalar>
void attention_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                        const AttentionOptions& options, AttentionCache<Scalar>& cache,
                        const Mat<Scalar>& d_out, Mat<Scalar>* dx, ParamGradSquares* param_grads = nullptr,
                        WorkPool* pool = nullptr, std::vector<double>* output_dots = nullptr);

// Jacobian-vector product (forward mode) after attention_forward: d_out = J d_x for P tangents
// stacked as P blocks of T rows, (P*T, d). Used by --spectrum, which needs J as well as J^T.
// d_w, when given, adds the weights' tangent (P = 1): each product Y = X W + b gains X dW + db.
template <typename Scalar>
void attention_jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const AttentionOptions& options,
                   AttentionCache<Scalar>& cache, const Mat<Scalar>& d_x, Mat<Scalar>& d_out,
                   const SublayerWeights<Scalar>* d_w = nullptr);
// After attention_backward of one probe's d_out (T rows): dL/dW = X^T dY for each product
// Y = X W (W_Q, W_K, W_V from x, W_O from the context), formed in full (--update), each product
// one piece; with `bias`, dL/db = 1^T dY as well (b_q, b_k, b_v, b_o), else the biases are empty.
template <typename Scalar>
void attention_weight_gradients(const Mat<Scalar>& x, const AttentionOptions& options,
                                const AttentionCache<Scalar>& cache, const Mat<Scalar>& d_out,
                                SublayerWeights<Scalar>& gradients, bool bias, WorkPool* pool = nullptr);

// ---------------------------------------------------------------------------------------------
// Feed-forward: out = gelu(s x W_1) W_2 (Vaswani et al. 2017, Eq. 2), or gated (Shazeer 2020,
// arXiv 2002.05202, Eq. 5-6): out = (act(s x W_1) * (s x W_3)) W_2 with act = SiLU (SwiGLU) or
// GELU (GeGLU); s = hidden_scale on the hidden pre-activations (1 usually; nGPT's s_uv = sqrt(d)
// at init). With biases, x W + b in place of each x W.
struct FfnOptions {
  double hidden_scale = 1.0;  // nGPT: NVIDIA/ngpt model.py, Block.forward, `uv = suv * uv`
  FfnKind kind = FfnKind::gelu;
};
template <typename Scalar>
struct FfnCache {
  Mat<Scalar> hidden_pre;                 // (T, hidden) s x W_1
  Mat<Scalar> hidden;                     // (T, hidden) gelu(s x W_1), or act(.) * gate
  Mat<Scalar> gate_pre, activated;        // gated only: (T, hidden) s x W_3 and act(s x W_1)
  Mat<Scalar> gate_slope;                 // gated only: (T, hidden) act'(s x W_1) * gate
  Mat<Scalar> d_gate_pre;                 // gated only: (K*T, hidden) scratch
  Mat<Scalar> d_hidden, d_hidden_pre;     // (K*T, hidden) scratch
  Mat<Scalar> d_input;                    // (K*T, d) the input's cotangent, before dx +=
  std::vector<Mat<Scalar>> shared_grams;  // shared_input_gram: x's, then d_out's per probe
  PiecePartials squares, output_dots;     // per-piece partial sums
};
// with_output and output_dots as for attention: <d_out_k, out> = <d_out_k W_2^T, gelu(s x W_1)>.
template <typename Scalar>
void ffn_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const FfnOptions& options,
                 FfnCache<Scalar>& cache, Mat<Scalar>& out, WorkPool* pool = nullptr,
                 bool with_output = true);
// dx += the input's cotangent; dx = nullptr stops at dL/d(x W_1) (and d(x W_3)), as for attention_backward.
// param_grads, when given, receives each probe's squared norm of dL/d{W_1, W_2}.
template <typename Scalar>
void ffn_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const FfnOptions& options,
                  FfnCache<Scalar>& cache, const Mat<Scalar>& d_out, Mat<Scalar>* dx,
                  ParamGradSquares* param_grads = nullptr, WorkPool* pool = nullptr,
                  std::vector<double>* output_dots = nullptr);

// Forward mode after ffn_forward: d_out = J d_x, tangents (P*T, d); d_w as for attention_jvp.
template <typename Scalar>
void ffn_jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const FfnOptions& options,
             FfnCache<Scalar>& cache, const Mat<Scalar>& d_x, Mat<Scalar>& d_out,
             const SublayerWeights<Scalar>* d_w = nullptr);
// After ffn_backward of one probe's d_out: dL/dW_2 = H^T dY, dL/dW_1 = x^T dL/d(x W_1), and for a
// gated FFN dL/dW_3 = x^T dL/d(x W_3) (empty otherwise), each product one piece; with `bias`,
// dL/db = 1^T of the same cotangents (b_1, b_2, b_3), else the biases are empty.
template <typename Scalar>
void ffn_weight_gradients(const Mat<Scalar>& x, const FfnOptions& options, const FfnCache<Scalar>& cache,
                          const Mat<Scalar>& d_out, SublayerWeights<Scalar>& gradients, bool bias,
                          WorkPool* pool = nullptr);

// ---------------------------------------------------------------------------------------------
// The idealised branch: a fixed 90-degree rotation within coordinate pairs (2i, 2i+1), so that
// rotation(x) has x's norm and is orthogonal to it token by token. Needs an even width.
template <typename Scalar>
void rotation_forward(const Mat<Scalar>& x, Mat<Scalar>& out);
template <typename Scalar>
void rotation_backward(const Mat<Scalar>& d_out, Mat<Scalar>& dx);

}  // namespace gradflow
