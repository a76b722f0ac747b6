// The report of `gradflow check`: a Markdown summary for a CI step, or the same as JSON, from the
// typed comparison and expectation outcomes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "gradflow/app/check.hpp"

namespace gradflow {

namespace {
using json = nlohmann::ordered_json;

std::string shown(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return fmt::format("{:.6g}", value.get<double>());
  return value.dump();
}

}  // namespace

std::vector<std::string> document_run_names(const json& doc) {
  std::vector<std::string> names;
  if (doc.contains("cells") && doc.at("cells").is_array()) {
    for (const json& cell : doc.at("cells"))
      names.push_back(fmt::format("{} B{} d{} seed {}", cell.value("arch", "?"),
                                  cell.value("blocks", json()).dump(), cell.value("width", json()).dump(),
                                  cell.value("seed", json()).dump()));
  } else if (doc.contains("runs") && doc.at("runs").is_array()) {
    for (const json& run : doc.at("runs")) {
      if (!run.contains("seeds") || !run.at("seeds").is_array()) continue;
      for (const json& seed : run.at("seeds"))
        names.push_back(fmt::format("{} seed {}", run.value("arch", "?"), seed.value("seed", json()).dump()));
    }
  }
  return names;
}

namespace {
std::string shortened_list(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  if (names.size() <= 6) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all)", fmt::join(names.begin(), names.begin() + 6, ", "), names.size());
}

}  // namespace

std::string mismatch_advice(const Comparison& comparison) {
  const ConfigMismatch& m = comparison.mismatches.front();
  return fmt::format(
      "if the result's {} was not meant to change, rerun it with the baseline's ({} {}); if the change was "
      "intended, review its figures first, then regenerate the baseline with the result's command",
      m.field, config_flag(m.field), shown(m.baseline_value));
}

std::string nothing_compared_advice(const CheckReport& report) {
  return fmt::format(
      "no run of the result (runs: {}) matches a run of the baseline (runs: {}); runs are matched by "
      "placement "
      "and seed (and depth and width in sweeps), so rerun the result with the baseline's --arch and seeds, "
      "or "
      "choose the baseline of the placement you ran",
      shortened_list(report.result_runs), shortened_list(report.baseline_runs));
}

namespace {
// The regressions as a Markdown table of at most `max_rows` rows; "" when there are none.
std::string regressions_table(const Comparison& comparison, int max_rows) {
  if (comparison.regressions.empty()) return "";
  std::string out;
  out +=
      "\n### Regressions\n\n| placement | run | figure | layer | old | new | difference | tolerance | note "
      "|\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  int rows = 0;
  for (const Regression& r : comparison.regressions) {
    if (++rows > max_rows) {
      out += fmt::format("\n... and {} more (all of them with --json).\n",
                         comparison.regressions.size() - max_rows);
      break;
    }
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.placement, r.run, r.figure,
                       r.layer, shown(r.old_value), shown(r.new_value),
                       std::isfinite(r.difference) ? fmt::format("{:.4g}", r.difference) : "-", r.tolerance,
                       r.note);
  }
  return out;
}

// Each figure's largest difference, as a share of its tolerance (largest first), as a Markdown
// table of at most `max_rows` rows; "" when nothing was compared.
std::string largest_differences_table(const Comparison& comparison, int max_rows) {
  if (comparison.largest.empty()) return "";
  std::string out;
  std::vector<std::pair<std::string, LargestDifference>> rows(comparison.largest.begin(),
                                                              comparison.largest.end());
  const auto share = [](const LargestDifference& d) {
    return d.tolerance > 0 ? d.difference / d.tolerance : (d.difference > 0 ? INFINITY : 0.0);
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const auto& a, const auto& b) { return share(a.second) > share(b.second); });
  out +=
      "\n### Largest difference per figure\n\n| figure | largest difference | tolerance | of tolerance | "
      "where "
      "|\n|---|---|---|---|---|\n";
  int shown_rows = 0;
  for (const auto& [figure, d] : rows) {
    if (++shown_rows > max_rows) {
      out += fmt::format("\n... and {} more figures (all of them with --json).\n", rows.size() - max_rows);
      break;
    }
    out += fmt::format("| {} | {:.3g} | {} | {:.3g}% | {} {} {} |\n", figure, d.difference, d.tolerance,
                       100 * share(d), d.placement, d.run, d.layer);
  }
  return out;
}

