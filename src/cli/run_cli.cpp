// One gradflow command line, run in this process: parse, run the chosen subcommand, map every
// error to an exit code and one line. main.cpp prints the line; the Python module (python/)
// raises it, so both speak with the same messages.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "commands.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/branch_op.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/kernels.hpp"

namespace gradflow::cli {

namespace {
std::atomic<const CliHooks*> g_hooks{nullptr};

// Sets the hooks for the duration of one run_cli call.
class ActiveHooks {
 public:
  explicit ActiveHooks(const CliHooks* hooks) { g_hooks.store(hooks); }
  ~ActiveHooks() { g_hooks.store(nullptr); }
  ActiveHooks(const ActiveHooks&) = delete;
  ActiveHooks& operator=(const ActiveHooks&) = delete;
};

CliOutcome failure(const std::string& what) {
  return {static_cast<int>(ExitCode::bad_input), fmt::format("gradflow: error: {}", what)};
}

CliOutcome run_parsed(const std::vector<Command>& commands) {
  // Every exception ends here, whatever thread threw it (workers hand theirs to the main
  // thread): one line and exit 2, or 1 for a failed check. Nothing reaches terminate.
  try {
    kernel_choice();  // a bad GRADFLOW_KERNELS is refused here, before any work
    int code = static_cast<int>(ExitCode::bad_input);
    for (const auto& command : commands) {
      if (command.app->parsed()) {
        code = command.run();
        break;
      }
    }
    check_stdout();  // data lost on stdout (a full disk, /dev/full) is an error, not exit 0
    return {code, ""};
  } catch (const Cancelled&) {
    return {kExitInterrupted, "gradflow: interrupted"};
  } catch (const InputError& error) {
    return failure(error.what());
  } catch (const CheckFailed& error) {
    return {static_cast<int>(ExitCode::check_failed),
            fmt::format("gradflow: check failed: {}", error.what())};
  } catch (const std::bad_alloc&) {
    return failure("out of memory; try a smaller --depth, --width or --seq, or --precision f32");
  } catch (const std::length_error& error) {
    return failure(fmt::format(
        "out of memory: a size is too large ({}); try a smaller --depth, --width or --seq", error.what()));
  } catch (const nlohmann::json::exception& error) {
    return failure(fmt::format("a document does not have the shape gradflow writes ({})", error.what()));
  } catch (const std::system_error& error) {  // I/O errors (fmt, the file system), threads not started
    return failure(fmt::format("system error: {}", error.what()));
  } catch (const std::exception& error) {
    return failure(fmt::format("internal error: {}; please report it with the command line", error.what()));
  }
}
}  // namespace

const CliHooks* active_hooks() {
  return g_hooks.load();
}

void report_progress_to_hooks(long long done, long long total) {
  if (const CliHooks* hooks = active_hooks(); hooks && hooks->progress) hooks->progress(done, total);
}

namespace {
// The one line an error is: a control character in it (a file name with a newline, a byte read
// from a file) would break it, so each is written as an escape (\n, \x1b).
std::string one_line(const std::string& message) {
  std::string line;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\r') {
      line += "\\r";
    } else if (c == '\t') {
      line += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      line += fmt::format("\\x{:02x}", byte);
    } else {
      line += c;
    }
  }
  return line;
}

// gradflow's command tree on `app`, as every command line parses it; throws InputError when the
// registry cannot be read (the placement flags come from it: a broken file in GRADFLOW_PLACEMENTS).
std::vector<Command> build_app(CLI::App& app, const std::string& program) {
  forget_placement_files();  // each command line reads the placement files it names afresh
  app.set_version_flag("--version", std::string("gradflow ") + GRADFLOW_VERSION);
  app.require_subcommand(1);
  app.name(program);  // the usage lines name it, as parse(argc, argv) would
  app.footer(
      "Definitions of every placement and figure, with units: docs/ (placements.md, metrics.md, output.md), "
      "or 'gradflow explain FIGURE'. Exit codes: 0 ok, 1 check failed, 2 bad input.");
  std::vector<Command> commands = {setup_analyze(app), setup_archs(app), setup_sweep(app),
                                   setup_merge(app),   setup_check(app), setup_explain(app)};
  read_numbers_in_decimal(app);
  return commands;
}

constexpr const char* kAppDescription =
    "gradflow: signal and gradient flow in deep Transformer stacks, measured exactly at depth.";

