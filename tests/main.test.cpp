// doctest's runner for the gradflow_tests target. Products run on the calling thread, as in the
// CLI (kernels.hpp, use_single_threaded_blas).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "gradflow/kernels.hpp"

int main(int argc, char** argv) {
  gradflow::use_single_threaded_blas();
  return doctest::Context(argc, argv).run();
}
