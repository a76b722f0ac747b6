// The float32 GEMM roofline that gradflow's achieved GFLOP/s is compared with: the faster of
// Eigen's own GEMM and OpenBLAS's sgemm (which gradflow's products run on when built with
// GRADFLOW_OPENBLAS), threaded, on large square matrices; and single-threaded at a sublayer's
// shape. Prints JSON: {"large": {"1": GF, "2": GF}, "eigen": {...}, "openblas": {...},
// "sublayer_shape_1thread": GF}, where "large" is the better of the two libraries.
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>

#if defined(GRADFLOW_OPENBLAS)
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void openblas_set_num_threads(int threads);
}
#endif

namespace {
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;  // column-major, as BLAS

template <typename Product>
double best_gflops(int m, int k, int n, int repeats, Product&& product) {
  const Mat a = Mat::Random(m, k), b = Mat::Random(k, n);
  Mat c(m, n);
  product(a, b, c);  // warm-up
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    product(a, b, c);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * m * k * n / seconds / 1e9);
  }
  return best;
}

double eigen_gflops(int m, int k, int n, int threads, int repeats) {
  Eigen::setNbThreads(threads);
  return best_gflops(m, k, n, repeats, [](const Mat& a, const Mat& b, Mat& c) { c.noalias() = a * b; });
}

double openblas_gflops([[maybe_unused]] int m, [[maybe_unused]] int k, [[maybe_unused]] int n,
                       [[maybe_unused]] int threads, [[maybe_unused]] int repeats) {
#if defined(GRADFLOW_OPENBLAS)
  openblas_set_num_threads(threads);
  return best_gflops(m, k, n, repeats, [](const Mat& a, const Mat& b, Mat& c) {
    const int rows = static_cast<int>(a.rows()), cols = static_cast<int>(b.cols()),
              depth = static_cast<int>(a.cols());
    const float one = 1, zero = 0;
    sgemm_("N", "N", &rows, &cols, &depth, &one, a.data(), &rows, b.data(), &depth, &zero, c.data(), &rows);
  });
#else
  return 0;
#endif
}
}  // namespace

int main() {
  const double eigen_one = eigen_gflops(2048, 2048, 2048, 1, 5),
               eigen_two = eigen_gflops(2048, 2048, 2048, 2, 5);
  const double blas_one = openblas_gflops(2048, 2048, 2048, 1, 5),
               blas_two = openblas_gflops(2048, 2048, 2048, 2, 5);
  const double sublayer =
      std::max(eigen_gflops(64, 256, 1024, 1, 2000), openblas_gflops(64, 256, 1024, 1, 2000));
  std::printf(
      "{\"large\": {\"1\": %.1f, \"2\": %.1f}, \"eigen\": {\"1\": %.1f, \"2\": %.1f}, \"openblas\": {\"1\": "
      "%.1f, "
      "\"2\": %.1f}, \"sublayer_shape_1thread\": %.1f}\n",
      std::max(eigen_one, blas_one), std::max(eigen_two, blas_two), eigen_one, eigen_two, blas_one, blas_two,
      sublayer);
}
