// The ops' pieces (work_pool.hpp) give the same bits on one thread, on WorkPool's workers and on
// OpenMP (the library path, kernels.hpp), for every thread count: 2, 3, 4, 7 and 16 threads
// against one. Uneven counts (3, 7) leave pieces that the first threads to finish take.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "gradflow/ops.hpp"
#include "gradflow/work_pool.hpp"
#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
Mat<float> random_float(Eigen::Index rows, Eigen::Index cols, unsigned seed, double scale = 1.0) {
  return random_matrix(rows, cols, seed, scale).cast<float>();
}

bool same_bits(const Mat<float>& a, const Mat<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

struct Outputs {
  Mat<float> attention_out, attention_dx, ffn_out, ffn_dx;
  ParamGradSquares attention_squares, ffn_squares;
  std::vector<double> attention_dots, ffn_dots;
};

// Attention's W_Q, W_K, W_V, W_O (d, d), and a gelu FFN's W_1 (d, 4d) and W_2 (4d, d) with room
// for a gate W_3, drawn from fixed seeds.
SublayerWeights<float> attention_weights(int d) {
  SublayerWeights<float> w;
  w.resize(kAttentionWeights);
  for (const int m : {kWeightQ, kWeightK, kWeightV, kWeightO})
    w.matrices[m] = random_float(d, d, static_cast<unsigned>(1 + m), 0.15);
  return w;
}

SublayerWeights<float> ffn_weights(int d) {
  SublayerWeights<float> f;
  f.resize(ffn_weight_count(FfnKind::swiglu));
  f.matrices[kWeightUp] = random_float(d, 4 * d, 5, 0.1);
  f.matrices[kWeightDown] = random_float(4 * d, d, 6, 0.1);
  return f;
}

// One attention and one FFN sublayer forward and backward (with parameter gradients and output
// dot products) at d = 320, 4 heads, 12 tokens, 3 probes, on `pool` (null: one thread): three
// blocks of output columns (128, 128, 64) and ten of hidden units.
Outputs sublayers_on(WorkPool* pool) {
  const int d = 320, tokens = 12, probes = 3;
  const SublayerWeights<float> w = attention_weights(d), f = ffn_weights(d);
  const Mat<float> x = random_float(tokens, d, 7, 1.0), dy = random_float(probes * tokens, d, 8, 1.0);
  AttentionOptions attention;
  attention.heads = 4;
  attention.qkv_norm = QkvNorm::per_head_qkv;
  attention.score_scale = 1.0 / std::sqrt(80.0);
  Outputs o;
  AttentionCache<float> attention_cache;
  attention_forward(x, w, attention, attention_cache, o.attention_out, pool);
  o.attention_dx = Mat<float>::Zero(probes * tokens, d);
  attention_backward(x, w, attention, attention_cache, dy, &o.attention_dx, &o.attention_squares, pool,
                     &o.attention_dots);
  FfnCache<float> ffn_cache;
  ffn_forward(x, f, FfnOptions{}, ffn_cache, o.ffn_out, pool);
  o.ffn_dx = Mat<float>::Zero(probes * tokens, d);
  ffn_backward(x, f, FfnOptions{}, ffn_cache, dy, &o.ffn_dx, &o.ffn_squares, pool, &o.ffn_dots);
  return o;
}
}  // namespace

TEST_CASE("the ops give the same bits on every thread count, on WorkPool's workers and on OpenMP") {
  const Outputs one = sublayers_on(nullptr);
  for (const int threads : {2, 3, 4, 7, 16}) {
    for (const bool openmp : {false, true}) {
      CAPTURE(threads);
      CAPTURE(openmp);
      WorkPool pool(threads, openmp);
      const Outputs many = sublayers_on(&pool);
      CHECK(same_bits(one.attention_out, many.attention_out));
      CHECK(same_bits(one.attention_dx, many.attention_dx));
      CHECK(same_bits(one.ffn_out, many.ffn_out));
      CHECK(same_bits(one.ffn_dx, many.ffn_dx));
      CHECK(one.attention_squares == many.attention_squares);
      CHECK(one.ffn_squares == many.ffn_squares);
      CHECK(one.attention_dots == many.attention_dots);
      CHECK(one.ffn_dots == many.ffn_dots);
      CHECK(one.attention_dots.size() == 3);
    }
  }
}

