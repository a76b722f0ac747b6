// Attention over depth (depth_attention.hpp): backward and JVP in every source and in the
// pseudo-query against central differences, at a random query and at the paper's zero init, and
// the defining properties: a zero query reads the uniform mean, one source reads itself.
#include "gradflow/depth_attention.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
constexpr Eigen::Index kTokens = 5, kWidth = 8;
constexpr double kEps = 1e-6;

// A history of n sources (different scales, so the keys' RMSNorm matters) and their keys.
struct History {
  std::vector<MatD> values;
  std::vector<DepthKey<double>> keys;
  History(int n, unsigned seed) {
    for (int i = 0; i < n; ++i) values.push_back(random_matrix(kTokens, kWidth, seed + i, 0.5 + 0.4 * i));
    keys.resize(values.size());
  }
  std::vector<DepthSource<double>> sources() {  // keys recomputed from the current values
    std::vector<DepthSource<double>> out;
    for (std::size_t i = 0; i < values.size(); ++i) {
      depth_key(values[i], kEps, keys[i]);
      out.push_back({&values[i], &keys[i]});
    }
    return out;
  }
  MatD read(const MatD& query) {
    DepthRead<double> read;
    depth_attention_forward<double>(sources(), query, read);
    return read.out;
  }
};

// sum over probes of <d_out_k, h>, one entry per probe
double probe_dot(const MatD& d_out, const MatD& out, int probe) {
  return d_out.middleRows(probe * kTokens, kTokens).cwiseProduct(out).sum();
}

// ||numeric - analytic|| / ||analytic|| over every source's and the query's gradient.
double backward_error(History& history, MatD query, int probes) {
  const int n = static_cast<int>(history.values.size());
  const MatD d_out = random_matrix(probes * kTokens, kWidth, 99);
  DepthRead<double> read;
  auto sources = history.sources();
  depth_attention_forward<double>(sources, query, read);
  std::vector<MatD> d_sources(n, MatD::Zero(probes * kTokens, kWidth));
  std::vector<MatD*> pointers;
  for (auto& d : d_sources) pointers.push_back(&d);
  MatD d_query = MatD::Zero(probes, kWidth);
  depth_attention_backward<double>(sources, query, read, d_out, pointers, &d_query);

  const double h = 1e-6;
  double error = 0, norm = 0;
  for (int i = 0; i < n; ++i) {
    for_each_central_difference(
        history.values[i], h, [&] { return history.read(query); },
        [&](Eigen::Index row, Eigen::Index col, const MatD& up, const MatD& down) {
          for (int k = 0; k < probes; ++k) {
            const double numeric = (probe_dot(d_out, up, k) - probe_dot(d_out, down, k)) / (2 * h);
            const double analytic = d_sources[i](k * kTokens + row, col);
            error += (numeric - analytic) * (numeric - analytic), norm += analytic * analytic;
          }
        });
  }
  double query_error = 0, query_norm = 0;
  for_each_central_difference(
      query, h, [&] { return history.read(query); },
      [&](Eigen::Index, Eigen::Index col, const MatD& up, const MatD& down) {
        for (int k = 0; k < probes; ++k) {
          const double numeric = (probe_dot(d_out, up, k) - probe_dot(d_out, down, k)) / (2 * h);
          const double analytic = d_query(k, col);
          query_error += (numeric - analytic) * (numeric - analytic), query_norm += analytic * analytic;
        }
      });
  MESSAGE("depth attention backward: sources ", std::sqrt(error / norm), ", query ",
          std::sqrt(query_error / query_norm), " (|dL/dw| = ", std::sqrt(query_norm), ")");
  CHECK(query_norm > 0);  // the pseudo-query has a gradient even at w = 0 (several sources)
  return std::max(std::sqrt(error / norm), std::sqrt(query_error / query_norm));
}
}  // namespace

TEST_CASE("depth attention backward matches central differences in every source and the query") {
  for (const double query_scale : {0.0, 0.7}) {
    CAPTURE(query_scale);
    History history(4, 11);
    const MatD query = query_scale * random_matrix(1, kWidth, 5);
    CHECK(backward_error(history, query, 2) <= kFiniteDifferenceTolerance);
  }
}

