// Causal multi-head attention with optional q/k/v normalisation, forward and backward.
#include <cmath>
#include <limits>

#include "gradflow/branch_op.hpp"
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
  rotary_table(static_cast<int>(tokens), options.rotary_dims, options.rope_theta, 0, cache.rotary,
               options.rope_scaling);
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

// Scratch that a piece needs only while it runs, one per thread (so no piece waits for another's).
template <typename Scalar>
struct HeadScratch {
  Mat<Scalar> d_probs, d_scores, gram;  // (T, T)
  Vec<Scalar> row_dot;                  // the softmax backward's row sums
};
template <typename Scalar>
HeadScratch<Scalar>& head_scratch() {
  thread_local HeadScratch<Scalar> scratch;
  return scratch;
}

// The projections x W_Q, x W_K, x W_V as pieces: blocks of kFeatureBlock output columns of each
// (Megatron-LM's column split, arXiv 1909.08053 Sec. 3). Piece p of the three matrices' blocks.
struct ProjectionPieces {
  int q, k;  // blocks of W_Q, and of W_K (= of W_V)
  ProjectionPieces(Eigen::Index width, Eigen::Index kv_width)
      : q(feature_blocks(width)), k(feature_blocks(kv_width)) {}
  int count() const { return q + 2 * k; }
  // The matrix (0: Q, 1: K, 2: V) and the block within it of piece p.
  std::pair<int, int> locate(int p) const {
    if (p < q) return {0, p};
    return p < q + k ? std::pair{1, p - q} : std::pair{2, p - q - k};
  }
};

template <typename Scalar>
void attention_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                       const AttentionOptions& options, AttentionCache<Scalar>& cache, Mat<Scalar>& out,
                       WorkPool* pool, bool with_output) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const int kv_heads = options.kv_head_count();
  const Eigen::Index kv_width = kv_heads * head_dim;
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  for (Mat<Scalar>* m : {&cache.q_raw, &cache.context}) m->resize(tokens, width);
  for (Mat<Scalar>* m : {&cache.k_raw, &cache.v_raw}) m->resize(tokens, kv_width);
  cache.probs.resize(options.heads);
  // Run 1: the projections, a block of output columns per piece.
  const ProjectionPieces projections(width, kv_width);
  for_each_piece(pool, projections.count(), [&](int piece) {
    const auto [m, block] = projections.locate(piece);
    const Mat<Scalar>& weight = m == 0   ? w.matrices[kWeightQ]
                                : m == 1 ? w.matrices[kWeightK]
                                         : w.matrices[kWeightV];
    const Vec<Scalar>& bias = m == 0 ? w.bias(kWeightQ) : m == 1 ? w.bias(kWeightK) : w.bias(kWeightV);
    Mat<Scalar>& raw = m == 0 ? cache.q_raw : m == 1 ? cache.k_raw : cache.v_raw;
    const FeatureBlock columns = feature_block(raw.cols(), block);
    multiply(x, weight.middleCols(columns.begin, columns.size), raw.middleCols(columns.begin, columns.size));
    add_bias(bias, columns.begin, raw.middleCols(columns.begin, columns.size));
  });
  // q/k/v norms may span all heads (OLMo 2's full-width QK-norm): applied between the runs.
  normalize_projection(options, false, options.heads, cache.q_raw, cache.q, cache.q_inv);
  normalize_projection(options, false, kv_heads, cache.k_raw, cache.k, cache.k_inv);
  normalize_projection(options, true, kv_heads, cache.v_raw, cache.v, cache.v_inv);
  rotate_queries_and_keys(options, tokens, cache);
  // Run 2: softmax attention, a head per piece.
  for_each_piece(pool, options.heads, [&](int h) {
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
    multiply(probs, cache.v.middleCols(kv_begin, head_dim), cache.context.middleCols(h * head_dim, head_dim));
  });
  if (!with_output) return;
  // Run 3: the output projection C W_O, a block of output columns per piece.
  out.resize(tokens, width);
  for_each_piece(pool, feature_blocks(width), [&](int block) {
    const FeatureBlock columns = feature_block(width, block);
    multiply(cache.context, w.matrices[kWeightO].middleCols(columns.begin, columns.size),
             out.middleCols(columns.begin, columns.size));
    add_bias(w.bias(kWeightO), columns.begin, out.middleCols(columns.begin, columns.size));
  });
}

