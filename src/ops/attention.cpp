// Causal multi-head attention with optional q/k/v normalisation, forward and backward.
#include <cmath>
#include <limits>

#include "gradflow/gemm.hpp"
#include "gradflow/lane_sum.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

namespace {
// Applies the option's normalisation to one projection, or moves it through: raw is scratch, and
// an unnormalised projection swaps buffers with out instead of being copied.
// `heads`: the projection's heads (kv_heads for K and V under grouped-query attention).
template <typename Scalar>
void normalize_projection(const AttentionOptions& options, bool is_value, int heads, Mat<Scalar>& raw,
                          Mat<Scalar>& out, Mat<Scalar>& inv) {
  switch (options.qkv_norm) {
    case QkvNorm::per_head_qkv:
      norm_forward(options.norm, heads, raw, out, inv, options.norm_eps);
      return;
    case QkvNorm::full_qk:
      if (!is_value) return norm_forward(options.norm, 1, raw, out, inv, options.norm_eps);
      break;
    case QkvNorm::per_head_qk_unit:
      if (!is_value) return unit_rows_forward(heads, raw, out, inv);
      break;
    case QkvNorm::none:
      break;
  }
  out.swap(raw);
}

// d_raw = (d normalisation)^T d_out, or d_out itself when the projection is not normalised.
template <typename Scalar>
const Mat<Scalar>& projection_backward(const AttentionOptions& options, bool is_value, int heads,
                                       const Mat<Scalar>& normed, const Mat<Scalar>& inv,
                                       const Mat<Scalar>& d_out, Mat<Scalar>& d_raw) {
  const bool normalised =
      options.qkv_norm == QkvNorm::per_head_qkv || (!is_value && options.qkv_norm != QkvNorm::none);
  if (!normalised) return d_out;
  d_raw.setZero(d_out.rows(), d_out.cols());
  if (options.qkv_norm == QkvNorm::per_head_qk_unit) {
    unit_rows_backward(heads, normed, inv, d_out, d_raw);
  } else {
    const int groups = options.qkv_norm == QkvNorm::full_qk ? 1 : heads;
    norm_backward(options.norm, groups, normed, inv, d_out, d_raw);
  }
  return d_raw;
}

// Rotary embeddings on the normalised q and k (HF Llama/Qwen3/OLMo 2 order: norm, then rotate),
// keeping the unrotated values for the norms' backward.
template <typename Scalar>
void rotate_queries_and_keys(const AttentionOptions& options, Eigen::Index tokens,
                             AttentionCache<Scalar>& cache) {
  if (options.rotary_dims == 0) return;
  rotary_table(static_cast<int>(tokens), options.rotary_dims, options.rope_theta, 0, cache.rotary);
  cache.q_unrotated = cache.q;
  cache.k_unrotated = cache.k;
  rotary_apply(cache.rotary, options.heads, false, cache.q);
  rotary_apply(cache.rotary, options.kv_head_count(), false, cache.k);
}

// The normalised q or k, before any rotation: what the norms' backward reads.
template <typename Scalar>
const Mat<Scalar>& unrotated(const AttentionOptions& options, const Mat<Scalar>& rotated,
                             const Mat<Scalar>& saved) {
  return options.rotary_dims > 0 ? saved : rotated;
}

// Grouped-query attention's backward: each key/value head's gradient is the sum over the query
// heads that share it (the transpose of HF's repeat_kv), in a fixed order. Per-query-head
// gradients (K*T, d) in, (K*T, kv width) out; with kv_heads = heads the input itself.
template <typename Scalar>
Mat<Scalar>& sum_over_groups(const AttentionOptions& options, Eigen::Index head_dim,
                             Mat<Scalar>& per_query_head, Mat<Scalar>& shared) {
  const int kv_heads = options.kv_head_count(), group = options.heads / kv_heads;
  if (group == 1) return per_query_head;
  shared.resize(per_query_head.rows(), kv_heads * head_dim);
  for (int g = 0; g < kv_heads; ++g) {
    auto sum = shared.middleCols(g * head_dim, head_dim);
    sum = per_query_head.middleCols(g * group * head_dim, head_dim);
    for (int j = 1; j < group; ++j) sum += per_query_head.middleCols((g * group + j) * head_dim, head_dim);
  }
  return shared;
}

// The columns of head h's key and value: those of its key/value head h / (heads / kv_heads).
inline Eigen::Index kv_column(const AttentionOptions& options, Eigen::Index h, Eigen::Index head_dim) {
  return h / (options.heads / options.kv_head_count()) * head_dim;
}

// Adds b (a bias, empty without --bias) to each row of the given columns.
template <typename Scalar, typename Block>
void add_bias(const Vec<Scalar>& b, Eigen::Index begin, Block&& columns) {
  if (b.size() > 0) columns.rowwise() += b.segment(begin, columns.cols()).transpose();
}
}  // namespace

