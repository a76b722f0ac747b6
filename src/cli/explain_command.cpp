// `gradflow explain FIGURE`: one figure's or field's definition and unit, from the reference in
// docs/ (metrics.md, output.md), which the build embeds so that the binary and the docs agree.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "docs_text.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/suggest.hpp"

namespace gradflow::cli {

namespace {
// Every "### `name`" section of the embedded docs: name -> its text up to the next heading.
std::vector<std::pair<std::string, std::string>> sections() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string_view doc : {kMetricsDoc, kOutputDoc}) {
    std::istringstream lines{std::string(doc)};
    std::string line;
    std::pair<std::string, std::string>* current = nullptr;
    while (std::getline(lines, line)) {
      if (line.starts_with("#")) {
        current = nullptr;
        if (line.starts_with("### `")) {
          const auto end = line.find('`', 5);
          out.emplace_back(line.substr(5, end - 5), line + "\n");
          current = &out.back();
        }
        continue;
      }
      if (current) current->second += line + "\n";
    }
  }
  // Fields defined by a table row ("| `name` | meaning |") and not by a section of their own.
  for (const std::string_view doc : {kOutputDoc, kMetricsDoc}) {
    std::istringstream lines{std::string(doc)};
    std::string line;
    while (std::getline(lines, line)) {
      if (!line.starts_with("| `")) continue;
      const auto end = line.find('`', 3);
      const std::string name = line.substr(3, end - 3);
      const bool known =
          std::any_of(out.begin(), out.end(), [&](const auto& entry) { return entry.first == name; });
      const auto meaning = line.find('|', end);
      if (known || meaning == std::string::npos) continue;
      std::string text = line.substr(meaning + 1);
      while (text.ends_with("|") || text.ends_with(" ")) text.pop_back();
      while (text.starts_with(" ")) text.erase(0, 1);
      out.emplace_back(name, fmt::format("`{}`: {}\n", name, text));
    }
  }
  return out;
}

int run_explain(const std::string& figure) {
  const auto all = sections();
  std::vector<std::string> names;
  for (const auto& [name, text] : all) {
    if (name == figure) {
      std::string trimmed = text;
      while (trimmed.ends_with("\n\n")) trimmed.pop_back();
      fmt::print(std::cout, "{}", trimmed);
      return 0;
    }
    names.push_back(name);
  }
  const std::string nearest = nearest_name(figure, names);
  throw InputError(
      fmt::format("explain {:?}: no such figure or field{}; 'gradflow explain --list' lists them", figure,
                  nearest.empty() ? "" : fmt::format("; did you mean {:?}?", nearest)));
}
}  // namespace

Command setup_explain(CLI::App& app) {
  auto figure = std::make_shared<std::string>();
  auto list = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "explain",
      "Print one figure's or output field's definition and unit (from docs/metrics.md and output.md)");
  sub->add_option("FIGURE", *figure, "A figure or field name, e.g. log10_grad_rel, skip_gain, growth_class");
  sub->add_flag("--list", *list, "List every figure and field that has a definition");
  return {sub, [figure, list] {
            if (*list || figure->empty()) {
              std::vector<std::string> names;
              for (const auto& [name, text] : sections()) names.push_back(name);
              if (!*list) {
                throw InputError(
                    "explain needs a FIGURE, e.g. 'gradflow explain log10_grad_rel'; --list lists them");
              }
              fmt::print(std::cout, "{}\n", fmt::join(names, "\n"));
              return 0;
            }
            return run_explain(*figure);
          }};
}

}  // namespace gradflow::cli
