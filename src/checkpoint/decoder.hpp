// The decoder layers of the Hugging Face families (checkpoint.hpp), as forward/backward pairs over
// one sequence of T tokens: the embedding, each sublayer (attention or MLP, with the family's
// norms, biases, rotary embeddings, soft-capping and sliding windows) and the LM head's loss.
// Weights keep nn.Linear's layout (out, in): y = x W^T + b. Internal to src/checkpoint/.
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "gradflow/checkpoint.hpp"
#include "gradflow/ops.hpp"

namespace gradflow::checkpoint {

// A norm's parameters: y = n(x) * gain + bias (gain already 1 + w for Gemma-2; bias LayerNorm's).
template <typename Scalar>
struct NormParams {
  Vec<Scalar> gain, bias;  // (n); bias empty for RMSNorm
  bool present() const { return gain.size() > 0; }
};

// One sublayer's parameters: layer l / 2's attention (even l) or MLP (odd l).
template <typename Scalar>
struct SublayerParams {
  SublayerKind kind = SublayerKind::attn;
  int layer = 0;
  NormParams<Scalar> input_norm, output_norm;  // before the branch; on its output before the add
  // attention: (q_width, d), (kv_width, d), (kv_width, d), (d, q_width)
  Mat<Scalar> w_q, w_k, w_v, w_o;
  Vec<Scalar> b_q, b_k, b_v, b_o;
  NormParams<Scalar> q_norm, k_norm;  // OLMo-2: over the whole projections
  // MLP: gate and up (h, d), down (d, h); GPT-2 has no gate (up = c_fc^T, down = c_proj^T)
  Mat<Scalar> w_gate, w_up, w_down;
  Vec<Scalar> b_gate, b_up, b_down;
};

// Gradients of one sublayer's matrices (the same layout), and the squared Frobenius norm of them all.
template <typename Scalar>
struct SublayerGradients {
  Mat<Scalar> w_q, w_k, w_v, w_o, w_gate, w_up, w_down;
  double squared_norm = 0.0;
};

// What one sublayer's forward keeps for its backward.
template <typename Scalar>
struct SublayerCache {
  Mat<Scalar> h, input_n, output_n, branch;  // normed input; both norms' n(x); the branch output
  Vec<Scalar> input_inv, output_inv;         // the norms' 1 / sqrt(. + eps) per token
  Mat<Scalar> q_lin, k_lin, q_n, k_n;        // attention: projections before the q/k norm, n(.)
  Vec<Scalar> q_inv, k_inv;
  Mat<Scalar> q, k, v, context;  // after the norm and the rotation; the heads' outputs
  std::vector<Mat<Scalar>> probs, capped;  // per head (T, T): softmax; tanh(scores / cap) when soft-capped
  Mat<Scalar> gate_pre, up, activated, hidden;  // MLP: x W_gate^T, x W_up^T, act(gate_pre), the product
  Mat<Scalar> update;                           // what the sublayer adds to the stream
};

// Reads sublayer l's parameters (the family's names and layouts) from the store, then releases them.
template <typename Scalar>
void load_sublayer(const HfModelSpec& spec, const TensorStore& store, int sublayer, SublayerParams<Scalar>& params);

// Rotary cosines and sines (T, rotary_dims / 2), angles in double, inv_freq as the family's
// rope_scaling computes it.
template <typename Scalar>
struct Rotary {
  Mat<Scalar> cos, sin;
};
template <typename Scalar>
Rotary<Scalar> rotary_tables(const HfModelSpec& spec, int tokens);

// x_out = x_in + update (the residual add of sublayer l).
template <typename Scalar>
void sublayer_forward(const HfModelSpec& spec, const Rotary<Scalar>& rotary, const SublayerParams<Scalar>& params,
                      const Mat<Scalar>& x_in, SublayerCache<Scalar>& cache, Mat<Scalar>& x_out);
// After sublayer_forward: d_in = d_out + J_branch^T d_out; d_branch (when given) receives the
// branch's part J_branch^T d_out alone; gradients (when given) the matrices' gradients
// (`form_matrices`: in full; else only their squared norm).
template <typename Scalar>
void sublayer_backward(const HfModelSpec& spec, const Rotary<Scalar>& rotary, const SublayerParams<Scalar>& params,
                       SublayerCache<Scalar>& cache, const Mat<Scalar>& d_out, Mat<Scalar>& d_in,
                       Mat<Scalar>* d_branch, SublayerGradients<Scalar>* gradients, bool form_matrices);

// x_0: token embedding rows (+ GPT-2's positions), times Gemma-2's sqrt(hidden).
template <typename Scalar>
Mat<Scalar> embed(const HfModelSpec& spec, const TensorStore& store, const std::vector<std::int64_t>& tokens);

// The head: y = final_norm(x_S); lm: L = mean_t<T-1 CE(logits_t, id_t+1), logits = y E^T (soft-
// capped for Gemma-2), the head's matrix read in chunks of rows; probe: L = sum(U * y).
// Returns L; d_x (when given) receives dL/dx_S, y_out (when given) y.
template <typename Scalar>
double head_loss(const HfModelSpec& spec, const TensorStore& store, LossKind loss, const Mat<Scalar>& probe,
                 const std::vector<std::int64_t>& tokens, const Mat<Scalar>& x, Mat<Scalar>* d_x, Mat<Scalar>* y_out);

}  // namespace gradflow::checkpoint
