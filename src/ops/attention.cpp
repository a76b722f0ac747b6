// Causal multi-head attention with optional q/k/v normalisation, forward and backward.
#include <cmath>
#include <limits>

#include "gradflow/ops.hpp"

namespace gradflow {

namespace {
// Applies the option's normalisation to one projection (or copies it through).
template <typename Scalar>
void normalize_projection(const AttentionOptions& options, bool is_value, const Mat<Scalar>& raw,
                          Mat<Scalar>& out, Mat<Scalar>& inv) {
  switch (options.qkv_norm) {
    case QkvNorm::per_head_qkv:
      norm_forward(options.norm, options.heads, raw, out, inv);
      return;
    case QkvNorm::full_qk:
      if (!is_value) return norm_forward(options.norm, 1, raw, out, inv);
      break;
    case QkvNorm::per_head_qk_unit:
      if (!is_value) return unit_rows_forward(options.heads, raw, out, inv);
      break;
    case QkvNorm::none:
      break;
  }
  out = raw;
}

// d_raw = (d normalisation)^T d_out, or d_out itself when the projection is not normalised.
template <typename Scalar>
const Mat<Scalar>& projection_backward(const AttentionOptions& options, bool is_value,
                                       const Mat<Scalar>& normed, const Mat<Scalar>& inv,
                                       const Mat<Scalar>& d_out, Mat<Scalar>& d_raw) {
  const bool normalised =
      options.qkv_norm == QkvNorm::per_head_qkv || (!is_value && options.qkv_norm != QkvNorm::none);
  if (!normalised) return d_out;
  d_raw.setZero(d_out.rows(), d_out.cols());
  if (options.qkv_norm == QkvNorm::per_head_qk_unit) {
    unit_rows_backward(options.heads, normed, inv, d_out, d_raw);
  } else {
    const int groups = options.qkv_norm == QkvNorm::full_qk ? 1 : options.heads;
    norm_backward(options.norm, groups, normed, inv, d_out, d_raw);
  }
  return d_raw;
}
}  // namespace

template <typename Scalar>
void attention_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                       const AttentionOptions& options, AttentionCache<Scalar>& cache, Mat<Scalar>& out) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  cache.q_raw.noalias() = x * w.w_q;  // (T, d)
  cache.k_raw.noalias() = x * w.w_k;
  cache.v_raw.noalias() = x * w.w_v;
  normalize_projection(options, false, cache.q_raw, cache.q, cache.q_inv);
  normalize_projection(options, false, cache.k_raw, cache.k, cache.k_inv);
  normalize_projection(options, true, cache.v_raw, cache.v, cache.v_inv);

  cache.probs.resize(options.heads);
  cache.context.resize(tokens, width);
  for (int h = 0; h < options.heads; ++h) {
    Mat<Scalar>& probs = cache.probs[h];  // (T, T), zero above the diagonal (causal mask)
    probs.noalias() =
        cache.q.middleCols(h * head_dim, head_dim) * cache.k.middleCols(h * head_dim, head_dim).transpose();
    for (Eigen::Index i = 0; i < tokens; ++i) {
      auto row = probs.row(i);
      auto visible = row.head(i + 1);
      visible *= scale;
      const Scalar max_score = visible.maxCoeff();
      visible = (visible.array() - max_score).exp().matrix();
      visible /= visible.sum();
      row.tail(tokens - i - 1).setZero();
    }
    cache.context.middleCols(h * head_dim, head_dim).noalias() =
        probs * cache.v.middleCols(h * head_dim, head_dim);
  }
  out.noalias() = cache.context * w.w_o;  // (T, d)
}

