// Regression checks between two gradflow documents (analyze, cell or sweep), and the small
// expectation language of `gradflow check --expect`. Works on parsed JSON; no files here.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gradflow/app/report.hpp"

namespace gradflow {

// How a figure's difference is measured (FigureScale, report.hpp): a summary figure's scale is
// its summary_fields() row's; any other by its name: log10_* in log space, *exponent* as an
// exponent, the rest (rms, gain, *_gain, branch_rms, stream_share, ...) linear.
FigureScale figure_scale(std::string_view figure, const std::vector<SummaryField>& fields = summary_fields());

struct Tolerances {
  double log_space = 0.05;                   // decades
  double linear = 0.05;                      // decades of the ratio new / old (about 12%)
  double exponent = 0.05;                    // growth exponent, absolute
  std::map<std::string, double> per_figure;  // overrides by figure name (e.g. "gain": 0.1)
  // per_figure's, else the summary table's stated tolerance (`fields`), else its scale's.
  double for_figure(const std::string& figure,
                    const std::vector<SummaryField>& fields = summary_fields()) const;
};
// {"log_space": x, "linear": x, "exponent": x, "figures": {"gain": x, ...}}; every key optional.
// Throws InputError naming `origin` and the bad key or value.
Tolerances tolerances_from_json(const nlohmann::ordered_json& json, const std::string& origin);

struct Regression {
  std::string placement, run, figure, layer;    // run: "seed 0" or "B16 d256 seed 0"
  nlohmann::ordered_json old_value, new_value;  // numbers, strings or null
  double difference = 0.0, tolerance = 0.0;
  std::string note;  // e.g. "missing from the result", "became null"
};

// A run of the baseline whose counterpart in the result measures another configuration: not
// compared, and the check cannot pass.
struct ConfigMismatch {
  std::string placement, field;
  nlohmann::ordered_json result_value, baseline_value;
};

// The largest finite difference seen for one figure, and where.
struct LargestDifference {
  double difference = 0.0, tolerance = 0.0;
  std::string placement, run, layer;
};

struct Comparison {
  long long figures_compared = 0;
  int runs_compared = 0;
  std::vector<Regression> regressions;
  std::vector<ConfigMismatch> mismatches;
  std::map<std::string, LargestDifference> largest;  // by figure name
  std::vector<std::string> notes;                    // runs present only in the result, and the like
};
// Compares every figure of every run of `baseline` with the run of `result` with the same arch
// and seed (and depth and width, for sweeps). Runs of different configurations are recorded in
// `mismatches` (field and both values) and not compared. Throws InputError when a document is not
// a gradflow document.
// Summary figures are compared as `fields` (summary_fields()) says.
Comparison compare_documents(const nlohmann::ordered_json& result, const nlohmann::ordered_json& baseline,
                             const Tolerances& tolerances,
                             const std::vector<SummaryField>& fields = summary_fields());

// ARCH.FIELD[.SUBFIELD] OP VALUE, OP one of < <= > >= == !=; VALUE a number or a word.
struct Expectation {
  std::string text, arch, op, value;
  std::vector<std::string> path;  // FIELD[, SUBFIELD]
};
Expectation parse_expectation(const std::string& text);  // throws InputError naming the text

struct ExpectationOutcome {
  std::string text;
  bool passed = false;
  std::string actual;  // the value(s) it was evaluated on
};
// On an analyze document FIELD is a seed summary field (numbers averaged over seeds;
// growth_class is the seeds' class when they agree, else that of the mean exponent); on a sweep document it
// is a field of the cross-depth fit, which must hold for every width. An object with a "value" stands for it.
// Throws InputError naming an unknown arch or field.
ExpectationOutcome evaluate_expectation(const Expectation& expectation, const nlohmann::ordered_json& result);

// ---- the report of a check (src/report/check_reporter.cpp)
// A finished check: what was compared, how, and what came of it.
struct CheckReport {
  std::string result_path, baseline_path, tolerances_path;  // as given; tolerances "" for the defaults
  Tolerances tolerances;
  Comparison comparison;
  std::vector<ExpectationOutcome> outcomes;
  bool passed = false;
  // The runs of each document ("arch seed N", "arch B.. d.. seed N"), named when nothing matched.
  std::vector<std::string> result_runs, baseline_runs;
  int max_rows = 50;  // rows listed in each Markdown table
};
// The runs of a document, "arch seed N" (or "arch B.. d.. seed N" for sweeps).
std::vector<std::string> document_run_names(const nlohmann::ordered_json& document);
// What to do when the first mismatch's field was or was not meant to change.
std::string mismatch_advice(const Comparison& comparison);
// Why nothing was compared, naming the runs of both documents, and what to do.
std::string nothing_compared_advice(const CheckReport& report);
// The report as Markdown (the CI step summary), or as JSON indented by one.
void write_check_markdown(const CheckReport& report, std::ostream& out);
void write_check_json(const CheckReport& report, std::ostream& out);

}  // namespace gradflow
