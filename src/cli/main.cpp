// gradflow's entry point: one command line (run_cli.cpp), its line on stderr, its exit code.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gradflow/kernels.hpp"

int main(int argc, char** argv) {
  gradflow::use_single_threaded_blas();  // the library leaves OpenBLAS's threads alone (kernels.hpp)
  gradflow::cli::install_signal_cleanup();
  const gradflow::cli::CliOutcome outcome = gradflow::cli::run_cli(argv[0], {argv + 1, argv + argc}, nullptr);
  if (!outcome.message.empty()) std::fprintf(stderr, "%s\n", outcome.message.c_str());
  return outcome.code;
}
