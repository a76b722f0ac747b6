// Issue 19's ops: gated FFNs (SwiGLU, GeGLU), grouped-query attention, rotary embeddings and
// projection biases, against central differences (float64), plus the properties they promise.
#include <doctest/doctest.h>

#include <cmath>

#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
Vec<double> random_vector(Eigen::Index n, unsigned seed) {
  return random_matrix(n, 1, seed, 0.3);
}

SublayerWeights<double> gated_ffn_weights(int d, int hidden, bool bias, unsigned seed) {
  SublayerWeights<double> w;
  w.resize(ffn_weight_count(FfnKind::swiglu));
  w.matrices[kWeightUp] = random_matrix(d, hidden, seed, 1.0 / std::sqrt(d));
  w.matrices[kWeightGate] = random_matrix(d, hidden, seed + 1, 1.0 / std::sqrt(d));
  w.matrices[kWeightDown] = random_matrix(hidden, d, seed + 2, 1.0 / std::sqrt(hidden));
  if (bias) {  // non-zero, so that the forward's use of them is checked too
    w.biases[kWeightUp] = random_vector(hidden, seed + 3);
    w.biases[kWeightGate] = random_vector(hidden, seed + 4);
    w.biases[kWeightDown] = random_vector(d, seed + 5);
  }
  return w;
}

SublayerWeights<double> gqa_weights(int d, int kv_width, bool bias, unsigned seed) {
  SublayerWeights<double> w;
  w.resize(kAttentionWeights);
  const double scale = 1.0 / std::sqrt(d);
  w.matrices[kWeightQ] = random_matrix(d, d, seed, scale);
  w.matrices[kWeightK] = random_matrix(d, kv_width, seed + 1, scale);
  w.matrices[kWeightV] = random_matrix(d, kv_width, seed + 2, scale);
  w.matrices[kWeightO] = random_matrix(d, d, seed + 3, scale);
  if (bias) {
    w.biases[kWeightQ] = random_vector(d, seed + 4);
    w.biases[kWeightK] = random_vector(kv_width, seed + 5);
    w.biases[kWeightV] = random_vector(kv_width, seed + 6);
    w.biases[kWeightO] = random_vector(d, seed + 7);
  }
  return w;
}

MatD attention_out(const MatD& x, const SublayerWeights<double>& w, const AttentionOptions& options) {
  AttentionCache<double> cache;
  MatD out;
  attention_forward(x, w, options, cache, out);
  return out;
}

MatD ffn_out(const MatD& x, const SublayerWeights<double>& w, const FfnOptions& options) {
  FfnCache<double> cache;
  MatD out;
  ffn_forward(x, w, options, cache, out);
  return out;
}

// Sum over probes of ||dL/dW||^2 for every matrix and bias of `w`, by central differences of
// <dy_k, f(x; W)> entry by entry: what param_grads reports, probe by probe.
std::vector<double> param_grad_squares_by_differences(
    SublayerWeights<double> w, const MatD& dy, Eigen::Index tokens,
    const std::function<MatD(const SublayerWeights<double>&)>& forward) {
  const Eigen::Index probes = dy.rows() / tokens;
  std::vector<double> squares(probes, 0.0);
  const double h = 1e-6;
  const auto visit = [&](double* data, Eigen::Index size) {
    for_each_central_difference(
        data, size, h, [&] { return forward(w); },
        [&](Eigen::Index, const MatD& up, const MatD& down) {
          for (Eigen::Index k = 0; k < probes; ++k) {
            const double slope = dy.middleRows(k * tokens, tokens).cwiseProduct(up - down).sum() / (2 * h);
            squares[k] += slope * slope;
          }
        });
  };
  for (MatD& m : w.matrices) visit(m.data(), m.size());
  for (Vec<double>& b : w.biases) visit(b.data(), b.size());
  return squares;
}
}  // namespace

