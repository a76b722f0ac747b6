// Every numeric option read in decimal (decimal.hpp), and no option given an empty value.
// Run over the whole command tree once it is built, so a new option gets both without a line.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "commands.hpp"
#include "gradflow/decimal.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::cli {

std::optional<NumberKind> number_kind(const CLI::Option& option) {
  const std::string type = option.get_type_name();
  const std::string base = type.substr(0, type.find(':'));
  if (base == "INT") return NumberKind::whole;
  if (base == "UINT") return NumberKind::unsigned_whole;
  if (base == "FLOAT") return NumberKind::real;
  return std::nullopt;
}

namespace {
// A value to suggest: the whole number a value like 1e3 or 64.0 stands for, else the option's
// default, else a plain example of its kind.
std::string suggestion(const CLI::Option& option, NumberKind kind, const std::string& value) {
  if (kind != NumberKind::real && read_decimal(value, NumberKind::real).problem.empty()) {
    const double number = std::strtod(value.c_str(), nullptr);
    if (number == std::floor(number) && std::abs(number) < 9e15) {
      const std::string digits = fmt::format("{:.0f}", number);
      if (read_decimal(digits, kind).problem.empty()) return digits;
    }
  }
  const std::string fallback = option.get_default_str();
  if (!fallback.empty() && read_decimal(fallback, kind).problem.empty()) return fallback;
  switch (kind) {
    case NumberKind::whole:
      return "64";
    case NumberKind::unsigned_whole:
      return "0";
    case NumberKind::real:
      return "0.5";
  }
  return "1";
}

void read_in_decimal(CLI::Option* option, NumberKind kind) {
  const std::string name = option->get_name();
  // A Validator that rewrites the value ("010" -> "10") or returns the problem. Its message starts
  // with the option's name, which parse_error_message passes through as it is.
  option->transform(CLI::Validator(
      [option, name, kind](std::string& value) -> std::string {
        const DecimalReading reading = read_decimal(value, kind);
        if (!reading.problem.empty()) {
          // The value is quoted when it is no number of the kind at all, as CLI11's own messages do.
          const bool quoted =
              reading.problem == "must be a number" || reading.problem.starts_with("must be a whole number");
          return fmt::format("{} {} {}; try {} {}", name, quoted ? fmt::format("{:?}", value) : value,
                             reading.problem, name, suggestion(*option, kind, value));
        }
        value = reading.canonical;
        return {};
      },
      ""));
}

void add_decimal_reading(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_type_size_max() == 0) continue;  // a flag
    if (const auto kind = number_kind(*option)) read_in_decimal(option, *kind);
  }
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) add_decimal_reading(*sub);
}

const CLI::Option* option_named(const CLI::App& app, const std::string& name) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->check_name(name)) return option;
  }
  return nullptr;
}

std::string empty_problem(const CLI::Option& option, const std::string& value) {
  if (value.empty())
    return fmt::format("{} is given an empty value; give one, or omit {} for its default", option.get_name(),
                       option.get_name());
  const char delimiter = option.get_delimiter();
  if (delimiter == '\0') return {};
  const std::string padded = std::string(1, delimiter) + value + std::string(1, delimiter);
  if (padded.find(std::string(2, delimiter)) != std::string::npos) {
    return fmt::format("{} {:?} has an empty item between '{}'s; remove the extra '{}'", option.get_name(),
                       value, delimiter, delimiter);
  }
  return {};
}
}  // namespace

void read_numbers_in_decimal(CLI::App& app) {
  add_decimal_reading(app);
}

// CLI11 takes '' as the default (--config '' ran without a config, --depth '' as 0) and drops
// empty items of a list (--lr 1e-3,,1e-4 ran two rates): both are refused before it parses.
std::string empty_value_problem(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* sub = &app;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (sub == &app && !arg.starts_with("-")) {
      for (const CLI::App* candidate : app.get_subcommands([](const CLI::App*) { return true; })) {
        if (candidate->get_name() == arg) sub = candidate;
      }
      continue;
    }
    if (!arg.starts_with("-")) continue;
    const auto equals = arg.find('=');
    const std::string name = arg.starts_with("--") ? arg.substr(0, equals) : arg;
    const CLI::Option* option = option_named(*sub, name);
    // -o '' has its own message in each subcommand (an empty file or directory name).
    if (!option || option->get_type_size_max() == 0 || option->check_name("--output")) continue;
    std::optional<std::string> value;
    if (arg.starts_with("--") && equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    }
    if (!value) continue;  // CLI11 says "needs a value"
    if (const std::string problem = empty_problem(*option, *value); !problem.empty()) {
      return fmt::format("gradflow: error: {}; see 'gradflow {} --help'", problem,
                         sub == &app ? std::string("") : sub->get_name());
    }
  }
  return {};
}

}  // namespace gradflow::cli