std::string markdown_report(const CheckReport& report) {
  const Comparison& comparison = report.comparison;
  const Tolerances& tolerances = report.tolerances;
  const auto& outcomes = report.outcomes;
  int failed_expectations = 0;
  for (const auto& outcome : outcomes) failed_expectations += outcome.passed ? 0 : 1;
  std::string out = fmt::format("## gradflow check: {}\n\n", report.passed ? "PASS" : "FAIL");
  if (!comparison.mismatches.empty()) {
    out += fmt::format(
        "### FAIL: the result and the baseline measure different configurations\n\n"
        "These runs were not compared (exit 2):\n\n| placement | field | result | baseline "
        "|\n|---|---|---|---|\n");
    for (const ConfigMismatch& m : comparison.mismatches) {
      out += fmt::format("| {} | {} (`{}`) | {} | {} |\n", m.placement, m.field, config_flag(m.field),
                         shown(m.result_value), shown(m.baseline_value));
    }
    out += fmt::format("\nWhat to do: {}.\n\n", mismatch_advice(comparison));
  }
  if (comparison.runs_compared == 0 && comparison.mismatches.empty()) {  // else the mismatch says why
    out += fmt::format(
        "### FAIL: nothing was compared\n\nA gate that compares nothing cannot pass (exit 2): {}.\n\n",
        nothing_compared_advice(report));
  }
  out += fmt::format("{} regression(s) in {} figures of {} run(s) (result `{}`, baseline `{}`)",
                     comparison.regressions.size(), comparison.figures_compared, comparison.runs_compared,
                     report.result_path, report.baseline_path);
  if (!outcomes.empty())
    out += fmt::format("; {} of {} expectation(s) failed", failed_expectations, outcomes.size());
  out += fmt::format(
      ".\n\nTolerances: `log10_*` figures {} decades (absolute difference); positive linear figures {} "
      "decades of new/old; growth exponents {} (absolute){}.\n",
      tolerances.log_space, tolerances.linear, tolerances.exponent,
      tolerances.per_figure.empty() ? "" : "; per-figure overrides from " + report.tolerances_path);
  out += regressions_table(comparison, report.max_rows);
  out += largest_differences_table(comparison, report.max_rows);
  if (!outcomes.empty()) {
    out += "\n### Expectations\n\n| expectation | value | result |\n|---|---|---|\n";
    for (const auto& outcome : outcomes) {
      out += fmt::format("| `{}` | {} | {} |\n", outcome.text, outcome.actual,
                         outcome.passed ? "pass" : "**FAIL**");
    }
  }
  for (const auto& note : comparison.notes) out += fmt::format("\n- note: {}", note);
  if (!comparison.notes.empty()) out += "\n";
  return out;
}

json json_report(const CheckReport& report) {
  const Comparison& comparison = report.comparison;
  json mismatches = json::array();
  for (const ConfigMismatch& m : comparison.mismatches) {
    mismatches.push_back({{"placement", m.placement},
                          {"field", m.field},
                          {"flag", config_flag(m.field)},
                          {"result", m.result_value},
                          {"baseline", m.baseline_value}});
  }
  json largest = json::object();
  for (const auto& [figure, d] : comparison.largest) {
    largest[figure] = {{"difference", d.difference},
                       {"tolerance", d.tolerance},
                       {"placement", d.placement},
                       {"run", d.run},
                       {"layer", d.layer}};
  }
  json problems = json::array();
  if (!comparison.mismatches.empty())
    problems.push_back({{"problem", "configuration mismatch"}, {"advice", mismatch_advice(comparison)}});
  if (comparison.runs_compared == 0 && comparison.mismatches.empty())
    problems.push_back({{"problem", "nothing compared"}, {"advice", nothing_compared_advice(report)}});
  json regressions = json::array();
  for (const Regression& r : comparison.regressions) {
    regressions.push_back({{"placement", r.placement},
                           {"run", r.run},
                           {"figure", r.figure},
                           {"layer", r.layer},
                           {"old", r.old_value},
                           {"new", r.new_value},
                           {"difference", std::isfinite(r.difference) ? json(r.difference) : json()},
                           {"tolerance", r.tolerance},
                           {"note", r.note}});
  }
  json expectations = json::array();
  for (const auto& o : report.outcomes)
    expectations.push_back({{"expectation", o.text}, {"value", o.actual}, {"passed", o.passed}});
  return {{"tool", "gradflow check"},
          {"passed", report.passed},
          {"result", report.result_path},
          {"baseline", report.baseline_path},
          {"runs_compared", comparison.runs_compared},
          {"figures_compared", comparison.figures_compared},
          {"not_compared", problems},
          {"mismatches", mismatches},
          {"largest_differences", largest},
          {"regressions", regressions},
          {"expectations", expectations},
          {"notes", comparison.notes}};
}

}  // namespace

void write_check_markdown(const CheckReport& report, std::ostream& out) {
  out << markdown_report(report);
}

void write_check_json(const CheckReport& report, std::ostream& out) {
  out << json_report(report).dump(1) << '\n';
}

}  // namespace gradflow