TEST_CASE("gated FFNs (SwiGLU, GeGLU) and the tanh-GELU FFNs match central differences, backward and JVP") {
  const int d = 8, hidden = 12;
  const MatD x = random_matrix(4, d, 31);
  for (const FfnKind kind : {FfnKind::swiglu, FfnKind::geglu, FfnKind::geglu_tanh, FfnKind::gelu_tanh}) {
    for (const bool bias : {false, true}) {
      for (const double hidden_scale : {1.0, 1.7}) {
        CAPTURE(to_string(kind));
        CAPTURE(bias);
        CAPTURE(hidden_scale);
        auto w = gated_ffn_weights(d, hidden, bias, 33);
        if (!ffn_gated(kind)) {
          w.matrices[kWeightGate].resize(0, 0);
          w.biases[kWeightGate].resize(0);
        }
        const FfnOptions options{hidden_scale, kind};
        const auto forward = [&](const MatD& in) { return ffn_out(in, w, options); };
        const auto backward = [&](const MatD& in, const MatD& dy) {
          FfnCache<double> cache;
          MatD out, dx = MatD::Zero(dy.rows(), dy.cols());
          ffn_forward(in, w, options, cache, out);
          ffn_backward(in, w, options, cache, dy, &dx);
          return dx;
        };
        const auto jvp = [&](const MatD& in, const MatD& tangent) {
          FfnCache<double> cache;
          MatD out, d_out;
          ffn_forward(in, w, options, cache, out);
          ffn_jvp(in, w, options, cache, tangent, d_out);
          return d_out;
        };
        CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
        CHECK(jvp_relative_error(x, forward, jvp) <= kFiniteDifferenceTolerance);
      }
    }
  }
}

TEST_CASE("grouped-query attention with rotary embeddings and biases matches central differences") {
  const int d = 16, heads = 4, head_dim = d / heads;
  const MatD x = random_matrix(5, d, 41);
  for (const int kv_heads : {4, 2, 1}) {
    for (const int rotary_dims : {0, 2, 4}) {
      for (const QkvNorm qkv : {QkvNorm::none, QkvNorm::per_head_qkv, QkvNorm::full_qk}) {
        CAPTURE(kv_heads);
        CAPTURE(rotary_dims);
        CAPTURE(static_cast<int>(qkv));
        const bool bias = rotary_dims == 2;
        const auto w = gqa_weights(d, kv_heads * head_dim, bias, 43);
        AttentionOptions options{heads, NormKind::rms, qkv, 0.5};
        options.kv_heads = kv_heads;
        options.rope_theta = 100.0;
        options.rotary_dims = rotary_dims;
        const auto forward = [&](const MatD& in) { return attention_out(in, w, options); };
        const auto backward = [&](const MatD& in, const MatD& dy) {
          AttentionCache<double> cache;
          MatD out, dx = MatD::Zero(dy.rows(), dy.cols());
          attention_forward(in, w, options, cache, out);
          attention_backward(in, w, options, cache, dy, &dx);
          return dx;
        };
        const auto jvp = [&](const MatD& in, const MatD& tangent) {
          AttentionCache<double> cache;
          MatD out, d_out;
          attention_forward(in, w, options, cache, out);
          attention_jvp(in, w, options, cache, tangent, d_out);
          return d_out;
        };
        CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
        CHECK(jvp_relative_error(x, forward, jvp) <= kFiniteDifferenceTolerance);
      }
    }
  }
}

TEST_CASE("parameter-gradient norms of the new ops, biases and W_3 included, match central differences") {
  const int d = 8, tokens = 3, probes = 2;
  const MatD x = random_matrix(tokens, d, 51);
  const MatD dy = random_matrix(probes * tokens, d, 52);
  const auto check_squares = [&](const ParamGradSquares& analytic, const std::vector<double>& numeric) {
    for (int k = 0; k < probes; ++k) CHECK(analytic[k] == doctest::Approx(numeric[k]).epsilon(1e-7));
  };
  for (const FfnKind kind :
       {FfnKind::gelu, FfnKind::swiglu, FfnKind::geglu, FfnKind::gelu_tanh, FfnKind::geglu_tanh}) {
    CAPTURE(to_string(kind));
    auto w = gated_ffn_weights(d, 16, true, 53);
    if (!ffn_gated(kind)) {
      w.matrices[kWeightGate].resize(0, 0);
      w.biases[kWeightGate].resize(0);
    }
    const FfnOptions options{1.0, kind};
    FfnCache<double> cache;
    MatD out, dx = MatD::Zero(dy.rows(), d);
    ParamGradSquares squares;
    ffn_forward(x, w, options, cache, out);
    ffn_backward(x, w, options, cache, dy, &dx, &squares);
    check_squares(squares,
                  param_grad_squares_by_differences(w, dy, tokens, [&](const SublayerWeights<double>& v) {
                    return ffn_out(x, v, options);
                  }));
  }
  for (const int kv_heads : {2, 1}) {
    CAPTURE(kv_heads);
    const auto w = gqa_weights(d, kv_heads * 2, true, 57);
    AttentionOptions options{4, NormKind::rms, QkvNorm::none, 0.5};
    options.kv_heads = kv_heads;
    options.rope_theta = 10000.0;
    options.rotary_dims = 2;
    AttentionCache<double> cache;
    MatD out, dx = MatD::Zero(dy.rows(), d);
    ParamGradSquares squares;
    attention_forward(x, w, options, cache, out);
    attention_backward(x, w, options, cache, dy, &dx, &squares);
    check_squares(squares,
                  param_grad_squares_by_differences(w, dy, tokens, [&](const SublayerWeights<double>& v) {
                    return attention_out(x, v, options);
                  }));
  }
}

