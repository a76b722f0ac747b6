// `gradflow check`: a CI gate. Compares a result with a baseline figure by figure within
// tolerances, evaluates --expect expressions, prints a Markdown report (or --json), exits 0 / 1 / 2.
#include <fmt/format.h>

#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "gradflow/check.hpp"
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

std::string markdown_report(const CheckOptions& options, const Tolerances& tolerances,
                            const Comparison& comparison, const std::vector<ExpectationOutcome>& outcomes,
                            bool passed) {
  int failed_expectations = 0;
  for (const auto& outcome : outcomes) failed_expectations += outcome.passed ? 0 : 1;
  std::string out = fmt::format("## gradflow check: {}\n\n", passed ? "PASS" : "FAIL");
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
  if (!comparison.regressions.empty()) {
    out +=
        "\n### Regressions\n\n| placement | run | figure | layer | old | new | difference | tolerance | note "
        "|\n"
        "|---|---|---|---|---|---|---|---|---|\n";
    int rows = 0;
    for (const Regression& r : comparison.regressions) {
      if (++rows > options.max_rows) {
        out += fmt::format("\n... and {} more (all of them with --json).\n",
                           comparison.regressions.size() - options.max_rows);
        break;
      }
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.placement, r.run, r.figure,
                         r.layer, shown(r.old_value), shown(r.new_value),
                         std::isfinite(r.difference) ? fmt::format("{:.4g}", r.difference) : "-", r.tolerance,
                         r.note);
    }
  }
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
                 const std::vector<ExpectationOutcome>& outcomes, bool passed) {
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
  bool passed = comparison.regressions.empty();
  for (const auto& outcome : outcomes) passed = passed && outcome.passed;
  if (options.json_output) {
    std::cout << json_report(options, comparison, outcomes, passed).dump(1) << '\n';
  } else {
    std::cout << markdown_report(options, tolerances, comparison, outcomes, passed);
  }
  check_stdout();
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
  sub->add_option("--max-rows", options->max_rows, "Regressions listed in the Markdown table");
  sub->footer(
      "Runs are matched by arch and seed (and depth and width in sweeps); every per-state and per-sublayer "
      "figure and the run summary are compared. Exit 0 pass, 1 regression or failed expectation, 2 bad "
      "input.");
  return {sub, [options] { return run_check(*options); }};
}

}  // namespace gradflow::cli
