// Normalisation ops: RMSNorm, LayerNorm, DyT and nGPT's unit normalisation, forward and backward.
#include <cmath>

#include "gradflow/ops.hpp"

namespace gradflow {

template <typename Scalar>
void norm_forward(NormKind kind, int groups, const Mat<Scalar>& x, Mat<Scalar>& y, Mat<Scalar>& inv_scale,
                  double norm_eps) {
  const Eigen::Index tokens = x.rows(), group_size = x.cols() / groups;
  const Scalar eps = static_cast<Scalar>(norm_eps), alpha = static_cast<Scalar>(kDytAlpha);
  y.resize(x.rows(), x.cols());
  inv_scale.resize(tokens, groups);
  for (Eigen::Index t = 0; t < tokens; ++t) {
    for (int g = 0; g < groups; ++g) {
      const auto xs = x.row(t).segment(g * group_size, group_size);
      auto ys = y.row(t).segment(g * group_size, group_size);
      switch (kind) {
        case NormKind::rms: {
          const Scalar inv = Scalar(1) / std::sqrt(xs.squaredNorm() / Scalar(group_size) + eps);
          ys = xs * inv;
          inv_scale(t, g) = inv;
          break;
        }
        case NormKind::layer: {
          const Scalar mean = xs.mean();
          ys = xs.array() - mean;
          const Scalar inv = Scalar(1) / std::sqrt(ys.squaredNorm() / Scalar(group_size) + eps);
          ys *= inv;
          inv_scale(t, g) = inv;
          break;
        }
        case NormKind::dyt:
          ys = (alpha * xs.array()).tanh().matrix();
          inv_scale(t, g) = Scalar(1);
          break;
      }
    }
  }
}

template <typename Scalar>
void norm_backward(NormKind kind, int groups, const Mat<Scalar>& y, const Mat<Scalar>& inv_scale,
                   const Mat<Scalar>& dy, Mat<Scalar>& dx) {
  const Eigen::Index tokens = y.rows(), group_size = y.cols() / groups;
  const Scalar alpha = static_cast<Scalar>(kDytAlpha);
  for (Eigen::Index r = 0; r < dy.rows(); ++r) {
    const Eigen::Index t = r % tokens;
    for (int g = 0; g < groups; ++g) {
      const auto ys = y.row(t).segment(g * group_size, group_size);
      const auto dys = dy.row(r).segment(g * group_size, group_size);
      auto dxs = dx.row(r).segment(g * group_size, group_size);
      const Scalar inv = inv_scale(t, g);
      switch (kind) {
        case NormKind::rms:  // dx = inv (dy - y mean(dy y))
          dxs += inv * (dys - ys * (dys.dot(ys) / Scalar(group_size)));
          break;
        case NormKind::layer:  // dx = inv (dy - mean(dy) - y mean(dy y))
          dxs += inv * ((dys.array() - dys.mean()).matrix() - ys * (dys.dot(ys) / Scalar(group_size)));
          break;
        case NormKind::dyt:  // dx = dy alpha (1 - y^2)
          dxs += (dys.array() * alpha * (Scalar(1) - ys.array().square())).matrix();
          break;
      }
    }
  }
}

template <typename Scalar>
void unit_rows_forward(int groups, const Mat<Scalar>& x, Mat<Scalar>& y, Mat<Scalar>& inv_norm) {
  const Eigen::Index tokens = x.rows(), group_size = x.cols() / groups;
  y.resize(x.rows(), x.cols());
  inv_norm.resize(tokens, groups);
  for (Eigen::Index t = 0; t < tokens; ++t) {
    for (int g = 0; g < groups; ++g) {
      const auto xs = x.row(t).segment(g * group_size, group_size);
      const Scalar inv = Scalar(1) / std::max(xs.norm(), static_cast<Scalar>(kUnitFloor));
      y.row(t).segment(g * group_size, group_size) = xs * inv;
      inv_norm(t, g) = inv;
    }
  }
}

template <typename Scalar>
void unit_rows_backward(int groups, const Mat<Scalar>& y, const Mat<Scalar>& inv_norm, const Mat<Scalar>& dy,
                        Mat<Scalar>& dx) {
  const Eigen::Index tokens = y.rows(), group_size = y.cols() / groups;
  for (Eigen::Index r = 0; r < dy.rows(); ++r) {
    const Eigen::Index t = r % tokens;
    for (int g = 0; g < groups; ++g) {
      const auto ys = y.row(t).segment(g * group_size, group_size);
      const auto dys = dy.row(r).segment(g * group_size, group_size);
      const Scalar inv = inv_norm(t, g);
      // Below the floor the map is x * constant, so only the projection term drops out.
      const bool clamped = inv == Scalar(1) / static_cast<Scalar>(kUnitFloor);
      if (clamped) {
        dx.row(r).segment(g * group_size, group_size) += inv * dys;
      } else {  // dx = (dy - y (y . dy)) / norm(x)
        dx.row(r).segment(g * group_size, group_size) += inv * (dys - ys * ys.dot(dys));
      }
    }
  }
}

#define GRADFLOW_INSTANTIATE_NORM(Scalar)                                                                    \
  template void norm_forward<Scalar>(NormKind, int, const Mat<Scalar>&, Mat<Scalar>&, Mat<Scalar>&, double); \
  template void norm_backward<Scalar>(NormKind, int, const Mat<Scalar>&, const Mat<Scalar>&,                 \
                                      const Mat<Scalar>&, Mat<Scalar>&);                                     \
  template void unit_rows_forward<Scalar>(int, const Mat<Scalar>&, Mat<Scalar>&, Mat<Scalar>&);              \
  template void unit_rows_backward<Scalar>(int, const Mat<Scalar>&, const Mat<Scalar>&, const Mat<Scalar>&,  \
                                           Mat<Scalar>&);
GRADFLOW_INSTANTIATE_NORM(float)
GRADFLOW_INSTANTIATE_NORM(double)

}  // namespace gradflow
