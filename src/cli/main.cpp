// gradflow's entry point: one command line (run_cli.cpp), its line on stderr, its exit code.
#include <alloca.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gradflow/kernels.hpp"

namespace {
// OpenBLAS starts its thread pool in its library constructor, before main. Under an address-space
// limit (ulimit -v below about 200 MB) that start-up retries a failing 128 MB allocation forever,
// so even --version hung. gradflow runs OpenBLAS single-threaded anyway (use_single_threaded_blas),
// so the pool is never used. The environment must say so before the constructor runs, and only
// the exec'd environment counts: a .preinit_array entry runs before every library constructor,
// but libc's own start-up then resets environ to the original. So, under a finite RLIMIT_AS only,
// the entry re-executes this binary once with OPENBLAS_NUM_THREADS=1 (no heap: the list is on the
// stack). If the exec fails the run goes on as before. (The Python module cannot do this: a shared
// library has no .preinit_array, and the interpreter has started its BLAS already.)
constexpr char kSingleThreadedBlas[] = "OPENBLAS_NUM_THREADS=1";

void start_blas_single_threaded(int, char** argv, char** envp) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || envp == nullptr) return;
  std::size_t count = 0;
  for (; envp[count] != nullptr; ++count) {
    if (std::strcmp(envp[count], kSingleThreadedBlas) == 0) return;  // already re-executed, or set
  }
  if (count > 100000) return;
  char** environment = static_cast<char**>(alloca((count + 2) * sizeof(char*)));
  std::size_t kept = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::strncmp(envp[i], "OPENBLAS_NUM_THREADS=", 21) != 0) environment[kept++] = envp[i];
  }
  environment[kept++] = const_cast<char*>(kSingleThreadedBlas);
  environment[kept] = nullptr;
  ::execve("/proc/self/exe", argv, environment);
}
[[gnu::section(".preinit_array"),
  gnu::used]] void (*const kBlasBeforeConstructors)(int, char**, char**) = start_blas_single_threaded;
}  // namespace

int main(int argc, char** argv) {
  gradflow::use_single_threaded_blas();  // the library leaves OpenBLAS's threads alone (kernels.hpp)
  gradflow::cli::install_signal_cleanup();
  const gradflow::cli::CliOutcome outcome = gradflow::cli::run_cli(argv[0], {argv + 1, argv + argc}, nullptr);
  if (!outcome.message.empty()) std::fprintf(stderr, "%s\n", outcome.message.c_str());
  // stderr carries sweep's summary table and every warning: lost (2>/dev/full), the run did not
  // say what it had to, so it does not exit 0. (There is nowhere left to say why.)
  if ((std::fflush(stderr) != 0 || std::ferror(stderr)) && outcome.code == 0) return 2;
  return outcome.code;
}
