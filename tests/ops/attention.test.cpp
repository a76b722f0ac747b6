// Causal multi-head attention: central differences for every q/k/v normalisation, causality.
#include <doctest/doctest.h>

#include <cmath>

#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
SublayerWeights<double> attention_weights(int d, unsigned seed) {
  SublayerWeights<double> w;
  w.resize(kAttentionWeights);
  const double scale = 1.0 / std::sqrt(d);
  w.matrices[kWeightQ] = random_matrix(d, d, seed, scale);
  w.matrices[kWeightK] = random_matrix(d, d, seed + 1, scale);
  w.matrices[kWeightV] = random_matrix(d, d, seed + 2, scale);
  w.matrices[kWeightO] = random_matrix(d, d, seed + 3, scale);
  return w;
}
}  // namespace

TEST_CASE("attention_backward matches central differences for every q/k/v normalisation") {
  const int d = 8, heads = 2;
  const auto w = attention_weights(d, 21);
  const MatD x = random_matrix(5, d, 25);
  for (const QkvNorm qkv :
       {QkvNorm::none, QkvNorm::per_head_qkv, QkvNorm::full_qk, QkvNorm::per_head_qk_unit}) {
    for (const NormKind norm : {NormKind::rms, NormKind::layer}) {
      CAPTURE(static_cast<int>(qkv));
      CAPTURE(to_string(norm));
      AttentionOptions options{heads, norm, qkv, qkv == QkvNorm::per_head_qk_unit ? 2.0 : 0.5};
      const auto forward = [&](const MatD& in) {
        AttentionCache<double> cache;
        MatD out;
        attention_forward(in, w, options, cache, out);
        return out;
      };
      const auto backward = [&](const MatD& in, const MatD& dy) {
        AttentionCache<double> cache;
        MatD out, dx = MatD::Zero(dy.rows(), dy.cols());
        attention_forward(in, w, options, cache, out);
        attention_backward(in, w, options, cache, dy, &dx);
        return dx;
      };
      CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
    }
  }
}

TEST_CASE("attention is causal: token t does not depend on later tokens") {
  const int d = 8;
  const auto w = attention_weights(d, 31);
  MatD x = random_matrix(6, d, 35);
  AttentionOptions options{2, NormKind::rms, QkvNorm::none, 0.5};
  AttentionCache<double> cache;
  MatD before, after;
  attention_forward(x, w, options, cache, before);
  x.row(5) *= 3.0;
  attention_forward(x, w, options, cache, after);
  CHECK((before.topRows(5) - after.topRows(5)).norm() == doctest::Approx(0.0));
  CHECK((before.row(5) - after.row(5)).norm() > 1e-3);
  for (const auto& probs : cache.probs) {
    for (Eigen::Index i = 0; i < probs.rows(); ++i) CHECK(probs.row(i).sum() == doctest::Approx(1.0));
  }
}

TEST_CASE("attention_jvp matches central differences for every q/k/v normalisation") {
  const int d = 8, heads = 2;
  const auto w = attention_weights(d, 41);
  const MatD x = random_matrix(5, d, 45);
  for (const QkvNorm qkv :
       {QkvNorm::none, QkvNorm::per_head_qkv, QkvNorm::full_qk, QkvNorm::per_head_qk_unit}) {
    for (const NormKind norm : {NormKind::rms, NormKind::layer, NormKind::dyt}) {
      CAPTURE(static_cast<int>(qkv));
      CAPTURE(to_string(norm));
      AttentionOptions options{heads, norm, qkv, qkv == QkvNorm::per_head_qk_unit ? 2.0 : 0.5};
      const auto forward = [&](const MatD& in) {
        AttentionCache<double> cache;
        MatD out;
        attention_forward(in, w, options, cache, out);
        return out;
      };
      const auto jvp = [&](const MatD& in, const MatD& dx) {
        AttentionCache<double> cache;
        MatD out, dy;
        attention_forward(in, w, options, cache, out);
        attention_jvp(in, w, options, cache, dx, dy);
        return dy;
      };
      CHECK(jvp_relative_error(x, forward, jvp) <= kFiniteDifferenceTolerance);
    }
  }
}
