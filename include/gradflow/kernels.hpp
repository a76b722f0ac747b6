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
  // Every vector-Jacobian product with subnormal numbers flushed to zero (x86's FTZ and DAZ flags,
  // SubnormalsFlushed below), or with IEEE gradual underflow. The backward pass renormalises its
  // cotangent at every state, yet single entries of it can fall below float's smallest normal
  // (2^-126, about 1.2e-38), e.g. the tokens whose gradient Post-LN damps fastest. Each operation
  // on a subnormal then takes a microcode assist of about a hundred cycles: Post-LN's backward at
  // depth 1024 ran 17x slower than Pre-LN's. Such an entry is below 2^-126 of its cotangent's norm:
  // flushing it changed no figure of any placement at depths 256 and 1024 but plain's, whose forward
  // states are themselves subnormal once it has collapsed (tests/cli/test_subnormals.py).
  bool flush_subnormals = true;
};

// The choice every kernel reads. By default every hand-written piece that this build has;
// GRADFLOW_KERNELS=library in the environment (bench/kernels.py) selects every library path
// instead, or a comma-separated list of pieces does: products, gram, normals, pool, subnormals (the
// last keeps gradual underflow). Read once, at first use.
const KernelChoice& kernel_choice();

// The choice that a GRADFLOW_KERNELS value names ("" for the defaults); throws
// InputError on an unknown piece.
KernelChoice parse_kernel_choice(std::string_view pieces);

// The calling thread's floating-point mode (x86: the MXCSR register; 0 on other processors) and
// setting it. WorkPool runs every piece in the mode of the thread that called run(), so a mode set
// around an op holds on every core and the figures stay the same for any --threads.
unsigned float_mode();
void set_float_mode(unsigned mode);

// Within its scope the calling thread, and the pool pieces it runs, treats subnormal operands as
// zero and flushes subnormal results to zero (x86's DAZ and FTZ), when
// kernel_choice().flush_subnormals; otherwise, and on other processors, it changes nothing. The
// previous mode is restored at the end, so a caller (the Python module's interpreter) never sees it.
class SubnormalsFlushed {
 public:
  SubnormalsFlushed();
  ~SubnormalsFlushed();
  SubnormalsFlushed(const SubnormalsFlushed&) = delete;
  SubnormalsFlushed& operator=(const SubnormalsFlushed&) = delete;

 private:
  unsigned saved_;
};

// Every matrix product on the thread that calls it: OpenBLAS set to one thread and its worker pool
// joined. gradflow's work pool already uses every core, and a product that OpenBLAS split over its
// own threads could round differently with the thread count. This changes process-wide OpenBLAS
// state, so the library never calls it: the program does, once, at start-up (src/cli/main.cpp,
// tests/main.test.cpp). Without GRADFLOW_OPENBLAS it does nothing.
void use_single_threaded_blas();

}  // namespace gradflow
