// `gradflow check`: a CI gate. Compares a result with a baseline figure by figure within
// tolerances, evaluates --expect expressions, prints a Markdown report (or --json), exits 0 / 1 / 2.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include "commands.hpp"
#include "gradflow/app/check.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::cli {

namespace {
using json = nlohmann::ordered_json;

struct CheckOptions {
  std::string result, baseline, tolerances;
  std::vector<std::string> expectations;
  bool json_output = false;
  int max_rows = 50;
};

std::string shown(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return fmt::format("{:.6g}", value.get<double>());
  return value.dump();
}

// The runs of a document, "arch seed N" (or "arch B.. d.. seed N" for sweeps), for the report.
std::vector<std::string> run_names(const json& doc) {
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

std::string shortened_list(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  if (names.size() <= 6) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all)", fmt::join(names.begin(), names.begin() + 6, ", "), names.size());
}

std::string mismatch_advice(const Comparison& comparison) {
  const ConfigMismatch& m = comparison.mismatches.front();
  return fmt::format(
      "if the result's {} was not meant to change, rerun it with the baseline's ({} {}); if the change was "
      "intended, review its figures first, then regenerate the baseline with the result's command",
      m.field, config_flag(m.field), shown(m.baseline_value));
}

std::string nothing_compared_advice(const json& result, const json& baseline) {
  return fmt::format(
      "no run of the result (runs: {}) matches a run of the baseline (runs: {}); runs are matched by "
      "placement "
      "and seed (and depth and width in sweeps), so rerun the result with the baseline's --arch and seeds, "
      "or "
      "choose the baseline of the placement you ran",
      shortened_list(run_names(result)), shortened_list(run_names(baseline)));
}

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

std::string markdown_report(const CheckOptions& options, const Tolerances& tolerances,
                            const Comparison& comparison, const std::vector<ExpectationOutcome>& outcomes,
                            bool passed, const json& result, const json& baseline) {
  int failed_expectations = 0;
  for (const auto& outcome : outcomes) failed_expectations += outcome.passed ? 0 : 1;
  std::string out = fmt::format("## gradflow check: {}\n\n", passed ? "PASS" : "FAIL");
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
        nothing_compared_advice(result, baseline));
  }
  out += fmt::format("{} regression(s) in {} figures of {} run(s) (result `{}`, baseline `{}`)",
                     comparison.regressions.size(), comparison.figures_compared, comparison.runs_compared,
                     options.result, options.baseline);
  if (!outcomes.empty())
    out += fmt::format("; {} of {} expectation(s) failed", failed_expectations, outcomes.size());
  out += fmt::format(
      ".\n\nTolerances: `log10_*` figures {} decades (absolute difference); positive linear figures {} "
      "decades of new/old; growth exponents {} (absolute){}.\n",
      tolerances.log_space, tolerances.linear, tolerances.exponent,
      tolerances.per_figure.empty() ? "" : "; per-figure overrides from " + options.tolerances);
  out += regressions_table(comparison, options.max_rows);
  out += largest_differences_table(comparison, options.max_rows);
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

json json_report(const CheckOptions& options, const Comparison& comparison,
                 const std::vector<ExpectationOutcome>& outcomes, bool passed, const json& result,
                 const json& baseline) {
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
    problems.push_back(
        {{"problem", "nothing compared"}, {"advice", nothing_compared_advice(result, baseline)}});
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
  for (const auto& o : outcomes)
    expectations.push_back({{"expectation", o.text}, {"value", o.actual}, {"passed", o.passed}});
  return {{"tool", "gradflow check"},
          {"passed", passed},
          {"result", options.result},
          {"baseline", options.baseline},
          {"runs_compared", comparison.runs_compared},
          {"figures_compared", comparison.figures_compared},
          {"not_compared", problems},
          {"mismatches", mismatches},
          {"largest_differences", largest},
          {"regressions", regressions},
          {"expectations", expectations},
          {"notes", comparison.notes}};
}

