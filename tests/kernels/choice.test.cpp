// The speed layer's switch (kernels.hpp): every hand-written piece by default, the library path of
// each piece on request, and an unknown piece refused rather than ignored.
#include <doctest/doctest.h>

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
}

TEST_CASE("GRADFLOW_KERNELS names library paths one piece at a time or all at once") {
  const KernelChoice library = parse_kernel_choice("library");
  CHECK_FALSE(library.tiled_products);
  CHECK_FALSE(library.tiled_double_gram);
  CHECK_FALSE(library.normal_packets);
  CHECK_FALSE(library.work_pool);
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