namespace {
// Back through head h's softmax attention for the probe whose rows are `probe` (llm.c's
// attention_backward, per head): d_v = P^T dC, dP = dC V^T, the softmax backward
// dS = P (dP - rowsum(dP P)) (masked entries have P = 0), then d_q = s dS K and d_k = s dS^T Q.
// Head h reads the key/value columns from kv_begin; its d_k and d_v go to its own columns.
template <typename Scalar>
void head_backward(AttentionCache<Scalar>& cache, HeadScratch<Scalar>& scratch, Eigen::Index h,
                   Eigen::Index kv_begin, Eigen::Index head_dim, Eigen::Index first_row, Eigen::Index tokens,
                   Scalar scale) {
  const Mat<Scalar>& probs = cache.probs[h];
  const auto d_context = cache.d_context.block(first_row, h * head_dim, tokens, head_dim);
  Mat<Scalar>& d_probs = scratch.d_probs;
  Mat<Scalar>& d_scores = scratch.d_scores;
  d_probs.resize(tokens, tokens);
  multiply_transposed(d_context, cache.v.middleCols(kv_begin, head_dim), d_probs);  // (T, T)
  multiply_first_transposed(probs, d_context, cache.d_v.block(first_row, h * head_dim, tokens, head_dim));
  Vec<Scalar>& row_dot = scratch.row_dot;
  row_dot.noalias() = (d_probs.array() * probs.array()).rowwise().sum().matrix();
  d_scores = (probs.array() * (d_probs.colwise() - row_dot).array()) * scale;
  multiply(d_scores, cache.k.middleCols(kv_begin, head_dim),
           cache.d_q.block(first_row, h * head_dim, tokens, head_dim));
  multiply_first_transposed(d_scores, cache.q.middleCols(h * head_dim, head_dim),
                            cache.d_k.block(first_row, h * head_dim, tokens, head_dim));
}

// <d_out_k, C W_O> = <d_out_k W_O^T, C> over head h's columns [begin, begin + size), per probe k.
template <typename Scalar>
void head_output_dots(AttentionCache<Scalar>& cache, int h, Eigen::Index begin, Eigen::Index size,
                      Eigen::Index tokens, Eigen::Index probes) {
  auto& dots = cache.output_dots.parts[h];
  const auto context = cache.context.middleCols(begin, size);
  for (Eigen::Index k = 0; k < probes; ++k) {
    dots[k] = row_major_dot(cache.d_context.block(k * tokens, begin, tokens, size), context);
  }
}

// The parameter-gradient Gram trick: for Y = X W, ||dW||^2 = ||X^T dY||^2 = <X X^T, dY dY^T>,
// two (T, T) Gram matrices instead of a (d, d) product, summed over blocks of dY's columns (or of
// X's, for W_O's rows): <X X^T, dY dY^T> = sum over blocks b of <X X^T, dY_b dY_b^T>.
// W_O's term of head h, whose rows of W_O read head h's columns C_h of the context.
template <typename Scalar>
void head_output_squares(AttentionCache<Scalar>& cache, HeadScratch<Scalar>& scratch, int h,
                         Eigen::Index begin, Eigen::Index size, Eigen::Index probes) {
  lower_gram<Scalar>(cache.context.middleCols(begin, size), scratch.gram);
  auto& squares = cache.head_squares.parts[h];
  for (Eigen::Index k = 0; k < probes; ++k)
    squares[k] = symmetric_inner(scratch.gram, cache.shared_grams[1 + k]);
}

// W_Q's, W_K's or W_V's term of one block of its output columns, dL/d(x W)'s columns `columns`;
// with biases, ||db||^2 = ||sum over tokens of dY||^2 of the same columns.
template <typename Scalar>
void projection_squares(const Mat<Scalar>& d_raw, FeatureBlock columns, bool bias, Eigen::Index tokens,
                        const Mat<Scalar>& x_gram, Mat<Scalar>& gram, std::vector<double>& squares) {
  for (std::size_t k = 0; k < squares.size(); ++k) {
    const auto d_rows =
        d_raw.block(static_cast<Eigen::Index>(k) * tokens, columns.begin, tokens, columns.size);
    lower_gram<Scalar>(d_rows, gram);
    squares[k] += symmetric_inner(x_gram, gram);
    if (bias) squares[k] += d_rows.template cast<double>().colwise().sum().squaredNorm();
  }
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

// The backward of attention_forward (llm.c's attention_backward): a head per piece back through
// W_O's rows and the softmax, then a block of dx's columns per piece back through the projections.
template <typename Scalar>
void attention_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w,
                        const AttentionOptions& options, AttentionCache<Scalar>& cache,
                        const Mat<Scalar>& d_out, Mat<Scalar>* dx, ParamGradSquares* param_grads,
                        WorkPool* pool, std::vector<double>* output_dots) {
  const Eigen::Index tokens = x.rows(), width = x.cols(), head_dim = width / options.heads;
  const Eigen::Index rows = d_out.rows(), probes = rows / tokens;
  const Eigen::Index kv_width = options.kv_head_count() * head_dim;
  const Scalar scale = static_cast<Scalar>(options.score_scale);
  for (Mat<Scalar>* m : {&cache.d_context, &cache.d_q, &cache.d_k, &cache.d_v}) m->resize(rows, width);
  if (param_grads) cache.shared_grams.resize(1 + probes);
  if (output_dots) cache.output_dots.reset(options.heads, probes);
  // Run 1: head h back through its rows of W_O (dC_h = dY W_O,h^T) and its softmax; with
  // param_grads, pieces heads .. heads + probes form the shared Grams (x's, each d_out's).
  const int heads = options.heads, grams = param_grads ? static_cast<int>(1 + probes) : 0;
  for_each_piece(pool, heads + grams, [&](int piece) {
    if (piece >= heads) return shared_input_gram(piece - heads, x, d_out, cache.shared_grams);
    const int h = piece;
    const Eigen::Index begin = h * head_dim;
    multiply_transposed(d_out, w.matrices[kWeightO].middleRows(begin, head_dim),
                        cache.d_context.middleCols(begin, head_dim));
    if (output_dots) head_output_dots(cache, h, begin, head_dim, tokens, probes);
    HeadScratch<Scalar>& scratch = head_scratch<Scalar>();
    for (Eigen::Index k = 0; k < probes; ++k)
      head_backward(cache, scratch, h, kv_column(options, h, head_dim), head_dim, k * tokens, tokens, scale);
  });
  const Mat<Scalar>* d_raws[3];
  projections_backward(options, head_dim, cache, d_raws);
  if (!dx) return;
  // Run 2: dx = dQ W_Q^T + dK W_K^T + dV W_V^T, a block of dx's columns per piece; with
  // param_grads, then W_O's term per head and W_Q's, W_K's and W_V's per block of their columns.
  const int dx_pieces = feature_blocks(width);
  const ProjectionPieces projections(width, kv_width);
  const int square_pieces = param_grads ? heads + projections.count() : 0;
  if (param_grads) {
    cache.head_squares.reset(heads, probes);
    cache.projection_squares.reset(projections.count(), probes);
  }
  // Each projection's bias counts where it has one (a trained Qwen2 has them on q, k and v only).
  const bool output_bias = w.bias(kWeightO).size() > 0;
  cache.d_input.resize(rows, width);
  for_each_piece(pool, dx_pieces + square_pieces, [&](int piece) {
    if (piece < dx_pieces) {
      const FeatureBlock c = feature_block(width, piece);
      auto d_input = cache.d_input.middleCols(c.begin, c.size);
      multiply_transposed(*d_raws[0], w.matrices[kWeightQ].middleRows(c.begin, c.size), d_input);
      multiply_transposed(*d_raws[1], w.matrices[kWeightK].middleRows(c.begin, c.size), d_input, true);
      multiply_transposed(*d_raws[2], w.matrices[kWeightV].middleRows(c.begin, c.size), d_input, true);
      dx->middleCols(c.begin, c.size) += d_input;
      return;
    }
    HeadScratch<Scalar>& scratch = head_scratch<Scalar>();
    const int h = piece - dx_pieces;
    if (h < heads) return head_output_squares(cache, scratch, h, h * head_dim, head_dim, probes);
    const auto [m, block] = projections.locate(h - heads);
    const Mat<Scalar>& d_raw = *d_raws[m];
    const bool bias = w.bias(static_cast<std::size_t>(kWeightQ + m)).size() > 0;  // m: q, k, v
    projection_squares(d_raw, feature_block(d_raw.cols(), block), bias, tokens, cache.shared_grams[0],
                       scratch.gram, cache.projection_squares.parts[h - heads]);
  });
  if (output_dots) cache.output_dots.sum_into(*output_dots);
  if (!param_grads) return;
  std::vector<double> heads_sum, projections_sum;
  cache.head_squares.sum_into(heads_sum);
  cache.projection_squares.sum_into(projections_sum);
  param_grads->assign(probes, 0.0);
  for (Eigen::Index k = 0; k < probes; ++k) {
    (*param_grads)[k] = heads_sum[k] + projections_sum[k];
    // b_o: ||db_o||^2 = ||sum over tokens of d_out||^2
    if (output_bias)
      (*param_grads)[k] +=
          d_out.middleRows(k * tokens, tokens).template cast<double>().colwise().sum().squaredNorm();
  }
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
  Mat<Scalar> d_q_raw = d_x * w.matrices[kWeightQ], d_k_raw = d_x * w.matrices[kWeightK],
              d_v_raw = d_x * w.matrices[kWeightV];  // (P*T, .)
  if (d_w) {                                         // product rule: d(x W + b) = dx W + x dW + db
    d_q_raw.noalias() += x * d_w->matrices[kWeightQ];
    d_k_raw.noalias() += x * d_w->matrices[kWeightK];
    d_v_raw.noalias() += x * d_w->matrices[kWeightV];
    add_bias(d_w->bias(kWeightQ), 0, d_q_raw);
    add_bias(d_w->bias(kWeightK), 0, d_k_raw);
    add_bias(d_w->bias(kWeightV), 0, d_v_raw);
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
      cache.d_scores.noalias() = (dq * key.transpose() + q * dk.transpose()) * scale;  // (T, T)
      // softmax JVP: dP = P (dS - rowsum(P dS)); masked entries have P = 0.
      const Vec<Scalar> row_dot = (cache.d_scores.array() * probs.array()).rowwise().sum();
      cache.d_probs = probs.array() * (cache.d_scores.colwise() - row_dot).array();
      cache.d_context.block(k * tokens, h * head_dim, tokens, head_dim).noalias() =
          cache.d_probs * v + probs * dv;
    }
  }
  d_out.noalias() = cache.d_context * w.matrices[kWeightO];  // (P*T, d)
  if (d_w) {
    d_out.noalias() += cache.context * d_w->matrices[kWeightO];
    add_bias(d_w->bias(kWeightO), 0, d_out);
  }
}