// Shard s owns heads [begin, end): their columns of W_Q, W_K, W_V and rows of W_O (Megatron-LM's
// split, arXiv 1909.08053 Sec. 3); with one head, shard 0 is empty.
inline ShardRange head_range(int heads, int shard) {
  return shard_range(heads, shard);
}

template <typename Scalar>
void attention_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                       const AttentionOptions& options, AttentionCache<Scalar>& cache, Mat<Scalar>& out,
                       ShardPair* shards, bool with_output) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const int kv_heads = options.kv_head_count();
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  for (Mat<Scalar>* m : {&cache.q_raw, &cache.context}) m->resize(tokens, width);
  for (Mat<Scalar>* m : {&cache.k_raw, &cache.v_raw}) m->resize(tokens, kv_heads * head_dim);
  cache.probs.resize(options.heads);
  // Phase 1: this shard's columns of the projections (its query heads, its key/value heads).
  run_shards(shards, [&](int shard) {
    const ShardRange heads = head_range(options.heads, shard), kv = head_range(kv_heads, shard);
    const Eigen::Index begin = heads.begin * head_dim, size = heads.size() * head_dim;
    const Eigen::Index kv_begin = kv.begin * head_dim, kv_size = kv.size() * head_dim;
    multiply(x, w.w_q.middleCols(begin, size), cache.q_raw.middleCols(begin, size));  // (T, d)
    multiply(x, w.w_k.middleCols(kv_begin, kv_size), cache.k_raw.middleCols(kv_begin, kv_size));
    multiply(x, w.w_v.middleCols(kv_begin, kv_size), cache.v_raw.middleCols(kv_begin, kv_size));
    add_bias(w.b_q, begin, cache.q_raw.middleCols(begin, size));
    add_bias(w.b_k, kv_begin, cache.k_raw.middleCols(kv_begin, kv_size));
    add_bias(w.b_v, kv_begin, cache.v_raw.middleCols(kv_begin, kv_size));
  });
  // q/k/v norms may span all heads (OLMo 2's full-width QK-norm): applied between the phases.
  normalize_projection(options, false, options.heads, cache.q_raw, cache.q, cache.q_inv);
  normalize_projection(options, false, kv_heads, cache.k_raw, cache.k, cache.k_inv);
  normalize_projection(options, true, kv_heads, cache.v_raw, cache.v, cache.v_inv);
  rotate_queries_and_keys(options, tokens, cache);
  // Phase 2: this shard's heads, then its partial sum of the output projection.
  run_shards(shards, [&](int shard) {
    const ShardRange heads = head_range(options.heads, shard);
    for (auto h = heads.begin; h < heads.end; ++h) {
      Mat<Scalar>& probs = cache.probs[h];  // (T, T), zero above the diagonal (causal mask)
      probs.resize(tokens, tokens);
      const Eigen::Index kv_begin = kv_column(options, h, head_dim);
      multiply_transposed(cache.q.middleCols(h * head_dim, head_dim), cache.k.middleCols(kv_begin, head_dim),
                          probs);
      for (Eigen::Index i = 0; i < tokens; ++i) {
        auto row = probs.row(i);
        auto visible = row.head(i + 1);
        visible *= scale;
        const Scalar max_score = visible.maxCoeff();
        visible = (visible.array() - max_score).exp().matrix();
        visible /= visible.sum();
        row.tail(tokens - i - 1).setZero();
      }
      multiply(probs, cache.v.middleCols(kv_begin, head_dim),
               cache.context.middleCols(h * head_dim, head_dim));
    }
    if (!with_output) return;
    const Eigen::Index begin = heads.begin * head_dim, size = heads.size() * head_dim;
    cache.partials.output[shard].resize(tokens, width);
    multiply(cache.context.middleCols(begin, size), w.w_o.middleRows(begin, size),
             cache.partials.output[shard]);
  });
  if (!with_output) return;
  out = cache.partials.output[0] + cache.partials.output[1];  // (T, d)
  add_bias(w.b_o, 0, out);
}

