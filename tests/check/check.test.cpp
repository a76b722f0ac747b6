// Regression comparison and --expect expressions (src/check.cpp), on small synthetic documents.
#include "gradflow/app/check.hpp"

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

TEST_CASE("check gates every number, word and extremum of the summary table, effective_depth included") {
  json base = analyze_doc("keel", 2.0);
  for (json& seed : base["runs"][0]["seeds"]) {
    seed["summary"]["effective_depth"] = 4.0;
    seed["summary"]["growth_exponent_se"] = 0.01;
  }
  const auto with = [&](const char* key, const json& value) {
    json doc = base;
    doc["runs"][0]["seeds"][1]["summary"][key] = value;
    return compare_documents(doc, base, {});
  };
  const auto figures = [](const Comparison& c) {
    std::vector<std::string> out;
    for (const Regression& r : c.regressions) out.push_back(r.figure);
    return out;
  };
  CHECK(figures(with("effective_depth", 4.0 * 1.1)).empty());  // log10(1.1) = 0.041 < 0.05 decades
  CHECK(figures(with("effective_depth", 4.0 * 1.2)) == std::vector<std::string>{"effective_depth"});
  CHECK(figures(with("effective_depth", nullptr)) == std::vector<std::string>{"effective_depth"});
  CHECK(figures(with("growth_exponent_se", 0.08)) == std::vector<std::string>{"growth_exponent_se"});
  CHECK(figures(with("growth_class", "linear")) == std::vector<std::string>{"growth_class"});
  // A share near zero is compared absolutely: 0.04 -> 0.004 is within 0.05, 0.04 -> -0.04 is not.
  for (json& seed : base["runs"][0]["seeds"]) seed["summary"]["stream_decomposition_input"] = 0.04;
  CHECK(figures(with("stream_decomposition_input", 0.004)).empty());
  CHECK(figures(with("stream_decomposition_input", 0.12)) ==
        std::vector<std::string>{"stream_decomposition_input"});
  CHECK(figures(with("stream_decomposition_input", -0.04)) ==
        std::vector<std::string>{"stream_decomposition_input"});
  CHECK(figures(with("gain_min", json{{"value", 0.5}, {"sublayer", 1}})) ==
        std::vector<std::string>{"gain_min"});
  // Structures and events are not compared themselves (their figures are).
  CHECK(figures(with("growth_fit", json{{"exponent", 3.0}})).empty());
  CHECK(figures(with("diverged", json{{"sublayer", 1}})).empty());
  // A baseline written before a field existed lacks it: the field is not compared.
  json older = base;
  for (json& seed : older["runs"][0]["seeds"]) seed["summary"].erase("effective_depth");
  json newer = base;
  newer["runs"][0]["seeds"][1]["summary"]["effective_depth"] = 9.0;
  CHECK(compare_documents(newer, older, {}).regressions.empty());
  CHECK_FALSE(compare_documents(newer, base, {}).regressions.empty());
}

TEST_CASE("a new summary figure is one row of the table, and check then gates it with the row's tolerance") {
  std::vector<SummaryField> fields = summary_fields();
  fields.push_back({.key = "new_figure",
                    .kind = SummaryKind::number,
                    .value = [](const SeedResult&) { return json(0.5); },
                    .sample = [](const SeedResult&) { return 0.5; },
                    .scale = FigureScale::linear,
                    .tolerance = 0.01});
  // The row reaches the per-seed JSON and the across-seed aggregate...
  SeedResult seed;
  CHECK(summary_to_json(seed, fields).at("new_figure") == 0.5);
  CHECK(aggregate_summary_to_json({seed, seed}, fields).at("new_figure").at("mean") == 0.5);
  CHECK_FALSE(summary_to_json(seed).contains("new_figure"));
  // ... and check gates it: 0.5 -> 0.52 is 0.017 decades, beyond the row's 0.01 but within the
  // linear default of 0.05 that an unknown figure would get.
  json base = analyze_doc("keel", 2.0), moved = base;
  for (json& s : base["runs"][0]["seeds"]) s["summary"]["new_figure"] = 0.5;
  for (json& s : moved["runs"][0]["seeds"]) s["summary"]["new_figure"] = 0.52;
  const Comparison gated = compare_documents(moved, base, {}, fields);
  REQUIRE(gated.regressions.size() == 2);  // both seeds
  CHECK(gated.regressions[0].figure == "new_figure");
  CHECK(gated.regressions[0].tolerance == 0.01);
  CHECK(compare_documents(moved, base, {}).regressions.empty());  // without the row: not a figure
  Tolerances looser;
  looser.per_figure["new_figure"] = 0.1;  // --tolerances' figures still override the row
  CHECK(compare_documents(moved, base, looser, fields).regressions.empty());
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