template <typename Scalar>
void attention_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                        const AttentionOptions& options, AttentionCache<Scalar>& cache,
                        const Mat<Scalar>& d_out, Mat<Scalar>& dx, ParamGradSquares* param_grads) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const Eigen::Index probes = d_out.rows() / tokens;
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  cache.d_context.noalias() = d_out * w.w_o.transpose();  // (K*T, d)
  cache.d_q.setZero(d_out.rows(), width);
  cache.d_k.setZero(d_out.rows(), width);
  cache.d_v.setZero(d_out.rows(), width);
  for (Eigen::Index k = 0; k < probes; ++k) {
    for (int h = 0; h < options.heads; ++h) {
      const Mat<Scalar>& probs = cache.probs[h];
      const auto d_context = cache.d_context.block(k * tokens, h * head_dim, tokens, head_dim);
      cache.d_probs.noalias() = d_context * cache.v.middleCols(h * head_dim, head_dim).transpose();  // (T, T)
      cache.d_v.block(k * tokens, h * head_dim, tokens, head_dim).noalias() += probs.transpose() * d_context;
      // softmax backward: dS = P (dP - rowsum(dP P)); masked entries have P = 0.
      const Vec<Scalar> row_dot = (cache.d_probs.array() * probs.array()).rowwise().sum();
      cache.d_scores = (probs.array() * (cache.d_probs.colwise() - row_dot).array()) * scale;
      cache.d_q.block(k * tokens, h * head_dim, tokens, head_dim).noalias() +=
          cache.d_scores * cache.k.middleCols(h * head_dim, head_dim);
      cache.d_k.block(k * tokens, h * head_dim, tokens, head_dim).noalias() +=
          cache.d_scores.transpose() * cache.q.middleCols(h * head_dim, head_dim);
    }
  }
  if (param_grads) param_grads->assign(probes, 0.0);
  Mat<Scalar> x_gram;  // W_Q, W_K and W_V share their input x
  if (param_grads) x_gram.noalias() = x * x.transpose();
  const auto add_param_grad = [&](const Mat<Scalar>& input_gram, const Mat<Scalar>& d_output) {
    if (!param_grads) return;
    for (Eigen::Index k = 0; k < probes; ++k) {
      (*param_grads)[k] +=
          weight_grad_squared_norm<Scalar>(input_gram, d_output.middleRows(k * tokens, tokens));
    }
  };
  if (param_grads) add_param_grad(cache.context * cache.context.transpose(), d_out);
  const auto& d_q_raw = projection_backward(options, false, cache.q, cache.q_inv, cache.d_q, cache.d_raw);
  dx.noalias() += d_q_raw * w.w_q.transpose();
  add_param_grad(x_gram, d_q_raw);
  const auto& d_k_raw = projection_backward(options, false, cache.k, cache.k_inv, cache.d_k, cache.d_raw);
  dx.noalias() += d_k_raw * w.w_k.transpose();
  add_param_grad(x_gram, d_k_raw);
  const auto& d_v_raw = projection_backward(options, true, cache.v, cache.v_inv, cache.d_v, cache.d_raw);
  dx.noalias() += d_v_raw * w.w_v.transpose();
  add_param_grad(x_gram, d_v_raw);
}

template <typename Scalar>
void attention_jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const AttentionOptions& options,
                   AttentionCache<Scalar>& cache, const Mat<Scalar>& d_x, Mat<Scalar>& d_out) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const Eigen::Index probes = d_x.rows() / tokens;
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  // Every norm Jacobian here is symmetric (rms, layer, dyt, unit rows), so its backward is its JVP.
  Mat<Scalar> d_q_raw = d_x * w.w_q, d_k_raw = d_x * w.w_k, d_v_raw = d_x * w.w_v;  // (P*T, d)
  const Mat<Scalar> d_q = projection_backward(options, false, cache.q, cache.q_inv, d_q_raw, cache.d_raw);
  const Mat<Scalar> d_k = projection_backward(options, false, cache.k, cache.k_inv, d_k_raw, cache.d_raw);
  const Mat<Scalar> d_v = projection_backward(options, true, cache.v, cache.v_inv, d_v_raw, cache.d_raw);
  cache.d_context.setZero(d_x.rows(), width);
  for (Eigen::Index k = 0; k < probes; ++k) {
    for (int h = 0; h < options.heads; ++h) {
      const Mat<Scalar>& probs = cache.probs[h];  // (T, T)
      const auto q = cache.q.middleCols(h * head_dim, head_dim);
      const auto key = cache.k.middleCols(h * head_dim, head_dim);
      const auto v = cache.v.middleCols(h * head_dim, head_dim);
      const auto dq = d_q.block(k * tokens, h * head_dim, tokens, head_dim);
      const auto dk = d_k.block(k * tokens, h * head_dim, tokens, head_dim);
      const auto dv = d_v.block(k * tokens, h * head_dim, tokens, head_dim);
      cache.d_scores.noalias() = (dq * key.transpose() + q * dk.transpose()) * scale;  // (T, T)
      // softmax JVP: dP = P (dS - rowsum(P dS)); masked entries have P = 0.
      const Vec<Scalar> row_dot = (cache.d_scores.array() * probs.array()).rowwise().sum();
      cache.d_probs = probs.array() * (cache.d_scores.colwise() - row_dot).array();
      cache.d_context.block(k * tokens, h * head_dim, tokens, head_dim).noalias() =
          cache.d_probs * v + probs * dv;
    }
  }
  d_out.noalias() = cache.d_context * w.w_o;  // (P*T, d)
}

#define GRADFLOW_INSTANTIATE_ATTENTION(Scalar)                                                              \
  template void attention_forward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,               \
                                          const AttentionOptions&, AttentionCache<Scalar>&, Mat<Scalar>&);  \
  template void attention_backward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,              \
                                           const AttentionOptions&, AttentionCache<Scalar>&,                \
                                           const Mat<Scalar>&, Mat<Scalar>&, ParamGradSquares*);            \
  template void attention_jvp<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,                   \
                                      const AttentionOptions&, AttentionCache<Scalar>&, const Mat<Scalar>&, \
                                      Mat<Scalar>&);
GRADFLOW_INSTANTIATE_ATTENTION(float)
GRADFLOW_INSTANTIATE_ATTENTION(double)

}  // namespace gradflow
