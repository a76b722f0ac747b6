// The float32 GEMM roofline that gradflow's achieved GFLOP/s is compared with: Eigen's own
// (threaded) GEMM on large square matrices, and single-threaded at the sublayer's shape.
// Prints JSON: {"large": {"1": GF, "2": GF}, "sublayer_shape_1thread": GF}.
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {
double best_gflops(int m, int k, int n, int threads, int repeats) {
  Eigen::setNbThreads(threads);
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Mat a = Mat::Random(m, k), b = Mat::Random(k, n);
  Mat c(m, n);
  c.noalias() = a * b;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * m * k * n / seconds / 1e9);
  }
  return best;
}
}  // namespace

int main() {
  const double one = best_gflops(2048, 2048, 2048, 1, 5), two = best_gflops(2048, 2048, 2048, 2, 5);
  const double sublayer = best_gflops(64, 256, 1024, 1, 2000);
  std::printf("{\"large\": {\"1\": %.1f, \"2\": %.1f}, \"sublayer_shape_1thread\": %.1f}\n", one, two,
              sublayer);
}