template <typename Scalar>
void attention_weight_gradients(const Mat<Scalar>& x, const AttentionOptions& options,
                                const AttentionCache<Scalar>& cache, const Mat<Scalar>& d_out,
                                SublayerWeights<Scalar>& gradients, bool bias, WorkPool* pool) {
  // projections_backward's cotangents: d_q with rotations undone in place; d_k and d_v summed over
  // each key/value group (d_k unrotated); then before a q/k/v norm where there is one.
  const bool qk_normalised = options.qkv_norm != QkvNorm::none;
  const bool v_normalised = options.qkv_norm == QkvNorm::per_head_qkv;
  const bool grouped = options.kv_head_count() != options.heads;
  const Mat<Scalar>& d_k = grouped ? cache.d_k_shared : cache.d_k;
  const Mat<Scalar>& d_v = grouped ? cache.d_v_shared : cache.d_v;
  const Eigen::Index width = x.cols(), kv_width = width / options.heads * options.kv_head_count();
  gradients.resize(kAttentionWeights);
  for (const int m : {kWeightQ, kWeightO}) gradients.matrices[m].resize(width, width);
  for (const int m : {kWeightK, kWeightV}) gradients.matrices[m].resize(width, kv_width);
  // One product per piece: x^T dQ, x^T dK, x^T dV (before any q/k/v norm), C^T dY; with biases,
  // db = 1^T dY of the same cotangent (y = x W + b, summed over tokens).
  const Mat<Scalar>* d_raw[4] = {qk_normalised ? &cache.d_q_raw : &cache.d_q,
                                 qk_normalised ? &cache.d_k_raw : &d_k, v_normalised ? &cache.d_v_raw : &d_v,
                                 &d_out};
  for_each_piece(pool, kAttentionWeights, [&](int piece) {  // piece = AttentionWeight
    multiply_first_transposed(piece == kWeightO ? cache.context : x, *d_raw[piece],
                              gradients.matrices[piece]);
    if (bias) {
      gradients.biases[piece] = d_raw[piece]->colwise().sum().transpose();
    } else {
      gradients.biases[piece].resize(0);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Attention as a branch op (branch_op.hpp): its row in the table.
namespace {
AttentionOptions attention_options(const BranchSettings& settings, Eigen::Index width) {
  AttentionOptions options;
  options.heads = settings.heads;
  // q/k/v norms are RMSNorm whatever --norm is: HybridNorm's "per-head RMSNorm on Q, K and V"
  // (arXiv 2503.04598, Eq. 5) and OLMo 2's QK-norm (arXiv 2501.00656, Sec. 3.3) both specify it.
  options.norm = NormKind::rms;
  options.qkv_norm = settings.qkv_norm;
  const double head_dim = static_cast<double>(width) / settings.heads;
  options.score_scale = settings.score_scale.value_or(1.0 / std::sqrt(head_dim));
  options.kv_heads = settings.ops.kv_heads;
  options.norm_eps = settings.ops.norm_eps;
  options.rope_theta = settings.ops.rope_theta;
  options.rotary_dims = settings.ops.rotary_dims;
  options.rope_scaling = settings.ops.rope_scaling;
  return options;
}

template <typename Scalar>
class AttentionOp final : public BranchOp<Scalar> {
 public:
  void forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
               Mat<Scalar>& out, WorkPool* pool, bool with_output) override {
    attention_forward(x, w, attention_options(settings, x.cols()), cache_, out, pool, with_output);
  }
  void backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
                const Mat<Scalar>& d_out, Mat<Scalar>* dx, ParamGradSquares* param_grads, WorkPool* pool,
                std::vector<double>* output_dots) override {
    attention_backward(x, w, attention_options(settings, x.cols()), cache_, d_out, dx, param_grads, pool,
                       output_dots);
  }
  void jvp(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, const BranchSettings& settings,
           const Mat<Scalar>& d_x, Mat<Scalar>& d_out, const SublayerWeights<Scalar>* d_w) override {
    attention_jvp(x, w, attention_options(settings, x.cols()), cache_, d_x, d_out, d_w);
  }
  void weight_gradients(const Mat<Scalar>& x, const BranchSettings& settings, const Mat<Scalar>& d_out,
                        SublayerWeights<Scalar>& gradients, bool bias, WorkPool* pool) const override {
    attention_weight_gradients(x, attention_options(settings, x.cols()), cache_, d_out, gradients, bias,
                               pool);
  }

 private:
  AttentionCache<Scalar> cache_;
};

// The streams are WeightMatrix's values, as before the table: the same weights for a seed.
std::vector<WeightSpec> attention_weights(const ModelConfig& config) {
  const Eigen::Index d = config.width, kv_width = config.kv_width();
  const auto spec = [](const char* name, WeightMatrix role, Eigen::Index rows, Eigen::Index cols) {
    return WeightSpec{name, role, static_cast<std::uint64_t>(role), rows, cols};
  };
  return {spec("W_Q", WeightMatrix::q, d, d), spec("W_K", WeightMatrix::k, d, kv_width),
          spec("W_V", WeightMatrix::v, d, kv_width), spec("W_O", WeightMatrix::o, d, d)};
}

BranchCost attention_cost(const ModelConfig& config) {
  const double d = config.width, t = config.seq, kv_width = config.kv_width();
  BranchCost cost;
  cost.forward_flops = 2 * t * d * (2 * d + 2 * kv_width) + 2 * 2 * t * t * d;  // q, o; k, v; QK^T, AV
  cost.fixed_scalars = config.heads * t * t * 2;  // each head's softmax and its scratch
  return cost;
}
}  // namespace

BranchOpRow attention_op_row() {
  return {.name = "attention",
          .serves = [](SublayerKind kind, const BlockOps&) { return kind == SublayerKind::attn; },
          .weights = attention_weights,
          .cost = attention_cost,
          .make_float = [] { return std::unique_ptr<BranchOp<float>>(new AttentionOp<float>); },
          .make_double = [] { return std::unique_ptr<BranchOp<double>>(new AttentionOp<double>); }};
}

#define GRADFLOW_INSTANTIATE_ATTENTION(Scalar)                                                              \
  template void attention_forward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,               \
                                          const AttentionOptions&, AttentionCache<Scalar>&, Mat<Scalar>&,   \
                                          WorkPool*, bool);                                                 \
  template void attention_backward<Scalar>(                                                                 \
      const Mat<Scalar>&, const SublayerWeights<Scalar>&, const AttentionOptions&, AttentionCache<Scalar>&, \
      const Mat<Scalar>&, Mat<Scalar>*, ParamGradSquares*, WorkPool*, std::vector<double>*);                \
  template void attention_jvp<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&,                   \
                                      const AttentionOptions&, AttentionCache<Scalar>&, const Mat<Scalar>&, \
                                      Mat<Scalar>&, const SublayerWeights<Scalar>*);                        \
  template void attention_weight_gradients<Scalar>(const Mat<Scalar>&, const AttentionOptions&,             \
                                                   const AttentionCache<Scalar>&, const Mat<Scalar>&,       \
                                                   SublayerWeights<Scalar>&, bool, WorkPool*);
GRADFLOW_INSTANTIATE_ATTENTION(float)
GRADFLOW_INSTANTIATE_ATTENTION(double)

}  // namespace gradflow
