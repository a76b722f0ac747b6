// The speed layer's one switch: which implementation each of gradflow's hand-written kernels runs
// on. Every op asks for "a product" or "a Gram matrix" (gemm.hpp), "these pieces on every core"
// (work_pool.hpp) or
// "normal draws" (rng.hpp); whether that runs on a hand-written piece or on the
// library path is decided here, for all of them. The hand-written pieces are kept because each was
// measured to pay (bench/kernels.py, whose table the issue-16 note reports); the library paths
// stay selectable so that the measurement can be repeated.
#pragma once
#include <string_view>

namespace gradflow {

struct KernelChoice {
  // Float products and Gram matrices on gradflow's AVX-512 register tiles (src/kernels/gemm.cpp), or on
  // Eigen's product (OpenBLAS's sgemm when built with it). Only AVX-512 builds have the tiles.
  bool tiled_products = true;
  // erank's double-precision Gram matrices (lower triangle) on gradflow's AVX-512 tile
  // (gram_lower_f64, src/kernels/gemm.cpp), or on Eigen's rank update (OpenBLAS's dsyrk). AVX-512 builds
  // only.
  bool tiled_double_gram = true;
  // The normal generator (src/rng.cpp) on AVX-512 packets: the counters, the Box-Muller radius
  // (specialised to the draws' domain) and the angle in registers, 16 pairs at a time; or in
  // compiler-vectorised loops with Eigen's vectorised log and sqrt. Same bits either way (tested).
  bool normal_packets = true;
  // An op's pieces on WorkPool's own workers (src/kernels/work_pool.cpp: one compare-and-swap per
  // piece, a futex between runs, the next sublayer's weights drawn while a thread would wait), or
  // as an OpenMP parallel loop per op (the weights then drawn when needed).
  bool work_pool = true;
};

// The choice every kernel reads. By default every hand-written piece that this build has;
// GRADFLOW_KERNELS=library in the environment (bench/kernels.py) selects every library path
// instead, or a comma-separated list of pieces does: products, gram, normals, pool. Read once, at first
// use.
const KernelChoice& kernel_choice();

// The choice that a GRADFLOW_KERNELS value names ("" for the defaults); throws
// InputError on an unknown piece.
KernelChoice parse_kernel_choice(std::string_view pieces);

// Every matrix product on the thread that calls it: OpenBLAS set to one thread and its worker pool
// joined. gradflow's work pool already uses every core, and a product that OpenBLAS split over its
// own threads could round differently with the thread count. This changes process-wide OpenBLAS
// state, so the library never calls it: the program does, once, at start-up (src/cli/main.cpp,
// tests/main.test.cpp). Without GRADFLOW_OPENBLAS it does nothing.
void use_single_threaded_blas();

}  // namespace gradflow