namespace {
// Back through head h's softmax attention for the probe whose rows are `probe` (llm.c's
// attention_backward, per head): d_v = P^T dC, dP = dC V^T, the softmax backward
// dS = P (dP - rowsum(dP P)) (masked entries have P = 0), then d_q = s dS K and d_k = s dS^T Q.
// Head h reads the key/value columns from kv_begin; its d_k and d_v go to its own columns.
template <typename Scalar>
void head_backward(AttentionCache<Scalar>& cache, int shard, Eigen::Index h, Eigen::Index kv_begin,
                   Eigen::Index head_dim, Eigen::Index first_row, Eigen::Index tokens, Scalar scale) {
  const Mat<Scalar>& probs = cache.probs[h];
  const auto d_context = cache.d_context.block(first_row, h * head_dim, tokens, head_dim);
  Mat<Scalar>& d_probs = cache.d_probs[shard];
  Mat<Scalar>& d_scores = cache.d_scores[shard];
  d_probs.resize(tokens, tokens);
  multiply_transposed(d_context, cache.v.middleCols(kv_begin, head_dim), d_probs);  // (T, T)
  multiply_first_transposed(probs, d_context, cache.d_v.block(first_row, h * head_dim, tokens, head_dim));
  Vec<Scalar>& row_dot = cache.row_dot[shard];
  row_dot.noalias() = (d_probs.array() * probs.array()).rowwise().sum().matrix();
  d_scores = (probs.array() * (d_probs.colwise() - row_dot).array()) * scale;
  multiply(d_scores, cache.k.middleCols(kv_begin, head_dim),
           cache.d_q.block(first_row, h * head_dim, tokens, head_dim));
  multiply_first_transposed(d_scores, cache.q.middleCols(h * head_dim, head_dim),
                            cache.d_k.block(first_row, h * head_dim, tokens, head_dim));
}

// <d_out_k, C W_O> = <d_out_k W_O^T, C> over the shard's columns [begin, begin + size), per probe k.
template <typename Scalar>
void output_dots_of_shard(AttentionCache<Scalar>& cache, int shard, Eigen::Index begin, Eigen::Index size,
                          Eigen::Index tokens, Eigen::Index probes) {
  auto& dots = cache.partials.output_dots[shard];
  dots.assign(probes, 0.0);
  const auto context = cache.context.middleCols(begin, size);
  for (Eigen::Index k = 0; k < probes; ++k) {
    dots[k] = row_major_dot(cache.d_context.block(k * tokens, begin, tokens, size), context);
  }
}

// The parameter-gradient Gram trick: for Y = X W, ||dW||^2 = ||X^T dY||^2 = <X X^T, dY dY^T>,
// two (T, T) Gram matrices instead of a (d, d) product, summed over the shard's columns of dY.
// W_O's input C is the shard's columns of the context; W_Q, W_K and W_V share their input x. The
// shard's columns: [begin, begin + size) of W_Q, [kv_begin, kv_begin + kv_size) of W_K and W_V.
// A bias b of Y = X W + b has ||db||^2 = ||sum over tokens of dY||^2 (b_o's in shard 0).
template <typename Scalar>
void attention_param_grad_squares(AttentionCache<Scalar>& cache, const SublayerWeights<Scalar>& w, int shard,
                                  ShardRange heads, ShardRange kv, Eigen::Index head_dim, Eigen::Index tokens,
                                  Eigen::Index probes, const Mat<Scalar>& d_out,
                                  const Mat<Scalar>* d_raws[3]) {
  auto& squares = cache.partials.param_grads[shard];
  for (Eigen::Index k = 0; k < probes; ++k) {  // W_O: its rows of this shard, <C C^T, dY dY^T>
    squares[k] += symmetric_inner(cache.grams[shard][0], cache.shared_grams[1 + k]);
  }
  const Mat<Scalar>& x_gram = cache.shared_grams[0];
  Mat<Scalar>& output_gram = cache.grams[shard][1];
  const bool bias = w.b_q.size() > 0;
  for (int m = 0; m < 3; ++m) {
    const ShardRange& range = m == 0 ? heads : kv;
    const Eigen::Index begin = range.begin * head_dim, size = range.size() * head_dim;
    for (Eigen::Index k = 0; k < probes; ++k) {
      const auto d_rows = d_raws[m]->block(k * tokens, begin, tokens, size);
      lower_gram<Scalar>(d_rows, output_gram);
      squares[k] += symmetric_inner(x_gram, output_gram);
      if (bias) squares[k] += d_rows.template cast<double>().colwise().sum().squaredNorm();
    }
  }
  if (!bias || shard != 0) return;
  for (Eigen::Index k = 0; k < probes; ++k)
    squares[k] += d_out.middleRows(k * tokens, tokens).template cast<double>().colwise().sum().squaredNorm();
}

// Between the backward's phases: the query heads' d_k and d_v summed over each key/value group,
// rotary embeddings undone on d_q and d_k, then the q/k/v norms' backward (which may span all
// heads). Returns d_raws = dL/d(x W_Q), dL/d(x W_K), dL/d(x W_V).
template <typename Scalar>
void projections_backward(const AttentionOptions& options, Eigen::Index head_dim,
                          AttentionCache<Scalar>& cache, const Mat<Scalar>* d_raws[3]) {
  const int kv_heads = options.kv_head_count();
  Mat<Scalar>& d_k = sum_over_groups(options, head_dim, cache.d_k, cache.d_k_shared);
  const Mat<Scalar>& d_v = sum_over_groups(options, head_dim, cache.d_v, cache.d_v_shared);
  if (options.rotary_dims > 0) {  // a rotation's transpose is its inverse
    rotary_apply(cache.rotary, options.heads, true, cache.d_q);
    rotary_apply(cache.rotary, kv_heads, true, d_k);
  }
  d_raws[0] =
      &projection_backward(options, false, options.heads, unrotated(options, cache.q, cache.q_unrotated),
                           cache.q_inv, cache.d_q, cache.d_q_raw);
  d_raws[1] = &projection_backward(options, false, kv_heads, unrotated(options, cache.k, cache.k_unrotated),
                                   cache.k_inv, d_k, cache.d_k_raw);
  d_raws[2] = &projection_backward(options, true, kv_heads, cache.v, cache.v_inv, d_v, cache.d_v_raw);
}
}  // namespace

