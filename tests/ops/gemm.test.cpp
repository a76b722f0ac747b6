// The weight products (gemm.hpp): C = A B and C = A B^T on row-major blocks, against a naive
// triple-loop product in double (no Eigen product, so the library path is not checked against
// itself), over shapes that leave partial tiles on every side, strided blocks and k = 0; and each
// entry's bits independent of how C is split, which the ops' column-block pieces rely on. Every
// test asserts on every build: where a property belongs to the AVX-512 tiles only, builds without
// them say so in a MESSAGE and check what the library path does promise.
#include "gradflow/gemm.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "gradflow/ops.hpp"
#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
Mat<float> random_float(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  return random_matrix(rows, cols, seed, 1.0).cast<float>();
}

// Largest |got - want| relative to the sum of |a_ip| |b_pj| of that entry (the scale of its
// rounding error), with want = A B (+ initial) by a naive triple loop in double: float products
// are exact in double and k <= 300 sums lose nothing near float's 6e-8, so want is the exact
// product to far better than the 1e-6 bound. A NaN in got counts as the worst error.
double worst_relative_error(const Mat<float>& a, const Mat<float>& b, const Mat<float>& got,
                            const Mat<float>& initial, bool accumulate) {
  double worst = 0;
  for (Eigen::Index i = 0; i < got.rows(); ++i) {
    for (Eigen::Index j = 0; j < got.cols(); ++j) {
      double want = accumulate ? static_cast<double>(initial(i, j)) : 0.0, scale = std::abs(want);
      for (Eigen::Index p = 0; p < a.cols(); ++p) {
        want += static_cast<double>(a(i, p)) * static_cast<double>(b(p, j));
        scale += std::abs(static_cast<double>(a(i, p)) * static_cast<double>(b(p, j)));
      }
      const double error = std::abs(got(i, j) - want) / std::max(scale, 1e-30);
      if (!(error <= worst)) worst = std::isnan(error) ? HUGE_VAL : error;
    }
  }
  return worst;
}
}  // namespace

TEST_CASE(
    "multiply, multiply_transposed and multiply_first_transposed agree with a double product on every tile "
    "edge") {
  const Eigen::Index ms[] = {1, 7, 8, 9, 17, 33, 64, 70};
  const Eigen::Index ns[] = {1, 15, 16, 17, 31, 32, 33, 100};
  const Eigen::Index ks[] = {0, 1, 5, 16, 31, 64};
  unsigned seed = 1;
  int cases = 0;
  for (const Eigen::Index m : ms) {
    for (const Eigen::Index n : ns) {
      for (const Eigen::Index k : ks) {
        for (const bool accumulate : {false, true}) {
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(accumulate);
          // Operands as blocks of wider matrices, so that every row stride exceeds the width.
          const Mat<float> a_wide = random_float(m, k + 3, seed++), b_wide = random_float(k, n + 5, seed++);
          const Mat<float> b_t_wide = random_float(n, k + 2, seed++);
          const Mat<float> initial = random_float(m, n, seed++);
          const auto a = a_wide.leftCols(k);
          const auto b = b_wide.middleCols(2, n);
          Mat<float> c_wide = random_float(m, n + 4, seed++);
          c_wide.middleCols(1, n) = initial;
          multiply(a, b, c_wide.middleCols(1, n), accumulate);
          CHECK(worst_relative_error(a, b, c_wide.middleCols(1, n), initial, accumulate) < 1e-6);

          c_wide.middleCols(1, n) = initial;
          multiply_transposed(a, b_t_wide.leftCols(k), c_wide.middleCols(1, n), accumulate);
          const Mat<float> b_t = b_t_wide.leftCols(k).transpose();
          CHECK(worst_relative_error(a, b_t, c_wide.middleCols(1, n), initial, accumulate) < 1e-6);

          const Mat<float> a_t_wide = random_float(k, m + 6, seed++);  // A^T B with A^T a strided block
          c_wide.middleCols(1, n) = initial;
          multiply_first_transposed(a_t_wide.middleCols(3, m), b, c_wide.middleCols(1, n), accumulate);
          const Mat<float> a_from_t = a_t_wide.middleCols(3, m).transpose();
          CHECK(worst_relative_error(a_from_t, b, c_wide.middleCols(1, n), initial, accumulate) < 1e-6);
          ++cases;
        }
      }
    }
  }
  CHECK(cases == 8 * 8 * 6 * 2);
}

