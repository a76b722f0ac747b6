// The float32 GEMM roofline that gradflow's achieved GFLOP/s is compared with: the fastest GEMM
// measured here, of Eigen's own, OpenBLAS's sgemm (GRADFLOW_OPENBLAS) and gradflow's tiled kernel
// (gemm.hpp, which its weight products run on), each on large square matrices (2048^3) and at a
// sublayer's shape (64 x 256 x 1024 per thread, operands hot in cache), on 1 and 2 threads. Eigen
// and OpenBLAS use their own threading; the tiled kernel's two threads each take a column half,
// as gradflow's shards do. Prints JSON: {"roofline": {"1": GF, "2": GF}, "large": {library:
// {"1": GF, "2": GF}}, "sublayer": {library: {"1": GF, "2": GF}}}.
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "gradflow/gemm.hpp"

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
// gradflow's tiled kernel on row-major operands; with two threads each computes a column half of C.
// The best repeat's GFLOP/s, or with `sustained` all repeats' FLOPs over their total time.
double tiled_gflops_of(int m, int k, int n, int threads, int repeats, bool sustained) {
  if (!gradflow::kTiledMultiply) return 0;
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const RowMat a = RowMat::Random(m, k), b = RowMat::Random(k, n);
  RowMat c(m, n);
  double best = 0, total_seconds = 0;
  for (int r = 0; r <= repeats; ++r) {  // the first run warms up
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int part = omp_get_thread_num(), parts = omp_get_num_threads();
      const int begin = n * part / parts, end = n * (part + 1) / parts;
      gradflow::multiply(a, b.middleCols(begin, end - begin), c.middleCols(begin, end - begin));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == 0) continue;
    best = std::max(best, 2.0 * m * k * n / seconds / 1e9);
    total_seconds += seconds;
  }
  return sustained ? 2.0 * m * k * n * repeats / total_seconds / 1e9 : best;
}
double tiled_gflops(int m, int k, int n, int threads, int repeats) {
  return tiled_gflops_of(m, k, n, threads, repeats, false);
}
}  // namespace

int main(int argc, char** argv) {
  // --probe: only gradflow's kernel at a sublayer's shape on 1 and 2 threads, sustained over about
  // a second each: bench.py runs it every round to record how fast the machine is at that moment
  // (a host that puts both vCPUs on one physical core halves the 2-thread figure).
  if (argc > 1 && std::strcmp(argv[1], "--probe") == 0) {
    std::printf("{\"1\": %.1f, \"2\": %.1f}\n", tiled_gflops_of(64, 256, 1024, 1, 3000, true),
                tiled_gflops_of(64, 256, 2048, 2, 3000, true));
    return 0;
  }
  struct Measured {
    double one, two;
  };
  // Each library on 1 and 2 threads: 2048^3, and a sublayer's 64 x 256 x 1024 per thread (two
  // threads share a product twice as wide).
  const auto large = [](auto&& gflops) {
    return Measured{gflops(2048, 2048, 2048, 1, 5), gflops(2048, 2048, 2048, 2, 5)};
  };
  const auto sublayer = [](auto&& gflops) {
    return Measured{gflops(64, 256, 1024, 1, 2000), gflops(64, 256, 2048, 2, 2000)};
  };
  struct Library {
    const char* name;
    Measured large, sublayer;
  };
  const Library libraries[] = {{"eigen", large(eigen_gflops), sublayer(eigen_gflops)},
                               {"openblas", large(openblas_gflops), sublayer(openblas_gflops)},
                               {"tiled", large(tiled_gflops), sublayer(tiled_gflops)}};
  double roofline_one = 0, roofline_two = 0;
  for (const Library& library : libraries) {
    roofline_one = std::max({roofline_one, library.large.one, library.sublayer.one});
    roofline_two = std::max({roofline_two, library.large.two, library.sublayer.two});
  }
  std::printf("{\"roofline\": {\"1\": %.1f, \"2\": %.1f}", roofline_one, roofline_two);
  for (const auto& [group, member] :
       {std::pair{"large", &Library::large}, std::pair{"sublayer", &Library::sublayer}}) {
    std::printf(", \"%s\": {", group);
    for (const Library& library : libraries) {
      const Measured& m = library.*member;
      std::printf("%s\"%s\": {\"1\": %.1f, \"2\": %.1f}", &library == libraries ? "" : ", ", library.name,
                  m.one, m.two);
    }
    std::printf("}");
  }
  std::printf("}\n");
}