// The backward of attention_forward (llm.c's attention_backward), split like the forward in two
// shards of heads, each phase summing the shards' partials in a fixed order.
template <typename Scalar>
void attention_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                        const AttentionOptions& options, AttentionCache<Scalar>& cache,
                        const Mat<Scalar>& d_out, Mat<Scalar>* dx, ParamGradSquares* param_grads,
                        ShardPair* shards, std::vector<double>* output_dots) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const Eigen::Index rows = d_out.rows(), probes = rows / tokens;
  const int kv_heads = options.kv_head_count();
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  for (Mat<Scalar>* m : {&cache.d_context, &cache.d_q, &cache.d_k, &cache.d_v}) m->resize(rows, width);
  if (param_grads) cache.shared_grams.resize(1 + probes);
  // Phase 1: back through this shard's rows of W_O (dC = dY W_O^T) and its heads.
  run_shards(shards, [&](int shard) {
    const ShardRange heads = head_range(options.heads, shard);
    const Eigen::Index begin = heads.begin * head_dim, size = heads.size() * head_dim;
    cache.partials.param_grads[shard].assign(probes, 0.0);
    multiply_transposed(d_out, w.w_o.middleRows(begin, size), cache.d_context.middleCols(begin, size));
    if (output_dots) output_dots_of_shard(cache, shard, begin, size, tokens, probes);
    for (Eigen::Index k = 0; k < probes; ++k) {
      for (auto h = heads.begin; h < heads.end; ++h)
        head_backward(cache, shard, h, kv_column(options, h, head_dim), head_dim, k * tokens, tokens, scale);
    }
    if (!param_grads) return;
    lower_gram<Scalar>(cache.context.middleCols(begin, size), cache.grams[shard][0]);
    shared_input_grams(shard, x, d_out, cache.shared_grams);  // read by both shards in phase 2
  });
  const Mat<Scalar>* d_raws[3];
  projections_backward(options, head_dim, cache, d_raws);
  if (!dx) return;
  // Phase 2: dx = dQ W_Q^T + dK W_K^T + dV W_V^T over this shard's columns, as a partial sum.
  run_shards(shards, [&](int shard) {
    const ShardRange heads = head_range(options.heads, shard), kv = head_range(kv_heads, shard);
    const Eigen::Index begin = heads.begin * head_dim, size = heads.size() * head_dim;
    const Eigen::Index kv_begin = kv.begin * head_dim, kv_size = kv.size() * head_dim;
    Mat<Scalar>& partial = cache.partials.output[shard];
    partial.resize(rows, width);
    multiply_transposed(d_raws[0]->middleCols(begin, size), w.w_q.middleCols(begin, size), partial);
    multiply_transposed(d_raws[1]->middleCols(kv_begin, kv_size), w.w_k.middleCols(kv_begin, kv_size),
                        partial, true);
    multiply_transposed(d_raws[2]->middleCols(kv_begin, kv_size), w.w_v.middleCols(kv_begin, kv_size),
                        partial, true);
    if (param_grads)
      attention_param_grad_squares(cache, w, shard, heads, kv, head_dim, tokens, probes, d_out, d_raws);
  });
  cache.partials.add_into(*dx, probes, param_grads, output_dots);
}

