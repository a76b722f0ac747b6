// Row-major matrix products for the sublayers, C = A B, A B^T and A^T B.
//
// In float on AVX-512, register-tiled kernels (src/kernels/gemm.cpp) that read B where it lies: a BLAS
// copies ("packs") the whole weight matrix into its own layout on every call, and with T = 64
// token rows that copy costs a fifth of the multiply. The tiles make each entry of C one sum over k
// in increasing order, so their bits do not depend on how C is split into column blocks. Other
// builds, double products and column-major operands go to Eigen's product (OpenBLAS when built with
// it), whose bits can depend on the block width; results still do not depend on the thread count,
// because an op's pieces are the same column blocks on one thread or sixteen (work_pool.hpp).
#pragma once
#include <Eigen/Core>
#include <type_traits>

#include "gradflow/kernels.hpp"

namespace gradflow {

// Which product multiply_f32 forms: C = A B, A B^T or A^T B.
enum class Operands { a_b, a_bt, at_b };

// C (+)= A B with A (m, k), B (k, n); C (+)= A B^T with B (n, k); or C (+)= A^T B with A (k, m).
// C is (m, n). Row-major with unit column stride; ld* are the row strides in elements. AVX-512
// builds only (the register tiles); each entry is one sum over k in order.
void multiply_f32(const float* a, Eigen::Index lda, const float* b, Eigen::Index ldb, float* c,
                  Eigen::Index ldc, Eigen::Index m, Eigen::Index n, Eigen::Index k, Operands operands,
                  bool accumulate);

// The lower triangle of C = A A^T, A (m, k), C (m, m); tiles wholly above the diagonal are
// skipped, so the rest of C above it is left partly unwritten. AVX-512 builds only.
void gram_lower_f32(const float* a, Eigen::Index lda, float* c, Eigen::Index ldc, Eigen::Index m,
                    Eigen::Index k);

// The lower triangle of C = A A^T in double, A (m, k) and C (m, m) column-major (Eigen's default
// layout; the representation figures' Gram matrices): each entry one sum over k in order. Tiles
// wholly above the diagonal are skipped, so above it C holds the Gram's entries or zeros. AVX-512
// builds only.
void gram_lower_f64(const double* a, Eigen::Index lda, double* c, Eigen::Index ldc, Eigen::Index m,
                    Eigen::Index k);

#if defined(__AVX512F__)
inline constexpr bool kTiledMultiply = true;
#else
inline constexpr bool kTiledMultiply = false;
#endif

namespace detail {
template <Operands Form, typename A, typename B, typename C>
void multiply(const A& a, const B& b, C&& c, bool accumulate) {
  using Scalar = typename std::decay_t<C>::Scalar;
  if constexpr (std::is_same_v<Scalar, float> && A::IsRowMajor && B::IsRowMajor &&
                std::decay_t<C>::IsRowMajor && A::InnerStrideAtCompileTime == 1 &&
                B::InnerStrideAtCompileTime == 1 && std::decay_t<C>::InnerStrideAtCompileTime == 1) {
    const Eigen::Index k = Form == Operands::at_b ? a.rows() : a.cols();
    eigen_assert(k == (Form == Operands::a_bt ? b.cols() : b.rows()));
    eigen_assert(c.rows() == (Form == Operands::at_b ? a.cols() : a.rows()));
    eigen_assert(c.cols() == (Form == Operands::a_bt ? b.rows() : b.cols()));
    if (kernel_choice().tiled_products) {  // false on builds without the tiles
      multiply_f32(a.data(), a.outerStride(), b.data(), b.outerStride(), c.data(), c.outerStride(), c.rows(),
                   c.cols(), k, Form, accumulate);
      return;
    }
  }
  const auto product = [&](const auto& left, const auto& right) {
    if (accumulate) {
      c.noalias() += left * right;
    } else {
      c.noalias() = left * right;
    }
  };
  if constexpr (Form == Operands::a_b) product(a, b);
  if constexpr (Form == Operands::a_bt) product(a, b.transpose());
  if constexpr (Form == Operands::at_b) product(a.transpose(), b);
}
}  // namespace detail

// c = a b, or c += a b with accumulate. c must already have its shape.
template <typename A, typename B, typename C>
void multiply(const A& a, const B& b, C&& c, bool accumulate = false) {
  detail::multiply<Operands::a_b>(a, b, c, accumulate);
}

// c = a b^T, or c += a b^T with accumulate. c must already have its shape.
template <typename A, typename B, typename C>
void multiply_transposed(const A& a, const B& b, C&& c, bool accumulate = false) {
  detail::multiply<Operands::a_bt>(a, b, c, accumulate);
}

// c = a^T b, or c += a^T b with accumulate. c must already have its shape.
template <typename A, typename B, typename C>
void multiply_first_transposed(const A& a, const B& b, C&& c, bool accumulate = false) {
  detail::multiply<Operands::at_b>(a, b, c, accumulate);
}

}  // namespace gradflow
