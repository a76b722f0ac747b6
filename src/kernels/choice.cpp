// kernel_choice(): the hand-written pieces by default, library paths on request (kernels.hpp);
// the thread's floating-point mode (flushing subnormals); and the one call that reconfigures
// OpenBLAS, made by the CLI.
#include <cstdlib>
#include <string>
#include <string_view>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "gradflow/errors.hpp"
#include "gradflow/gemm.hpp"
#include "gradflow/kernels.hpp"

#if defined(GRADFLOW_OPENBLAS)
extern "C" {
void openblas_set_num_threads(int threads);
// The pthread build's own fork handler: joins its worker pool. Weak, since other builds of the
// library (serial, OpenMP) have no pool and no such symbol.
[[gnu::weak]] void blas_thread_shutdown_(void);
}
#endif

namespace gradflow {

KernelChoice parse_kernel_choice(std::string_view pieces) {
  KernelChoice choice;
  choice.tiled_products = kTiledMultiply;
  choice.tiled_double_gram = kTiledMultiply;
  while (!pieces.empty()) {
    const auto comma = pieces.find(',');
    const std::string_view piece = pieces.substr(0, comma);
    pieces = comma == std::string_view::npos ? std::string_view{} : pieces.substr(comma + 1);
    const bool all = piece == "library";
    if (!all && piece != "products" && piece != "gram" && piece != "normals" && piece != "pool" &&
        piece != "subnormals") {
      throw InputError("GRADFLOW_KERNELS: unknown piece '" + std::string(piece) +
                       "'; use library, or a comma-separated list of products, gram, normals, pool and "
                       "subnormals, or unset it");
    }
    if (all || piece == "products") choice.tiled_products = false;
    if (all || piece == "gram") choice.tiled_double_gram = false;
    if (all || piece == "normals") choice.normal_packets = false;
    if (all || piece == "pool") choice.work_pool = false;
    if (all || piece == "subnormals") choice.flush_subnormals = false;
  }
  return choice;
}

const KernelChoice& kernel_choice() {
  static const KernelChoice choice =
      parse_kernel_choice(std::getenv("GRADFLOW_KERNELS") ? std::getenv("GRADFLOW_KERNELS") : "");
  return choice;
}

#if defined(__SSE__)
// MXCSR bit 15 (FTZ: subnormal results become zero) and bit 6 (DAZ: subnormal operands are read as
// zero); Intel 64 and IA-32 Architectures Software Developer's Manual, Vol. 1, Sec. 10.2.3.
constexpr unsigned kFlushSubnormals = 0x8040u;
constexpr unsigned kExceptionFlags = 0x3Fu;  // bits 0-5: sticky status, not part of the mode
unsigned float_mode() {
  return _mm_getcsr() & ~kExceptionFlags;
}
void set_float_mode(unsigned mode) {
  _mm_setcsr((mode & ~kExceptionFlags) | (_mm_getcsr() & kExceptionFlags));
}
#else
constexpr unsigned kFlushSubnormals = 0u;
unsigned float_mode() {
  return 0u;
}
void set_float_mode(unsigned) {}
#endif

SubnormalsFlushed::SubnormalsFlushed() : saved_(float_mode()) {
  if (kFlushSubnormals != 0u && kernel_choice().flush_subnormals) set_float_mode(saved_ | kFlushSubnormals);
}

SubnormalsFlushed::~SubnormalsFlushed() {
  set_float_mode(saved_);
}

// The pthread build of OpenBLAS has started a worker per core by the time main runs, and an idle
// worker spins for about 0.1 s before it sleeps; with one thread per call the workers are never
// used, so they are joined (after which single-threaded calls run inline, as in a fork).
void use_single_threaded_blas() {
#if defined(GRADFLOW_OPENBLAS)
  openblas_set_num_threads(1);
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
#endif
}

}  // namespace gradflow