TEST_CASE("depth attention JVP matches central differences in every source and the query") {
  for (const double query_scale : {0.0, 0.7}) {
    CAPTURE(query_scale);
    const int tangents = 2, n = 3;
    History history(n, 21);
    MatD query = query_scale * random_matrix(1, kWidth, 6);
    std::vector<MatD> directions;
    std::vector<const MatD*> pointers;
    for (int i = 0; i < n; ++i) directions.push_back(random_matrix(tangents * kTokens, kWidth, 40 + i));
    for (auto& d : directions) pointers.push_back(&d);
    const MatD query_direction = random_matrix(tangents, kWidth, 50);

    DepthRead<double> read;
    auto sources = history.sources();
    depth_attention_forward<double>(sources, query, read);
    MatD analytic;
    depth_attention_jvp<double>(sources, query, read, pointers, &query_direction, analytic);

    const double h = 1e-6;
    MatD numeric(tangents * kTokens, kWidth);
    for (int p = 0; p < tangents; ++p) {
      History moved = history;
      const auto shifted = [&](double step) {
        for (int i = 0; i < n; ++i)
          moved.values[i] = history.values[i] + step * directions[i].middleRows(p * kTokens, kTokens);
        return moved.read(query + step * query_direction.row(p));
      };
      numeric.middleRows(p * kTokens, kTokens) = (shifted(h) - shifted(-h)) / (2 * h);
    }
    const double error = (numeric - analytic).norm() / analytic.norm();
    MESSAGE("depth attention JVP vs central differences, relative error ", error);
    CHECK(error <= kFiniteDifferenceTolerance);
  }
}

TEST_CASE_TEMPLATE("a zero pseudo-query reads the uniform mean of its sources", Scalar, float, double) {
  const int n = 5;
  std::vector<Mat<Scalar>> values;
  std::vector<DepthKey<Scalar>> keys(n);
  std::vector<DepthSource<Scalar>> sources;
  for (int i = 0; i < n; ++i)
    values.push_back(random_matrix(kTokens, kWidth, 60 + i, 1.0 + i).cast<Scalar>());
  for (int i = 0; i < n; ++i) {
    depth_key(values[i], kEps, keys[i]);
    sources.push_back({&values[i], &keys[i]});
  }
  DepthRead<Scalar> read;
  depth_attention_forward<Scalar>(sources, Mat<Scalar>::Zero(1, kWidth), read);
  // exp(0) = 1 for every source, so each weight is the correctly rounded 1 / n
  CHECK((read.alpha.array() == Scalar(1) / Scalar(n)).all());
  Mat<Scalar> mean = Mat<Scalar>::Zero(kTokens, kWidth);
  for (const auto& v : values) mean += v;
  mean /= Scalar(n);
  const double tolerance = std::is_same_v<Scalar, float> ? 1e-6 : 1e-15;
  CHECK(double((read.out - mean).norm() / mean.norm()) <= tolerance);
}

TEST_CASE("a read of one source is that source, and its pseudo-query has no gradient") {
  History history(1, 70);
  const MatD query = random_matrix(1, kWidth, 71);
  DepthRead<double> read;
  auto sources = history.sources();
  depth_attention_forward<double>(sources, query, read);
  CHECK((read.out.array() == history.values[0].array()).all());
  const MatD d_out = random_matrix(kTokens, kWidth, 72);
  MatD d_source = MatD::Zero(kTokens, kWidth), d_query = MatD::Zero(1, kWidth);
  MatD* pointer = &d_source;
  depth_attention_backward<double>(sources, query, read, d_out, std::span<MatD* const>(&pointer, 1),
                                   &d_query);
  CHECK((d_source.array() == d_out.array()).all());  // the identity, plus a key path times ds = 0
  CHECK((d_query.array() == 0.0).all());
}

TEST_CASE("a pseudo-query aligned with one source's keys puts its weight there") {
  History history(3, 80);
  // Source 1 points along e_0 at every token (its key is sqrt(d) e_0, the largest logit any key can
  // reach against w = c e_0: |w . k| <= c |k| = c sqrt(d), with equality only along e_0).
  history.values[1].setZero();
  for (Eigen::Index t = 0; t < kTokens; ++t) history.values[1](t, 0) = 0.5 + t;
  auto sources = history.sources();
  MatD query = MatD::Zero(1, kWidth);
  query(0, 0) = 50.0;
  DepthRead<double> read;
  depth_attention_forward<double>(sources, query, read);
  for (Eigen::Index t = 0; t < kTokens; ++t) {
    CAPTURE(t);
    CHECK(read.alpha.col(t).sum() == doctest::Approx(1.0).epsilon(1e-15));
    CHECK(read.alpha(1, t) > 0.999);
  }
  CHECK((read.out - history.values[1]).norm() / history.values[1].norm() < 1e-2);
}
