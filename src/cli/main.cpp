// gradflow's entry point: parse, run the chosen subcommand, map errors to exit codes.
#include <fmt/format.h>

#include <cstdio>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "commands.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/kernels.hpp"

int main(int argc, char** argv) {
  using gradflow::ExitCode;
  gradflow::use_single_threaded_blas();  // the library leaves OpenBLAS's threads alone (kernels.hpp)
  CLI::App app{"gradflow: signal and gradient flow in deep Transformer stacks, measured exactly at depth."};
  app.set_version_flag("--version", std::string("gradflow ") + GRADFLOW_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Definitions of every placement and figure, with units: docs/ (placements.md, metrics.md, output.md), "
      "or 'gradflow explain FIGURE'. Exit codes: 0 ok, 1 check failed, 2 bad input.");
  namespace cli = gradflow::cli;
  std::vector<cli::Command> commands;
  try {  // the placement flags come from the registry: a broken file in GRADFLOW_PLACEMENTS stops here
    commands = {cli::setup_analyze(app), cli::setup_archs(app), cli::setup_sweep(app),
                cli::setup_merge(app),   cli::setup_check(app), cli::setup_explain(app)};
  } catch (const gradflow::InputError& error) {
    fmt::print(stderr, "gradflow: error: {}\n", error.what());
    return static_cast<int>(ExitCode::bad_input);
  }
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (const std::string message = cli::unknown_subcommand(app, args); !message.empty()) {
    fmt::print(stderr, "{}\n", message);
    return static_cast<int>(ExitCode::bad_input);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version
    // One line naming the value, the fix and the subcommand's --help.
    fmt::print(stderr, "{}\n", cli::parse_error_message(app, error, args));
    return static_cast<int>(ExitCode::bad_input);
  }
  cli::install_signal_cleanup();
  // Every exception ends here, whatever thread threw it (workers hand theirs to the main
  // thread): one line on stderr and exit 2, or 1 for a failed check. Nothing reaches terminate.
  const auto fail = [](const std::string& what) {
    fmt::print(stderr, "gradflow: error: {}\n", what);
    return static_cast<int>(ExitCode::bad_input);
  };
  try {
    gradflow::kernel_choice();  // a bad GRADFLOW_KERNELS is refused here, before any work
    int code = static_cast<int>(ExitCode::bad_input);
    for (const auto& command : commands) {
      if (command.app->parsed()) {
        code = command.run();
        break;
      }
    }
    cli::check_stdout();  // data lost on stdout (a full disk, /dev/full) is an error, not exit 0
    return code;
  } catch (const gradflow::InputError& error) {
    return fail(error.what());
  } catch (const gradflow::CheckFailed& error) {
    fmt::print(stderr, "gradflow: check failed: {}\n", error.what());
    return static_cast<int>(ExitCode::check_failed);
  } catch (const std::bad_alloc&) {
    return fail("out of memory; try a smaller --depth, --width or --seq, or --precision f32");
  } catch (const std::length_error& error) {
    return fail(fmt::format(
        "out of memory: a size is too large ({}); try a smaller --depth, --width or --seq", error.what()));
  } catch (const nlohmann::json::exception& error) {
    return fail(fmt::format("a document does not have the shape gradflow writes ({})", error.what()));
  } catch (const std::system_error& error) {  // I/O errors (fmt, the file system), threads not started
    return fail(fmt::format("system error: {}", error.what()));
  } catch (const std::exception& error) {
    return fail(fmt::format("internal error: {}; please report it with the command line", error.what()));
  }
}
