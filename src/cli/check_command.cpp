// `gradflow check`: a CI gate. Compares a result with a baseline figure by figure within
// tolerances, evaluates --expect expressions, prints a Markdown report (or --json) through the
// output formats' table, exits 0 / 1 / 2.
#include <fmt/format.h>

#include <iostream>

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
  const CheckReport report{.result_path = options.result,
                           .baseline_path = options.baseline,
                           .tolerances_path = options.tolerances,
                           .tolerances = tolerances,
                           .comparison = comparison,
                           .outcomes = outcomes,
                           .passed = passed,
                           .result_runs = document_run_names(result),
                           .baseline_runs = document_run_names(baseline),
                           .max_rows = options.max_rows};
  const OutputFormat& format = find_format(options.json_output ? "json" : "markdown", OutputKind::check);
  format.check(report, std::cout);
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
                                 nothing_compared_advice(report)));
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
