// CLI11's parse errors in gradflow's one-line form: the value, the fix, and the subcommand's
// --help; did-you-mean for mistyped subcommands and options.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <regex>

#include "commands.hpp"
#include "gradflow/suggest.hpp"

namespace gradflow::cli {

namespace {
std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

std::vector<std::string> option_names(const CLI::App& sub) {
  std::vector<std::string> names;
  for (const CLI::Option* option : sub.get_options()) {
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

const CLI::Option* find_option(const CLI::App& sub, const std::string& name) {
  for (const CLI::Option* option : sub.get_options()) {
    if (option->check_name(name)) return option;
  }
  return nullptr;
}

// The value the user gave `option` on the command line; nullopt when the option came last, without one.
std::optional<std::string> given_value(const std::vector<std::string>& args, const CLI::Option* option) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const auto equals = arg.find('=');
    if (equals != std::string::npos && arg.starts_with("--") && option->check_name(arg.substr(0, equals)))
      return arg.substr(equals + 1);
    if (option->check_name(arg)) {
      if (i + 1 < args.size()) return args[i + 1];
      return std::nullopt;
    }
  }
  return std::string();
}

// The first --name in args that is no option of `sub` ("" when every one is known).
std::string first_unknown_option(const CLI::App& sub, const std::vector<std::string>& args) {
  bool after_sub = false;
  for (const auto& arg : args) {
    if (!after_sub) {
      after_sub = arg == sub.get_name();
      continue;
    }
    if (arg == "--") break;
    if (!arg.starts_with("--") || arg.size() < 3) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (name == "--help" || find_option(sub, name)) continue;
    return name;
  }
  return {};
}

// "--format CSV is not one of json, csv, ...; did you mean csv?" for an IsMember validator.
std::string not_a_choice(const std::string& name, const std::string& value, const std::string& set_text) {
  std::vector<std::string> choices;
  std::string item;
  for (const char c : set_text) {
    if (c == ',' || c == '}') {
      if (!item.empty()) choices.push_back(item);
      item.clear();
    } else if (c != '{' && c != ' ') {
      item += c;
    }
  }
  std::string lowered;
  for (const char c : value) lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string nearest = nearest_name(lowered, choices);
  return fmt::format("{} {:?} is not one of {}{}", name, value, fmt::join(choices, ", "),
                     nearest.empty() ? "" : fmt::format("; did you mean {} {}?", name, nearest));
}

std::string describe(const CLI::App& sub, const CLI::ParseError& error,
                     const std::vector<std::string>& args) {
  const std::string what = error.what();
  const std::string kind = error.get_name();
  std::smatch match;
  if (const std::string unknown = first_unknown_option(sub, args); !unknown.empty()) {
    // Reported first, whatever CLI11 tripped over: "--depths 2" makes --depth look missing.
    const std::string nearest = nearest_name(unknown, option_names(sub));
    return fmt::format("unknown option {}{}", unknown,
                       nearest.empty() ? "" : fmt::format("; did you mean {}?", nearest));
  }
  if (const auto colon = what.find(": "); kind == "ValidationError" && colon != std::string::npos) {
    // gradflow's own validators (number_options.cpp) word the whole message, starting with the name.
    const std::string name = what.substr(0, colon), message = what.substr(colon + 2);
    if (message.starts_with(name + " ")) return message;
  }
  if (what.find("not expected: ") != std::string::npos) {
    // CLI11 lists the extras last first; name the first one given.
    const std::string extras = what.substr(what.find(": ") + 2);
    std::string first = extras.substr(extras.rfind(' ') + 1);
    for (const auto& arg : args) {
      if (extras.find(arg) != std::string::npos && arg != sub.get_name()) {
        first = arg;
        break;
      }
    }
    return fmt::format("unexpected argument {:?}; options take a name (e.g. --arch keel)", first);
  }
  if (kind == "RequiredError") {
    if (what.starts_with("A subcommand")) return "a subcommand is required";
    const std::string name = what.substr(0, what.find(' '));
    return fmt::format("{} is required", name);
  }
  if (kind == "ExcludesError") {
    const auto at = what.find(" excludes ");
    return fmt::format("{} and {} exclude each other; give one of them", what.substr(0, at),
                       what.substr(at + 10));
  }
  if (kind == "ArgumentMismatch" && std::regex_search(what, match, std::regex(R"(to (\S+), got 0)"))) {
    return fmt::format("{} needs a value", match[1].str());
  }
  // Conversion and validation errors: name the option, the value and what it takes.
  std::string name;
  if (std::regex_search(what, match, std::regex(R"(^Could not convert: (\S+) = )")) ||
      std::regex_search(what, match, std::regex(R"(is not an allowed value for (\S+))")) ||
      std::regex_search(what, match, std::regex(R"(^(-[^:\s]+):)"))) {
    name = match[1].str();
  }
  const CLI::Option* option = name.empty() ? nullptr : find_option(sub, name);
  if (!option) return what;
  name = option->get_name();
  const std::optional<std::string> given = given_value(args, option);
  if (!given) return fmt::format("{} needs a value", name);
  if (what.find("At Most 1 required") != std::string::npos)
    return fmt::format("{} is given more than once; give it once", name);
  const std::string value = *given;
  if (std::regex_search(what, match, std::regex(R"(not in (\{.*\}))")))
    return not_a_choice(name, value, match[1]);
  const std::string full_type = option->get_type_name();
  char* number_end = nullptr;
  std::strtod(value.c_str(), &number_end);
  const bool is_number = !value.empty() && *number_end == '\0';
  if (what.find("not in range") != std::string::npos && is_number) {
    if (full_type.find("NONNEGATIVE") != std::string::npos)
      return fmt::format("{} {} must be >= 0; try {} 0", name, value, name);
    if (full_type.find("POSITIVE") != std::string::npos)
      return fmt::format("{} {} must be at least 1; try {} 1", name, value, name);
  }
  // Numbers that are not numbers of their kind never get here: number_options.cpp's transform
  // words those messages (digits, range, inf and nan) before CLI11 converts.
  return fmt::format("{} {:?}: {}", name, value, what);
}
}  // namespace

std::string unknown_subcommand(const CLI::App& app, const std::vector<std::string>& args) {
  const auto names = subcommand_names(app);
  for (const auto& arg : args) {
    if (arg == "-h" || arg == "--help" || arg == "--version") return {};
    if (arg.starts_with("-")) {
      return fmt::format(
          "gradflow: error: {} must follow a subcommand, e.g. 'gradflow analyze {} ...'; see 'gradflow "
          "--help'",
          arg, arg);
    }
    if (std::find(names.begin(), names.end(), arg) != names.end()) return {};
    const std::string nearest = nearest_name(arg, names);
    return fmt::format("gradflow: error: unknown subcommand {:?}; {}see 'gradflow --help'", arg,
                       nearest.empty() ? fmt::format("use one of {}; ", fmt::join(names, ", "))
                                       : fmt::format("did you mean 'gradflow {}'? ", nearest));
  }
  return {};
}

std::string parse_error_message(const CLI::App& app, const CLI::ParseError& error,
                                const std::vector<std::string>& args) {
  const CLI::App* sub = nullptr;
  for (const auto& arg : args) {
    if (arg.starts_with("-")) continue;
    for (const CLI::App* candidate : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (candidate->get_name() == arg) sub = candidate;
    }
    break;
  }
  if (!sub) {
    if (std::string(error.what()).starts_with("A subcommand")) {
      return fmt::format("gradflow: error: a subcommand is required: one of {}; see 'gradflow --help'",
                         fmt::join(subcommand_names(app), ", "));
    }
    return fmt::format("gradflow: error: {}; see 'gradflow --help'", error.what());
  }
  return fmt::format("gradflow: error: {}; see 'gradflow {} --help'", describe(*sub, error, args),
                     sub->get_name());
}

}  // namespace gradflow::cli