TEST_CASE("rotary embeddings leave every head's norm unchanged") {
  const int heads = 3, head_dim = 8, tokens = 6;
  const MatD x = random_matrix(2 * tokens, heads * head_dim, 61);
  for (const int rotary_dims : {2, 6, 8}) {
    RotaryTable<double> table;
    rotary_table(tokens, rotary_dims, 10000.0, 0, table);
    MatD rotated = x;
    rotary_apply(table, heads, false, rotated);
    CHECK((rotated - x).norm() > 0.1);  // it does rotate
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      for (int h = 0; h < heads; ++h) {
        CHECK(rotated.row(r).segment(h * head_dim, head_dim).norm() ==
              doctest::Approx(x.row(r).segment(h * head_dim, head_dim).norm()).epsilon(1e-14));
      }
    }
    MatD back = rotated;  // the inverse undoes it
    rotary_apply(table, heads, true, back);
    CHECK((back - x).norm() <= 1e-13 * x.norm());
  }
}

TEST_CASE("with rotary embeddings attention scores depend on relative position only") {
  const int tokens = 7, head_dim = 8;
  const MatD q = random_matrix(tokens, head_dim, 71), k = random_matrix(tokens, head_dim, 72);
  const auto scores = [&](int first_position) {
    RotaryTable<double> table;
    rotary_table(tokens, head_dim, 10000.0, first_position, table);
    MatD q_rotated = q, k_rotated = k;
    rotary_apply(table, 1, false, q_rotated);
    rotary_apply(table, 1, false, k_rotated);
    return MatD(q_rotated * k_rotated.transpose());
  };
  const MatD at_zero = scores(0);
  CHECK((at_zero - q * k.transpose()).norm() > 0.1);  // positions do change the scores
  for (const int shift : {1, 5, 1000}) {
    CAPTURE(shift);
    CHECK((scores(shift) - at_zero).norm() <= 1e-11 * at_zero.norm());
  }
}

TEST_CASE("grouped-query attention equals multi-head attention with each key/value head repeated") {
  const int d = 16, heads = 4, head_dim = 4, kv_heads = 2;
  const MatD x = random_matrix(5, d, 81);
  const auto grouped = gqa_weights(d, kv_heads * head_dim, false, 83);
  SublayerWeights<double> repeated = grouped;  // repeat_interleave of the key/value heads
  repeated.matrices[kWeightK].resize(d, d);
  repeated.matrices[kWeightV].resize(d, d);
  for (int h = 0; h < heads; ++h) {
    const int g = h / (heads / kv_heads);
    repeated.matrices[kWeightK].middleCols(h * head_dim, head_dim) =
        grouped.matrices[kWeightK].middleCols(g * head_dim, head_dim);
    repeated.matrices[kWeightV].middleCols(h * head_dim, head_dim) =
        grouped.matrices[kWeightV].middleCols(g * head_dim, head_dim);
  }
  AttentionOptions options{heads, NormKind::rms, QkvNorm::none, 0.5};
  const MatD reference = attention_out(x, repeated, options);
  options.kv_heads = kv_heads;
  CHECK((attention_out(x, grouped, options) - reference).norm() <= 1e-13 * reference.norm());
  // --kv-heads equal to --heads is today's attention, bit for bit.
  AttentionOptions full{heads, NormKind::rms, QkvNorm::none, 0.5};
  const MatD today = attention_out(x, repeated, full);
  full.kv_heads = heads;
  CHECK(attention_out(x, repeated, full).cwiseEqual(today).all());
}
