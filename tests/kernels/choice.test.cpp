// The speed layer's switch (kernels.hpp): every hand-written piece by default, the library path of
// each piece on request, and an unknown piece refused rather than ignored; the scope that flushes
// subnormals to zero.
#include <doctest/doctest.h>

#include <limits>

#include "gradflow/errors.hpp"
#include "gradflow/gemm.hpp"
#include "gradflow/kernels.hpp"

using namespace gradflow;

TEST_CASE("the kernel choice defaults to every hand-written piece the build has") {
  const KernelChoice choice = parse_kernel_choice("");
  CHECK(choice.tiled_products == kTiledMultiply);
  CHECK(choice.tiled_double_gram == kTiledMultiply);
  CHECK(choice.normal_packets);
  CHECK(choice.work_pool);
  CHECK(choice.flush_subnormals);
}

TEST_CASE("GRADFLOW_KERNELS names library paths one piece at a time or all at once") {
  const KernelChoice library = parse_kernel_choice("library");
  CHECK_FALSE(library.tiled_products);
  CHECK_FALSE(library.tiled_double_gram);
  CHECK_FALSE(library.normal_packets);
  CHECK_FALSE(library.work_pool);
  CHECK_FALSE(library.flush_subnormals);
  CHECK_FALSE(parse_kernel_choice("subnormals").flush_subnormals);
  CHECK(parse_kernel_choice("subnormals").work_pool);
  CHECK(parse_kernel_choice("normals,pool").flush_subnormals);
  const KernelChoice two = parse_kernel_choice("normals,pool");
  CHECK(two.tiled_products == kTiledMultiply);
  CHECK(two.tiled_double_gram == kTiledMultiply);
  CHECK_FALSE(parse_kernel_choice("gram").tiled_double_gram);
  CHECK(parse_kernel_choice("gram").tiled_products == kTiledMultiply);
  CHECK_FALSE(two.normal_packets);
  CHECK_FALSE(two.work_pool);
  CHECK_THROWS_AS(parse_kernel_choice("products,tiles"), InputError);
  CHECK_THROWS_AS(parse_kernel_choice("Library"), InputError);
}

namespace {
// x * y computed at run time (volatile: the compiler cannot fold it under the default mode).
float product(float x, float y) {
  volatile float a = x, b = y;
  return a * b;
}
}  // namespace

TEST_CASE("SubnormalsFlushed flushes subnormal results to zero in its scope only, on x86") {
  const float tiny = 1e-30f, small = 1e-10f;  // tiny * small = 1e-40: a subnormal float
  const unsigned before = float_mode();
  const float normal = product(tiny, 1e-5f);
  REQUIRE(product(tiny, small) != 0.0f);
  REQUIRE(product(tiny, small) < std::numeric_limits<float>::min());
  {
    const SubnormalsFlushed flush;
#if defined(__SSE__)
    if (kernel_choice().flush_subnormals) {
      CHECK(float_mode() != before);
      CHECK(product(tiny, small) == 0.0f);
      CHECK(product(tiny, 1e-5f) == normal);  // a normal result is untouched
    } else {
      CHECK(float_mode() == before);
      CHECK(product(tiny, small) != 0.0f);
    }
#else
    CHECK(float_mode() == before);
#endif
  }
  CHECK(float_mode() == before);
  CHECK(product(tiny, small) != 0.0f);
}