// Forward mode: the tangents of q, k, v through the projections, the q/k/v norms and the
// rotations (linear: their JVP is themselves), then each head's softmax attention.
template <typename Scalar>
void attention_jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const AttentionOptions& options,
                   AttentionCache<Scalar>& cache, const Mat<Scalar>& d_x, Mat<Scalar>& d_out,
                   const SublayerWeights<Scalar>* d_w) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const Eigen::Index probes = d_x.rows() / tokens;
  const int kv_heads = options.kv_head_count();
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  // Every norm Jacobian here is symmetric (rms, layer, dyt, unit rows), so its backward is its JVP.
  Mat<Scalar> d_q_raw = d_x * w.w_q, d_k_raw = d_x * w.w_k, d_v_raw = d_x * w.w_v;  // (P*T, .)
  if (d_w) {  // product rule: d(x W) = dx W + x dW
    d_q_raw.noalias() += x * d_w->w_q;
    d_k_raw.noalias() += x * d_w->w_k;
    d_v_raw.noalias() += x * d_w->w_v;
  }
  Mat<Scalar> d_q =
      projection_backward(options, false, options.heads, unrotated(options, cache.q, cache.q_unrotated),
                          cache.q_inv, d_q_raw, cache.d_raw);
  Mat<Scalar> d_k =
      projection_backward(options, false, kv_heads, unrotated(options, cache.k, cache.k_unrotated),
                          cache.k_inv, d_k_raw, cache.d_raw);
  const Mat<Scalar> d_v =
      projection_backward(options, true, kv_heads, cache.v, cache.v_inv, d_v_raw, cache.d_raw);
  if (options.rotary_dims > 0) {
    rotary_apply(cache.rotary, options.heads, false, d_q);
    rotary_apply(cache.rotary, kv_heads, false, d_k);
  }
  cache.d_context.setZero(d_x.rows(), width);
  for (Eigen::Index k = 0; k < probes; ++k) {
    for (int h = 0; h < options.heads; ++h) {
      const Eigen::Index kv_begin = kv_column(options, h, head_dim);
      const Mat<Scalar>& probs = cache.probs[h];  // (T, T)
      const auto q = cache.q.middleCols(h * head_dim, head_dim);
      const auto key = cache.k.middleCols(kv_begin, head_dim);
      const auto v = cache.v.middleCols(kv_begin, head_dim);
      const auto dq = d_q.block(k * tokens, h * head_dim, tokens, head_dim);
      const auto dk = d_k.block(k * tokens, kv_begin, tokens, head_dim);
      const auto dv = d_v.block(k * tokens, kv_begin, tokens, head_dim);
      cache.d_scores[0].noalias() = (dq * key.transpose() + q * dk.transpose()) * scale;  // (T, T)
      // softmax JVP: dP = P (dS - rowsum(P dS)); masked entries have P = 0.
      const Vec<Scalar> row_dot = (cache.d_scores[0].array() * probs.array()).rowwise().sum();
      cache.d_probs[0] = probs.array() * (cache.d_scores[0].colwise() - row_dot).array();
      cache.d_context.block(k * tokens, h * head_dim, tokens, head_dim).noalias() =
          cache.d_probs[0] * v + probs * dv;
    }
  }
  d_out.noalias() = cache.d_context * w.w_o;  // (P*T, d)
  if (d_w) d_out.noalias() += cache.context * d_w->w_o;
}