TEST_CASE("ffn and attention variants give the same bits on seven threads as on one") {
  const int d = 64, tokens = 12, probes = 3;
  WorkPool seven(7, false);
  const SublayerWeights<float> w = attention_weights(d), f = ffn_weights(d);
  const Mat<float> x = random_float(tokens, d, 7);
  const Mat<float> dy = random_float(probes * tokens, d, 8);

  SUBCASE("ffn") {
    for (const double hidden_scale : {1.0, 8.0}) {  // 8 = nGPT's s_uv = sqrt(d)
      CAPTURE(hidden_scale);
      const FfnOptions options{hidden_scale};
      FfnCache<float> one, two;
      Mat<float> out_one, out_two;
      ffn_forward(x, f, options, one, out_one);
      ffn_forward(x, f, options, two, out_two, &seven);
      CHECK(same_bits(out_one, out_two));
      Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
      ParamGradSquares squares_one, squares_two;
      ffn_backward(x, f, options, one, dy, &dx_one, &squares_one);
      ffn_backward(x, f, options, two, dy, &dx_two, &squares_two, &seven);
      CHECK(same_bits(dx_one, dx_two));
      CHECK(squares_one == squares_two);
    }
  }
  SUBCASE("attention") {
    for (const QkvNorm norm :
         {QkvNorm::none, QkvNorm::per_head_qkv, QkvNorm::full_qk, QkvNorm::per_head_qk_unit}) {
      for (const int heads : {1, 4, 8}) {
        CAPTURE(static_cast<int>(norm));
        CAPTURE(heads);
        AttentionOptions options;
        options.heads = heads;
        options.qkv_norm = norm;
        options.score_scale = 1.0 / std::sqrt(static_cast<double>(d / heads));
        AttentionCache<float> one, two;
        Mat<float> out_one, out_two;
        attention_forward(x, w, options, one, out_one);
        attention_forward(x, w, options, two, out_two, &seven);
        CHECK(same_bits(out_one, out_two));
        Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
        ParamGradSquares squares_one, squares_two;
        attention_backward(x, w, options, one, dy, &dx_one, &squares_one);
        attention_backward(x, w, options, two, dy, &dx_two, &squares_two, &seven);
        CHECK(same_bits(dx_one, dx_two));
        CHECK(squares_one == squares_two);
      }
    }
  }
  SUBCASE("gated ffn with biases") {
    SublayerWeights<float> gated = f;
    gated.matrices[kWeightGate] = random_float(d, 4 * d, 9, 0.1);
    gated.biases[kWeightUp] = random_float(4 * d, 1, 10, 0.1);
    gated.biases[kWeightGate] = random_float(4 * d, 1, 11, 0.1);
    gated.biases[kWeightDown] = random_float(d, 1, 12, 0.1);
    for (const FfnKind kind : {FfnKind::swiglu, FfnKind::geglu}) {
      CAPTURE(to_string(kind));
      const FfnOptions options{1.0, kind};
      FfnCache<float> one, two;
      Mat<float> out_one, out_two;
      ffn_forward(x, gated, options, one, out_one);
      ffn_forward(x, gated, options, two, out_two, &seven);
      CHECK(same_bits(out_one, out_two));
      Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
      ParamGradSquares squares_one, squares_two;
      ffn_backward(x, gated, options, one, dy, &dx_one, &squares_one);
      ffn_backward(x, gated, options, two, dy, &dx_two, &squares_two, &seven);
      CHECK(same_bits(dx_one, dx_two));
      CHECK(squares_one == squares_two);
    }
  }
  SUBCASE("grouped-query attention with rotary embeddings and biases") {
    for (const int kv_heads : {1, 2, 4}) {  // 8 query heads: groups of 8, 4 and 2, split across pieces
      CAPTURE(kv_heads);
      const int head_dim = d / 8;
      SublayerWeights<float> grouped = w;
      grouped.matrices[kWeightK] = random_float(d, kv_heads * head_dim, 13, 0.15);
      grouped.matrices[kWeightV] = random_float(d, kv_heads * head_dim, 14, 0.15);
      grouped.biases[kWeightQ] = random_float(d, 1, 15, 0.1);
      grouped.biases[kWeightK] = random_float(kv_heads * head_dim, 1, 16, 0.1);
      grouped.biases[kWeightV] = random_float(kv_heads * head_dim, 1, 17, 0.1);
      grouped.biases[kWeightO] = random_float(d, 1, 18, 0.1);
      AttentionOptions options;
      options.heads = 8;
      options.kv_heads = kv_heads;
      options.qkv_norm = QkvNorm::per_head_qkv;
      options.score_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      options.rope_theta = 10000.0;
      options.rotary_dims = head_dim;
      AttentionCache<float> one, two;
      Mat<float> out_one, out_two;
      attention_forward(x, grouped, options, one, out_one);
      attention_forward(x, grouped, options, two, out_two, &seven);
      CHECK(same_bits(out_one, out_two));
      Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
      ParamGradSquares squares_one, squares_two;
      attention_backward(x, grouped, options, one, dy, &dx_one, &squares_one);
      attention_backward(x, grouped, options, two, dy, &dx_two, &squares_two, &seven);
      CHECK(same_bits(dx_one, dx_two));
      CHECK(squares_one == squares_two);
    }
  }
}
