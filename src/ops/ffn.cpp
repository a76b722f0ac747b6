// GELU and the feed-forward sublayer, forward and backward.
#include <cmath>
#include <numbers>
#include <unsupported/Eigen/SpecialFunctions>

#include "gradflow/ops.hpp"

namespace gradflow {

// Eigen's vectorised erf (a rational approximation within a few float ulps of std::erf for
// float; std::erf itself for double), applied to whole arrays.
template <typename Scalar>
void gelu_forward(const Mat<Scalar>& x, Mat<Scalar>& y) {
  using Array = Eigen::Array<Scalar, Eigen::Dynamic, 1>;
  const Scalar inv_sqrt2 = static_cast<Scalar>(1.0 / std::numbers::sqrt2);
  y.resize(x.rows(), x.cols());
  const Eigen::Map<const Array> in(x.data(), x.size());
  Eigen::Map<Array>(y.data(), y.size()) = Scalar(0.5) * in * (Scalar(1) + (in * inv_sqrt2).erf());
}

template <typename Scalar>
void gelu_backward(const Mat<Scalar>& x, const Mat<Scalar>& dy, Mat<Scalar>& dx) {
  // d/dx [x Phi(x)] = Phi(x) + x phi(x)
  using Array = Eigen::Array<Scalar, Eigen::Dynamic, 1>;
  const Scalar inv_sqrt2 = static_cast<Scalar>(1.0 / std::numbers::sqrt2);
  const Scalar inv_sqrt_2pi = static_cast<Scalar>(1.0 / std::sqrt(2.0 * std::numbers::pi));
  const Eigen::Index per_probe = x.size();
  const Eigen::Map<const Array> in(x.data(), per_probe);
  const Array slope = Scalar(0.5) * (Scalar(1) + (in * inv_sqrt2).erf()) +
                      in * inv_sqrt_2pi * (Scalar(-0.5) * in.square()).exp();
  for (Eigen::Index block = 0; block < dy.size(); block += per_probe) {
    Eigen::Map<Array>(dx.data() + block, per_probe) +=
        Eigen::Map<const Array>(dy.data() + block, per_probe) * slope;
  }
}

template <typename Scalar>
double weight_grad_squared_norm(const Mat<Scalar>& input_gram,
                                const Eigen::Ref<const Mat<Scalar>>& d_output) {
  const Mat<Scalar> output_gram = d_output * d_output.transpose();  // (T, T)
  return (input_gram.template cast<double>().array() * output_gram.template cast<double>().array()).sum();
}

template <typename Scalar>
void ffn_forward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, FfnCache<Scalar>& cache,
                 Mat<Scalar>& out) {
  cache.hidden_pre.noalias() = x * w.w_1;  // (T, 4d)
  gelu_forward(cache.hidden_pre, cache.hidden);
  out.noalias() = cache.hidden * w.w_2;  // (T, d)
}

template <typename Scalar>
void ffn_backward(const Mat<Scalar>& x, const SublayerWeights<Scalar>& w, FfnCache<Scalar>& cache,
                  const Mat<Scalar>& d_out, Mat<Scalar>& dx, ParamGradSquares* param_grads) {
  const Eigen::Index tokens = x.rows();
  cache.d_hidden.noalias() = d_out * w.w_2.transpose();  // (K*T, 4d)
  cache.d_hidden_pre.setZero(cache.d_hidden.rows(), cache.d_hidden.cols());
  gelu_backward(cache.hidden_pre, cache.d_hidden, cache.d_hidden_pre);
  dx.noalias() += cache.d_hidden_pre * w.w_1.transpose();  // (K*T, d)
  if (param_grads) {
    const Eigen::Index probes = d_out.rows() / tokens;
    param_grads->assign(probes, 0.0);
    const Mat<Scalar> hidden_gram = cache.hidden * cache.hidden.transpose(), x_gram = x * x.transpose();
    for (Eigen::Index k = 0; k < probes; ++k) {
      (*param_grads)[k] =
          weight_grad_squared_norm<Scalar>(hidden_gram, d_out.middleRows(k * tokens, tokens)) +
          weight_grad_squared_norm<Scalar>(x_gram, cache.d_hidden_pre.middleRows(k * tokens, tokens));
    }
  }
}

template <typename Scalar>
void ffn_jvp(const SublayerWeights<Scalar>& w, FfnCache<Scalar>& cache, const Mat<Scalar>& d_x,
             Mat<Scalar>& d_out) {
  cache.d_hidden.noalias() = d_x * w.w_1;  // (P*T, 4d)
  cache.d_hidden_pre.setZero(cache.d_hidden.rows(), cache.d_hidden.cols());
  gelu_backward(cache.hidden_pre, cache.d_hidden, cache.d_hidden_pre);  // GELU's Jacobian is diagonal
  d_out.noalias() = cache.d_hidden_pre * w.w_2;                         // (P*T, d)
}

template <typename Scalar>
void rotation_forward(const Mat<Scalar>& x, Mat<Scalar>& out) {
  out.resize(x.rows(), x.cols());
  for (Eigen::Index c = 0; c + 1 < x.cols(); c += 2) {  // (a, b) -> (-b, a)
    out.col(c) = -x.col(c + 1);
    out.col(c + 1) = x.col(c);
  }
}

template <typename Scalar>
void rotation_backward(const Mat<Scalar>& d_out, Mat<Scalar>& dx) {
  for (Eigen::Index c = 0; c + 1 < d_out.cols(); c += 2) {  // transpose of the rotation
    dx.col(c) += d_out.col(c + 1);
    dx.col(c + 1) -= d_out.col(c);
  }
}

#define GRADFLOW_INSTANTIATE_FFN(Scalar)                                                                    \
  template double weight_grad_squared_norm<Scalar>(const Mat<Scalar>&,                                      \
                                                   const Eigen::Ref<const Mat<Scalar>>&);                   \
  template void gelu_forward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&);                                     \
  template void gelu_backward<Scalar>(const Mat<Scalar>&, const Mat<Scalar>&, Mat<Scalar>&);                \
  template void ffn_forward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&, FfnCache<Scalar>&,  \
                                    Mat<Scalar>&);                                                          \
  template void ffn_backward<Scalar>(const Mat<Scalar>&, const SublayerWeights<Scalar>&, FfnCache<Scalar>&, \
                                     const Mat<Scalar>&, Mat<Scalar>&, ParamGradSquares*);                  \
  template void ffn_jvp<Scalar>(const SublayerWeights<Scalar>&, FfnCache<Scalar>&, const Mat<Scalar>&,      \
                                Mat<Scalar>&);                                                              \
  template void rotation_forward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&);                                 \
  template void rotation_backward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&);
GRADFLOW_INSTANTIATE_FFN(float)
GRADFLOW_INSTANTIATE_FFN(double)

}  // namespace gradflow
