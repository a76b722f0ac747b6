// The two-shard execution (shards.hpp) on each of its paths: ShardPair's own second thread, an
// OpenMP region of two threads (the library path, kernels.hpp) and one thread give the same bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "gradflow/ops.hpp"
#include "gradflow/shards.hpp"
#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
Mat<float> random_float(Eigen::Index rows, Eigen::Index cols, unsigned seed, double scale) {
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

// One attention and one FFN sublayer forward and backward (with parameter gradients and output
// dot products) at d = 64, 4 heads, 12 tokens, 3 probes, on `shards` (null: one thread).
Outputs sublayers_on(ShardPair* shards) {
  const int d = 64, tokens = 12, probes = 3;
  SublayerWeights<float> w;
  w.w_q = random_float(d, d, 1, 0.15);
  w.w_k = random_float(d, d, 2, 0.15);
  w.w_v = random_float(d, d, 3, 0.15);
  w.w_o = random_float(d, d, 4, 0.15);
  w.w_1 = random_float(d, 4 * d, 5, 0.1);
  w.w_2 = random_float(4 * d, d, 6, 0.1);
  const Mat<float> x = random_float(tokens, d, 7, 1.0), dy = random_float(probes * tokens, d, 8, 1.0);
  AttentionOptions attention;
  attention.heads = 4;
  attention.qkv_norm = QkvNorm::per_head_qkv;
  attention.score_scale = 1.0 / std::sqrt(16.0);
  Outputs o;
  AttentionCache<float> attention_cache;
  attention_forward(x, w, attention, attention_cache, o.attention_out, shards);
  o.attention_dx = Mat<float>::Zero(probes * tokens, d);
  attention_backward(x, w, attention, attention_cache, dy, &o.attention_dx, &o.attention_squares, shards,
                     &o.attention_dots);
  FfnCache<float> ffn_cache;
  ffn_forward(x, w, FfnOptions{}, ffn_cache, o.ffn_out, shards);
  o.ffn_dx = Mat<float>::Zero(probes * tokens, d);
  ffn_backward(x, w, FfnOptions{}, ffn_cache, dy, &o.ffn_dx, &o.ffn_squares, shards, &o.ffn_dots);
  return o;
}
}  // namespace

TEST_CASE("two shards give the same bits on ShardPair's thread, on OpenMP and on one thread") {
  const Outputs one = sublayers_on(nullptr);
  ShardPair handshake(true, false), openmp(true, true);
  for (ShardPair* shards : {&handshake, &openmp}) {
    CAPTURE(shards == &openmp);
    const Outputs two = sublayers_on(shards);
    CHECK(same_bits(one.attention_out, two.attention_out));
    CHECK(same_bits(one.attention_dx, two.attention_dx));
    CHECK(same_bits(one.ffn_out, two.ffn_out));
    CHECK(same_bits(one.ffn_dx, two.ffn_dx));
    CHECK(one.attention_squares == two.attention_squares);
    CHECK(one.ffn_squares == two.ffn_squares);
    CHECK(one.attention_dots == two.attention_dots);
    CHECK(one.ffn_dots == two.ffn_dots);
    CHECK(one.attention_dots.size() == 3);
  }
}