template <typename Scalar>
void attention_weight_gradients(const Mat<Scalar>& x, const AttentionOptions& options,
                                const AttentionCache<Scalar>& cache, const Mat<Scalar>& d_out,
                                SublayerWeights<Scalar>& gradients, ShardPair* shards) {
  // projections_backward's cotangents: d_q with rotations undone in place; d_k and d_v summed over
  // each key/value group (d_k unrotated); then before a q/k/v norm where there is one.
  const bool qk_normalised = options.qkv_norm != QkvNorm::none;
  const bool v_normalised = options.qkv_norm == QkvNorm::per_head_qkv;
  const bool grouped = options.kv_head_count() != options.heads;
  const Mat<Scalar>& d_k = grouped ? cache.d_k_shared : cache.d_k;
  const Mat<Scalar>& d_v = grouped ? cache.d_v_shared : cache.d_v;
  const Eigen::Index width = x.cols(), kv_width = width / options.heads * options.kv_head_count();
  for (Mat<Scalar>* m : {&gradients.w_q, &gradients.w_o}) m->resize(width, width);
  for (Mat<Scalar>* m : {&gradients.w_k, &gradients.w_v}) m->resize(width, kv_width);
  const auto products = [&](int shard) {
    if (shard == 0) {
      multiply_first_transposed(x, qk_normalised ? cache.d_q_raw : cache.d_q, gradients.w_q);  // x^T dQ
      multiply_first_transposed(x, qk_normalised ? cache.d_k_raw : d_k, gradients.w_k);
    } else {
      multiply_first_transposed(x, v_normalised ? cache.d_v_raw : d_v, gradients.w_v);
      multiply_first_transposed(cache.context, d_out, gradients.w_o);
    }
  };
  if (shards) return shards->run(products);
  products(0);
  products(1);
}

#define GRADFLOW_INSTANTIATE_ATTENTION(Scalar)                                                              \
  template void attention_forward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,               \
                                          const AttentionOptions&, AttentionCache<Scalar>&, Mat<Scalar>&,   \
                                          ShardPair*, bool);                                                \
  template void attention_backward<Scalar>(                                                                 \
      const Mat<Scalar>&, const SublayerWeights<Scalar>&, const AttentionOptions&, AttentionCache<Scalar>&, \
      const Mat<Scalar>&, Mat<Scalar>*, ParamGradSquares*, ShardPair*, std::vector<double>*);               \
  template void attention_jvp<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,                   \
                                      const AttentionOptions&, AttentionCache<Scalar>&, const Mat<Scalar>&, \
                                      Mat<Scalar>&, const SublayerWeights<Scalar>*);                        \
  template void attention_weight_gradients<Scalar>(const Mat<Scalar>&, const AttentionOptions&,             \
                                                   const AttentionCache<Scalar>&, const Mat<Scalar>&,       \
                                                   SublayerWeights<Scalar>&, ShardPair*);
GRADFLOW_INSTANTIATE_ATTENTION(float)
GRADFLOW_INSTANTIATE_ATTENTION(double)

}  // namespace gradflow
