// Regression comparison and --expect expressions (src/check.cpp), on small synthetic documents.
#include "gradflow/check.hpp"

#include <doctest/doctest.h>

#include "gradflow/errors.hpp"

using namespace gradflow;
using json = nlohmann::ordered_json;

namespace {
json seed_doc(int seed, double rms_top, double exponent) {
  return {{"seed", seed},
          {"states",
           {{"index", {0, 1, 2}},
            {"rms", {1.0, 1.5, rms_top}},
            {"log10_grad", {0.5, 0.3, 0.0}},
            {"streams", {{"x", {{"rms", {1.0, 1.5, rms_top}}}}}}}},
          {"sublayers",
           {{"index", {0, 1}},
            {"kind", {"attn", "ffn"}},
            {"block", {0, 0}},
            {"gain", {1.2, 0.9}},
            {"skip_gain_theory", {nullptr, nullptr}}}},
          {"summary",
           {{"log10_grad_ratio", 0.5},
            {"gain_min", {{"value", 0.9}, {"sublayer", 1}}},
            {"gain_max", {{"value", 1.2}, {"sublayer", 0}}},
            {"growth_exponent", exponent},
            {"growth_class", exponent > 0.35 ? "sqrt" : "bounded"},
            {"diverged", nullptr}}}};
}

json analyze_doc(const std::string& arch, double rms_top, double exponent = 0.5) {
  json config = {{"arch", arch}, {"blocks", 1}, {"sublayers", 2}, {"width", 8}, {"seq", 4}};
  return {{"schema_version", 1},
          {"command", "analyze"},
          {"runs",
           {{{"arch", arch},
             {"config", config},
             {"seeds", {seed_doc(0, rms_top, exponent), seed_doc(1, rms_top, exponent)}}}}}};
}
}  // namespace

TEST_CASE("figure scales follow the names") {
  CHECK(figure_scale("log10_grad") == FigureScale::log_space);
  CHECK(figure_scale("streams.h.log10_grad") == FigureScale::log_space);
  CHECK(figure_scale("gain") == FigureScale::linear);
  CHECK(figure_scale("skip_gain") == FigureScale::linear);
  CHECK(figure_scale("growth_exponent") == FigureScale::exponent);
  Tolerances t = tolerances_from_json(json{{"linear", 0.1}, {"figures", {{"gain", 0.2}}}}, "t.json");
  CHECK(t.for_figure("rms") == 0.1);
  CHECK(t.for_figure("gain") == 0.2);
  CHECK(t.for_figure("log10_grad") == 0.05);
  CHECK_THROWS_AS(tolerances_from_json(json{{"linaer", 0.1}}, "t.json"), InputError);
  CHECK_THROWS_AS(tolerances_from_json(json{{"linear", -1}}, "t.json"), InputError);
}

TEST_CASE(
    "identical documents pass, and a linear figure off by more than its tolerance is named with its layer") {
  const json base = analyze_doc("keel", 2.0);
  const Comparison same = compare_documents(base, base, {});
  CHECK(same.regressions.empty());
  CHECK(same.runs_compared == 2);
  CHECK(same.figures_compared > 10);

  const Comparison within =
      compare_documents(analyze_doc("keel", 2.0 * 1.1), base, {});  // log10(1.1) = 0.041
  CHECK(within.regressions.empty());
  const Comparison beyond =
      compare_documents(analyze_doc("keel", 2.0 * 1.2), base, {});  // log10(1.2) = 0.079
  REQUIRE(beyond.regressions.size() == 2);                          // both seeds
  CHECK(beyond.regressions[0].placement == "keel");
  CHECK(beyond.regressions[0].figure == "rms");
  CHECK(beyond.regressions[0].layer == "state 2");
  CHECK(beyond.regressions[0].difference == doctest::Approx(std::log10(1.2)));
}

TEST_CASE(
    "missing runs regress, different configurations are recorded as mismatches, and non-documents are bad "
    "input") {
  const json base = analyze_doc("keel", 2.0);
  const Comparison missing = compare_documents(analyze_doc("pre-ln", 2.0), base, {});
  CHECK(missing.regressions.size() == 2);
  CHECK(missing.regressions[0].note == "run missing from the result");
  json other = base;
  other["runs"][0]["config"]["width"] = 16;
  const Comparison mismatch = compare_documents(other, base, {});  // recorded, reported, not compared
  REQUIRE(mismatch.mismatches.size() == 1);
  CHECK(mismatch.mismatches[0].field == "width");
  CHECK(mismatch.mismatches[0].result_value == 16);
  CHECK(mismatch.mismatches[0].baseline_value == 8);
  CHECK(mismatch.runs_compared == 0);
  CHECK_THROWS_AS(compare_documents(json{{"a", 1}}, base, {}), InputError);
}

TEST_CASE("expectations: parsing, evaluation, and unknown names") {
  const Expectation e = parse_expectation("keel.gain_min.value > 0.5");
  CHECK(e.arch == "keel");
  CHECK(e.path == std::vector<std::string>{"gain_min", "value"});
  CHECK(e.op == ">");
  CHECK(e.value == "0.5");
  CHECK(parse_expectation("pre-ln.growth_class==sqrt").op == "==");
  CHECK_THROWS_AS(parse_expectation("keel.log10_grad_ratio ~ 0.1"), InputError);
  CHECK_THROWS_AS(parse_expectation("keel < 0.1"), InputError);
  CHECK_THROWS_AS(parse_expectation("keel.growth_class < sqrt"), InputError);
  CHECK_THROWS_AS(parse_expectation("keel.a.b.c < 1"), InputError);

  const json doc = analyze_doc("keel", 2.0, 0.5);
  CHECK(evaluate_expectation(parse_expectation("keel.log10_grad_ratio < 0.6"), doc).passed);
  CHECK_FALSE(evaluate_expectation(parse_expectation("keel.log10_grad_ratio < 0.1"), doc).passed);
  CHECK(evaluate_expectation(parse_expectation("keel.gain_min.value > 0.5"), doc).passed);
  CHECK(evaluate_expectation(parse_expectation("keel.gain_min > 0.5"), doc).passed);
  CHECK(evaluate_expectation(parse_expectation("keel.growth_class == sqrt"), doc).passed);
  CHECK(evaluate_expectation(parse_expectation("keel.growth_class != bounded"), doc).passed);
  CHECK_THROWS_WITH_AS(evaluate_expectation(parse_expectation("kel.growth_class == sqrt"), doc),
                       doctest::Contains("unknown placement \"kel\""), InputError);
  CHECK_THROWS_WITH_AS(evaluate_expectation(parse_expectation("keel.gradratio < 1"), doc),
                       doctest::Contains("unknown field \"gradratio\""), InputError);
}