TEST_CASE("the three products write nothing outside C") {
  const Mat<float> a = random_float(9, 20, 1), b = random_float(20, 33, 2), b_t = random_float(33, 20, 3);
  Mat<float> c = Mat<float>::Constant(11, 37, 7.0f);
  multiply(a, b, c.block(1, 2, 9, 33));
  Mat<float> outside = c;
  outside.block(1, 2, 9, 33).setConstant(7.0f);
  CHECK((outside.array() == 7.0f).all());
  c.setConstant(7.0f);
  multiply_transposed(a, b_t, c.block(1, 2, 9, 33), true);
  outside = c;
  outside.block(1, 2, 9, 33).setConstant(7.0f);
  CHECK((outside.array() == 7.0f).all());
  c.setConstant(7.0f);
  const Mat<float> a_t = a.transpose();
  multiply_first_transposed(a_t, b, c.block(1, 2, 9, 33));
  outside = c;
  outside.block(1, 2, 9, 33).setConstant(7.0f);
  CHECK((outside.array() == 7.0f).all());
}

TEST_CASE("each entry of a product on the tiles has the same bits however C is split into column blocks") {
  // A property of the AVX-512 tiles (one in-order sum per entry). The library path (portable builds,
  // GRADFLOW_KERNELS=library or products) does not promise it; results there still do not depend on
  // the thread count because an op's pieces are the same column blocks on one thread or sixteen
  // (tests/ops/thread_counts.test.cpp). So on every build each split product is checked against the
  // naive double product, and a repeated product of the same block against the first one bit for
  // bit (what the thread-count independence rests on); on the tiles, whole and split agree bit for bit.
  const bool tiles = kernel_choice().tiled_products;
  if (!tiles) {
    MESSAGE(
        "this build's float products run on the library path (no AVX-512 tiles, or GRADFLOW_KERNELS "
        "names products): split-invariance of the bits is not promised there and is not checked; "
        "each split product is checked against a naive double product and for repeatability");
  }
  const Mat<float> a = random_float(64, 256, 11), b = random_float(256, 1024, 12),
                   b_t = random_float(1024, 256, 13);
  const Mat<float> b_from_t = b_t.transpose(), none(0, 0);
  Mat<float> whole(64, 1024), split(64, 1024), whole_t(64, 1024), split_t(64, 1024), again(64, 1024),
      again_t(64, 1024);
  multiply(a, b, whole);
  multiply_transposed(a, b_t, whole_t);
  CHECK(worst_relative_error(a, b, whole, none, false) < 1e-6);
  CHECK(worst_relative_error(a, b_from_t, whole_t, none, false) < 1e-6);
  for (const Eigen::Index cut : {Eigen::Index(1), Eigen::Index(200), Eigen::Index(512), Eigen::Index(1000)}) {
    CAPTURE(cut);
    multiply(a, b.leftCols(cut), split.leftCols(cut));
    multiply(a, b.rightCols(1024 - cut), split.rightCols(1024 - cut));
    multiply_transposed(a, b_t.topRows(cut), split_t.leftCols(cut));
    multiply_transposed(a, b_t.bottomRows(1024 - cut), split_t.rightCols(1024 - cut));
    CHECK(worst_relative_error(a, b, split, none, false) < 1e-6);
    CHECK(worst_relative_error(a, b_from_t, split_t, none, false) < 1e-6);
    multiply(a, b.leftCols(cut), again.leftCols(cut));
    multiply(a, b.rightCols(1024 - cut), again.rightCols(1024 - cut));
    multiply_transposed(a, b_t.topRows(cut), again_t.leftCols(cut));
    multiply_transposed(a, b_t.bottomRows(1024 - cut), again_t.rightCols(1024 - cut));
    CHECK(std::memcmp(again.data(), split.data(), sizeof(float) * split.size()) == 0);
    CHECK(std::memcmp(again_t.data(), split_t.data(), sizeof(float) * split_t.size()) == 0);
    if (tiles) {
      CHECK(std::memcmp(whole.data(), split.data(), sizeof(float) * whole.size()) == 0);
      CHECK(std::memcmp(whole_t.data(), split_t.data(), sizeof(float) * whole_t.size()) == 0);
    }
  }
}