int run_check(const CheckOptions& options) {
  // Everything is parsed and validated before anything is compared: bad input is exit 2, never 1.
  const json result = read_json_file(options.result);
  const json baseline = read_json_file(options.baseline);
  const Tolerances tolerances =
      options.tolerances.empty()
          ? Tolerances{}
          : tolerances_from_json(read_json_file(options.tolerances), options.tolerances);
  std::vector<Expectation> expectations;
  for (const auto& text : options.expectations) expectations.push_back(parse_expectation(text));
  Comparison comparison;
  std::vector<ExpectationOutcome> outcomes;
  try {
    comparison = compare_documents(result, baseline, tolerances);
    for (const auto& e : expectations) outcomes.push_back(evaluate_expectation(e, result));
  } catch (const InputError& error) {
    throw InputError(fmt::format("{} vs {}: {}", options.result, options.baseline, error.what()));
  } catch (const json::exception& error) {
    throw InputError(fmt::format("{} vs {}: a document lacks a field gradflow writes ({})", options.result,
                                 options.baseline, error.what()));
  }
  const bool not_comparable = !comparison.mismatches.empty() || comparison.runs_compared == 0;
  bool passed = comparison.regressions.empty() && !not_comparable;
  for (const auto& outcome : outcomes) passed = passed && outcome.passed;
  if (options.json_output) {
    std::cout << json_report(options, comparison, outcomes, passed, result, baseline).dump(1) << '\n';
  } else {
    std::cout << markdown_report(options, tolerances, comparison, outcomes, passed, result, baseline);
  }
  check_stdout();                        // the report is the CI step summary: a lost write is an error
  if (!comparison.mismatches.empty()) {  // the report on stdout says the same, for a CI step summary
    const ConfigMismatch& m = comparison.mismatches.front();
    throw InputError(
        fmt::format("{} vs {}: the result and the baseline measure different configurations for {}: {} is {} "
                    "in the result "
                    "but {} in the baseline; {}",
                    options.result, options.baseline, m.placement, m.field, m.result_value.dump(),
                    m.baseline_value.dump(), mismatch_advice(comparison)));
  }
  if (comparison.runs_compared == 0) {
    throw InputError(fmt::format("{} vs {}: nothing was compared: {}", options.result, options.baseline,
                                 nothing_compared_advice(result, baseline)));
  }
  return static_cast<int>(passed ? ExitCode::success : ExitCode::check_failed);
}
}  // namespace

Command setup_check(CLI::App& app) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* sub = app.add_subcommand("check",
                                     "CI gate: compare a result with a baseline within tolerances and "
                                     "evaluate expectations (exit 0 / 1 / 2)");
  sub->option_defaults()->always_capture_default();
  sub->add_option("RESULT", options->result,
                  "A gradflow analyze (or sweep cell) document, or a sweep document")
      ->required();
  sub->add_option("--baseline", options->baseline,
                  "The reference document (same command, same configuration)")
      ->required();
  sub->add_option(
         "--tolerances", options->tolerances,
         "JSON file overriding the default tolerances: log10_* figures 0.05 decades (absolute "
         "difference); positive linear figures (rms, gain, *_gain, branch_rms, stream_share) 0.05 "
         "decades of new/old; growth exponents 0.05. Format: {\"log_space\": 0.05, \"linear\": 0.05, "
         "\"exponent\": 0.05, \"figures\": {\"gain\": 0.1}}")
      ->default_str("the defaults");
  sub->add_option(
         "--expect", options->expectations,
         "ARCH.FIELD[.SUBFIELD] OP VALUE, OP one of < <= > >= == != (repeatable), e.g. "
         "'keel.log10_grad_ratio < 0.1', 'pre-ln.growth_class == sqrt', 'keel.gain_min.value > 0.5'. "
         "Analyze documents: a seed summary field, averaged over seeds; sweeps: a field of the cross-depth "
         "fit")
      ->default_str("none");
  sub->add_flag("--json", options->json_output, "Print the report as JSON instead of Markdown");
  sub->add_option("--max-rows", options->max_rows,
                  "Rows listed in each Markdown table (regressions, largest differences)")
      ->check(CLI::NonNegativeNumber);
  sub->footer(
      "Runs are matched by arch and seed (and depth and width in sweeps); every per-state and per-sublayer "
      "figure and the run summary are compared. Exit 0 pass, 1 regression or failed expectation, 2 bad "
      "input.");
  return {sub, [options] { return run_check(*options); }};
}

}  // namespace gradflow::cli