CliOutcome run_cli_once(const std::string& program, const std::vector<std::string>& args) {
  CLI::App app{kAppDescription};
  std::vector<Command> commands;
  try {
    commands = build_app(app, program);
  } catch (const InputError& error) {
    return failure(error.what());
  }
  if (const auto version = std::find(args.begin(), args.end(), "--version");
      version != args.end() && args.size() > 1) {
    return failure(
        fmt::format("--version takes nothing else ({:?} given with it); run 'gradflow --version' alone",
                    args.front() == "--version" ? args[1] : args.front()));
  }
  if (const std::string message = unknown_subcommand(app, args); !message.empty())
    return {static_cast<int>(ExitCode::bad_input), message};
  if (const std::string message = empty_value_problem(app, args); !message.empty())
    return {static_cast<int>(ExitCode::bad_input), message};
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them back to front
    app.parse(reversed);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) {  // --help, --version (on stdout), which may fail to arrive
      const int code = app.exit(error);
      try {
        check_stdout();
      } catch (const InputError& lost) {
        return failure(lost.what());
      }
      return {code, ""};
    }
    // One line naming the value, the fix and the subcommand's --help.
    return {static_cast<int>(ExitCode::bad_input), parse_error_message(app, error, args)};
  }
  return run_parsed(commands);
}

// Whether every placement declaring option `key` takes whole numbers only (one key is one flag:
// a fraction is refused as a type only when no placement of the registry would run it).
bool whole_everywhere(std::string_view key) {
  bool declared = false;
  for (const Architecture* arch : architectures()) {
    for (const PlacementOption& option : arch->options) {
      if (option.key != key) continue;
      if (!option.whole) return false;
      declared = true;
    }
  }
  return declared;
}

// Whether the number option `option` of the registry or the branch-op table (by its flag) is whole.
bool registry_whole(const CLI::Option& option) {
  for (const PlacementOption* op : op_options()) {
    if (option.check_name(std::string(op->flag))) return op->whole;
  }
  for (const PlacementOption* declared : placement_options()) {
    if (option.check_name(std::string(declared->flag))) return whole_everywhere(declared->key);
  }
  return false;
}

OptionRow option_row(const CLI::Option& option, const Command& command) {
  OptionRow row;
  row.names = option.get_lnames();
  row.flag = option.get_expected_max() == 0;  // add_flag sets expected(0); its type size stays 1
  if (row.flag) return row;
  const auto listed = command.comma_lists.find("--" + row.names.front());
  const std::optional<NumberKind> number = number_kind(option);
  if (listed != command.comma_lists.end()) {
    if (number || option.get_expected_max() > 1)  // a list CLI11 reads itself: not one word of text
      throw std::logic_error(fmt::format("{} is declared a comma-separated list, and CLI11 reads it as {}",
                                         option.get_name(), option.get_type_name()));
    row.kind = listed->second == ListItems::whole ? "whole" : "text";
    row.several = "join";
    return row;
  }
  row.kind = !number ? "text" : *number != NumberKind::real || registry_whole(option) ? "whole" : "real";
  if (option.get_expected_max() > 1)
    row.several = "repeat";
  else if (option.get_delimiter() != '\0')
    row.several = "join";
  return row;
}
}  // namespace

OptionTable option_table(const std::string& subcommand) {
  OptionTable table;
  try {
    CLI::App app{kAppDescription};
    const std::vector<Command> commands = build_app(app, "gradflow");
    const auto command = std::find_if(commands.begin(), commands.end(),
                                      [&](const Command& c) { return c.app->get_name() == subcommand; });
    if (command == commands.end()) {
      table.outcome =
          failure(fmt::format("{:?} is not a gradflow subcommand; run 'gradflow --help'", subcommand));
    } else {
      for (const auto& [name, items] : command->comma_lists) {
        if (!command->app->get_option_no_throw(name))
          throw std::logic_error(
              fmt::format("{} lists {} as a comma-separated option it does not have", subcommand, name));
      }
      for (const CLI::Option* option : command->app->get_options()) {
        if (!option->get_lnames().empty()) table.rows.push_back(option_row(*option, *command));
      }
    }
  } catch (const InputError& error) {
    table.outcome = failure(error.what());
  }
  table.outcome.message = one_line(table.outcome.message);
  return table;
}

CliOutcome run_cli(const std::string& program, const std::vector<std::string>& args, const CliHooks* hooks) {
  ActiveHooks active(hooks);
  CliOutcome outcome = run_cli_once(program, args);
  outcome.message = one_line(outcome.message);
  return outcome;
}

}  // namespace gradflow::cli