TEST_CASE("lower_gram's lower triangle is the Gram matrix, in float and double") {
  for (const Eigen::Index m : {1, 7, 8, 33, 64, 70}) {
    for (const Eigen::Index k : {0, 5, 64, 300}) {
      CAPTURE(m);
      CAPTURE(k);
      const Mat<float> wide = random_float(m, k + 7, static_cast<unsigned>(m * 1000 + k));
      const Mat<float> rows = wide.leftCols(k);
      Mat<float> gram = Mat<float>::Constant(m, m, 1e30f);
      lower_gram<float>(wide.leftCols(k), gram);
      const Eigen::MatrixXd want = rows.cast<double>() * rows.cast<double>().transpose();
      const Eigen::MatrixXd scale =
          rows.cast<double>().cwiseAbs() * rows.cast<double>().cwiseAbs().transpose();
      double worst = 0;
      for (Eigen::Index i = 0; i < m; ++i) {
        for (Eigen::Index j = 0; j <= i; ++j) {
          worst = std::max(worst, std::abs(gram(i, j) - want(i, j)) / std::max(scale(i, j), 1e-30));
        }
      }
      CHECK(worst < 1e-6);
      Mat<double> gram_double;
      lower_gram<double>(rows.cast<double>(), gram_double);
      CHECK(gram_double.triangularView<Eigen::Lower>().toDenseMatrix().isApprox(
          want.triangularView<Eigen::Lower>().toDenseMatrix(), 1e-12));
      CHECK(symmetric_inner(gram, gram) ==
            doctest::Approx(symmetric_inner(gram_double, gram_double)).epsilon(1e-5));
    }
  }
}

TEST_CASE("gram_lower_f64 is the in-order sum of each lower entry, and above it that sum or zero") {
  if (!kTiledMultiply) {
    // Builds without AVX-512 have no hand-written double Gram kernel: gram_lower_f64 is a stub that
    // must refuse rather than return garbage, and effective_rank (representation.cpp) takes Eigen's
    // rank update instead, checked in tests/science/representation_figures.test.cpp.
    MESSAGE("this build has no hand-written gram_lower_f64 kernel (no AVX-512): only its refusal is checked");
    const Eigen::MatrixXd a = random_matrix(3, 4, 1, 1.0);
    Eigen::MatrixXd c(3, 3);
    CHECK_THROWS_AS(gram_lower_f64(a.data(), a.outerStride(), c.data(), c.outerStride(), 3, 4),
                    std::logic_error);
    return;
  }
  for (const Eigen::Index m : {1, 7, 8, 9, 16, 17, 33, 64, 70}) {
    for (const Eigen::Index k : {0, 1, 5, 256, 300}) {
      CAPTURE(m);
      CAPTURE(k);
      // A (m, k) column-major inside a taller block (lda > m), C inside a taller block too.
      const Eigen::MatrixXd tall = random_matrix(m + 5, k, static_cast<unsigned>(m * 100 + k), 1.0);
      Eigen::MatrixXd c = Eigen::MatrixXd::Constant(m + 3, m, 1e300);
      gram_lower_f64(tall.data(), tall.outerStride(), c.data(), c.outerStride(), m, k);
      bool exact = true, sum_or_zero_above = true, untouched_below = true;
      for (Eigen::Index j = 0; j < m; ++j) {
        for (Eigen::Index i = 0; i < m; ++i) {
          double sum = 0;  // the kernel's order: p ascending, one fused multiply-add each
          for (Eigen::Index p = 0; p < k; ++p) sum = std::fma(tall(i, p), tall(j, p), sum);
          if (i >= j) exact = exact && c(i, j) == sum;
          if (i < j) sum_or_zero_above = sum_or_zero_above && (c(i, j) == sum || c(i, j) == 0.0);
        }
        for (Eigen::Index i = m; i < m + 3; ++i) untouched_below = untouched_below && c(i, j) == 1e300;
      }
      CHECK(exact);
      CHECK(sum_or_zero_above);
      CHECK(untouched_below);
    }
  }
}

TEST_CASE("the double-precision products are Eigen's") {
  const Mat<double> a = random_matrix(7, 19, 21, 1.0), b = random_matrix(19, 5, 22, 1.0),
                    b_t = random_matrix(5, 19, 23, 1.0);
  Mat<double> c(7, 5), want = a * b;
  multiply(a, b, c);
  CHECK((c - want).cwiseAbs().maxCoeff() < 1e-14);
  multiply_transposed(a, b_t, c, false);
  want = a * b_t.transpose();
  CHECK((c - want).cwiseAbs().maxCoeff() < 1e-14);
  const Mat<double> a_t = a.transpose();
  multiply_first_transposed(a_t, b, c);
  want = a * b;
  CHECK((c - want).cwiseAbs().maxCoeff() < 1e-14);
}
