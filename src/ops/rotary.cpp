// Rotary position embeddings (RoFormer) and the SiLU activation of SwiGLU, forward and backward.
#include <cmath>
#include <numbers>

#include "gradflow/ops.hpp"

namespace gradflow {

// theta_i = theta^(-2i/rotary_dims), i < rotary_dims/2 (Su et al. 2021, arXiv 2104.09864, Eq. 15),
// rescaled by transformers' modeling_rope_utils.py (commit-independent formulas, ops.hpp).
double rotary_frequency(int pair, int rotary_dims, double theta, const RopeFrequencies& scaling) {
  double frequency = std::pow(theta, -2.0 * pair / rotary_dims);
  if (scaling.scaling == RopeScaling::linear) frequency /= scaling.factor;
  if (scaling.scaling == RopeScaling::llama3) {
    const double context = scaling.original_max_positions;
    const double wavelength = 2 * std::numbers::pi / frequency;
    if (wavelength > context / scaling.low_freq_factor) {
      frequency /= scaling.factor;
    } else if (wavelength >= context / scaling.high_freq_factor) {
      const double smooth = (context / wavelength - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      frequency = (1 - smooth) * frequency / scaling.factor + smooth * frequency;
    }
  }
  return frequency;
}

// The token at position p turns pair i by p theta_i. Angles and their cosines are taken in double.
template <typename Scalar>
void rotary_table(int tokens, int rotary_dims, double theta, int first_position, RotaryTable<Scalar>& table,
                  const RopeFrequencies& scaling) {
  const int pairs = rotary_dims / 2;
  table.rotary_dims = rotary_dims;
  table.cos.resize(tokens, pairs);
  table.sin.resize(tokens, pairs);
  for (int i = 0; i < pairs; ++i) {
    const double frequency = rotary_frequency(i, rotary_dims, theta, scaling);
    for (int t = 0; t < tokens; ++t) {
      const double angle = static_cast<double>(first_position + t) * frequency;
      table.cos(t, i) = static_cast<Scalar>(std::cos(angle));
      table.sin(t, i) = static_cast<Scalar>(std::sin(angle));
    }
  }
}

// RoFormer Eq. 34 in HF's rotate_half layout: x R = x cos + rotate_half(x) sin, with
// rotate_half(a, b) = (-b, a) for the halves a = x[:r/2], b = x[r/2:r] of a head's rotated dims.
template <typename Scalar>
void rotary_apply(const RotaryTable<Scalar>& table, int heads, bool inverse, Mat<Scalar>& x) {
  const Eigen::Index tokens = table.cos.rows(), pairs = table.rotary_dims / 2;
  const Eigen::Index head_dim = x.cols() / heads;
  const Scalar sign = inverse ? Scalar(-1) : Scalar(1);
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const Eigen::Index t = r % tokens;
    for (int h = 0; h < heads; ++h) {
      Scalar* first = x.row(r).data() + h * head_dim;
      for (Eigen::Index i = 0; i < pairs; ++i) {
        const Scalar c = table.cos(t, i), s = sign * table.sin(t, i);
        const Scalar a = first[i], b = first[i + pairs];
        first[i] = a * c - b * s;
        first[i + pairs] = b * c + a * s;
      }
    }
  }
}

// silu(x) = x sigma(x); silu'(x) = sigma(x) (1 + x (1 - sigma(x))) (Elfwing et al. 2018, Eq. 4-5).
template <typename Scalar>
void silu_forward(const Mat<Scalar>& x, Mat<Scalar>& y) {
  y = (x.array() / (Scalar(1) + (-x.array()).exp())).matrix();
}

template <typename Scalar>
void silu_backward(const Mat<Scalar>& x, const Mat<Scalar>& dy, Mat<Scalar>& dx) {
  const Eigen::Index tokens = x.rows();
  for (Eigen::Index r = 0; r < dy.rows(); ++r) {
    const auto in = x.row(r % tokens).array();
    const Eigen::Array<Scalar, 1, Eigen::Dynamic> sigmoid = Scalar(1) / (Scalar(1) + (-in).exp());
    dx.row(r).array() += dy.row(r).array() * sigmoid * (Scalar(1) + in * (Scalar(1) - sigmoid));
  }
}

#define GRADFLOW_INSTANTIATE_ROTARY(Scalar)                                                                \
  template void rotary_table<Scalar>(int, int, double, int, RotaryTable<Scalar>&, const RopeFrequencies&); \
  template void rotary_apply<Scalar>(const RotaryTable<Scalar>&, int, bool, Mat<Scalar>&);                 \
  template void silu_forward<Scalar>(const Mat<Scalar>&, Mat<Scalar>&);                                    \
  template void silu_backward<Scalar>(const Mat<Scalar>&, const Mat<Scalar>&, Mat<Scalar>&);
GRADFLOW_INSTANTIATE_ROTARY(float)
GRADFLOW_INSTANTIATE_ROTARY(double)

}  // namespace gradflow
