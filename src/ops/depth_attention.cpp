// Attention over depth (Kimi Team 2026, arXiv 2603.15031, Sec. 3.1, Eq. 2-4): forward, backward and
// JVP of one read of a history of sources. The formulas are in depth_attention.hpp.
#include "gradflow/depth_attention.hpp"

#include <cassert>
#include <cmath>
#include <vector>

namespace gradflow {

template <typename Scalar>
void depth_key(const Mat<Scalar>& value, double eps, DepthKey<Scalar>& key) {
  norm_forward(NormKind::rms, 1, value, key.key, key.inv, eps);
}

template <typename Scalar>
void depth_attention_forward(std::span<const DepthSource<Scalar>> sources, const Mat<Scalar>& query,
                             DepthRead<Scalar>& read) {
  assert(!sources.empty());
  const Eigen::Index n = static_cast<Eigen::Index>(sources.size());
  const Eigen::Index tokens = sources.front().value->rows(), width = sources.front().value->cols();
  // Logits s_{i,t} = w . k_{i,t}, then a softmax over i per token (max subtracted: exp(0) = 1 at
  // w = 0, so every weight is exactly 1 / n there).
  read.alpha.resize(n, tokens);
  for (Eigen::Index i = 0; i < n; ++i) {
    const Mat<Scalar>& key = sources[i].key->key;
    for (Eigen::Index t = 0; t < tokens; ++t) read.alpha(i, t) = query.row(0).dot(key.row(t));
  }
  for (Eigen::Index t = 0; t < tokens; ++t) {
    auto column = read.alpha.col(t);
    const Scalar top = column.maxCoeff();
    column = (column.array() - top).exp().matrix();
    column /= column.sum();
  }
  // h = sum_i alpha_i v_i, sources added in order.
  read.out.setZero(tokens, width);
  for (Eigen::Index i = 0; i < n; ++i) {
    const Mat<Scalar>& value = *sources[i].value;
    for (Eigen::Index t = 0; t < tokens; ++t) read.out.row(t) += read.alpha(i, t) * value.row(t);
  }
}

template <typename Scalar>
void depth_attention_backward(std::span<const DepthSource<Scalar>> sources, const Mat<Scalar>& query,
                              const DepthRead<Scalar>& read, const Mat<Scalar>& d_out,
                              std::span<Mat<Scalar>* const> d_sources, Mat<Scalar>* d_query) {
  assert(d_sources.size() == sources.size());
  const Eigen::Index n = static_cast<Eigen::Index>(sources.size());
  const Eigen::Index tokens = read.out.rows(), width = read.out.cols();
  const bool keyed = !is_zero_query(query);  // the key path carries w: exactly zero at w = 0
  const auto w = query.row(0);
  for (Eigen::Index r = 0; r < d_out.rows(); ++r) {
    const Eigen::Index t = r % tokens, probe = r / tokens;
    const auto g = d_out.row(r);
    const Scalar g_dot_h = g.dot(read.out.row(t));
    for (Eigen::Index i = 0; i < n; ++i) {
      const Scalar a = read.alpha(i, t);
      auto dv = d_sources[i]->row(r);
      dv += a * g;
      if (!keyed && d_query == nullptr) continue;
      const Scalar ds = a * (g.dot(sources[i].value->row(t)) - g_dot_h);
      const auto k = sources[i].key->key.row(t);
      if (keyed) {
        const Scalar k_dot_w = k.dot(w);
        dv += (ds * sources[i].key->inv(t, 0)) * (w - k * (k_dot_w / Scalar(width)));
      }
      if (d_query != nullptr) d_query->row(probe) += ds * k;
    }
  }
}

template <typename Scalar>
void depth_attention_jvp(std::span<const DepthSource<Scalar>> sources, const Mat<Scalar>& query,
                         const DepthRead<Scalar>& read, std::span<const Mat<Scalar>* const> d_sources,
                         const Mat<Scalar>* d_query, Mat<Scalar>& d_out) {
  assert(d_sources.size() == sources.size());
  const Eigen::Index n = static_cast<Eigen::Index>(sources.size());
  const Eigen::Index tokens = read.out.rows(), width = read.out.cols();
  const Eigen::Index rows = d_sources.front()->rows();
  const auto w = query.row(0);
  std::vector<Scalar> ds(static_cast<std::size_t>(n));
  d_out.setZero(rows, width);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const Eigen::Index t = r % tokens, tangent = r / tokens;
    Scalar mean = 0;
    for (Eigen::Index i = 0; i < n; ++i) {
      const auto k = sources[i].key->key.row(t);
      const auto dv = d_sources[i]->row(r);
      // w . dk_i with dk_i = inv (dv - k (k . dv) / d)
      Scalar s = sources[i].key->inv(t, 0) * (w.dot(dv) - k.dot(w) * (k.dot(dv) / Scalar(width)));
      if (d_query != nullptr) s += d_query->row(tangent).dot(k);
      ds[i] = s;
      mean += read.alpha(i, t) * s;
    }
    auto out = d_out.row(r);
    for (Eigen::Index i = 0; i < n; ++i) {
      const Scalar a = read.alpha(i, t);
      out += a * d_sources[i]->row(r) + (a * (ds[i] - mean)) * sources[i].value->row(t);
    }
  }
}

#define GRADFLOW_INSTANTIATE_DEPTH_ATTENTION(Scalar)                                                       \
  template void depth_key<Scalar>(const Mat<Scalar>&, double, DepthKey<Scalar>&);                          \
  template void depth_attention_forward<Scalar>(std::span<const DepthSource<Scalar>>, const Mat<Scalar>&,  \
                                                DepthRead<Scalar>&);                                       \
  template void depth_attention_backward<Scalar>(std::span<const DepthSource<Scalar>>, const Mat<Scalar>&, \
                                                 const DepthRead<Scalar>&, const Mat<Scalar>&,             \
                                                 std::span<Mat<Scalar>* const>, Mat<Scalar>*);             \
  template void depth_attention_jvp<Scalar>(std::span<const DepthSource<Scalar>>, const Mat<Scalar>&,      \
                                            const DepthRead<Scalar>&, std::span<const Mat<Scalar>* const>, \
                                            const Mat<Scalar>*, Mat<Scalar>&);
GRADFLOW_INSTANTIATE_DEPTH_ATTENTION(float)
GRADFLOW_INSTANTIATE_DEPTH_ATTENTION(double)

}  // namespace gradflow
