// The closed forms under the idealised branch (a 90-degree rotation within coordinate pairs):
// post-ln's skip factor 1/sqrt(2) and keel's S/sqrt(S^2+1) per sublayer (Keel, arXiv 2601.19895,
// Eq. 15 and 19), and the JSON field that carries them.
#include <doctest/doctest.h>

#include <cmath>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"

using namespace gradflow;

namespace {
SeedResult ideal_run(std::string_view arch_id, int blocks, int width, Precision precision = Precision::f64) {
  ModelConfig config;
  config.arch = std::string(arch_id);
  config.blocks = blocks;
  config.width = width;
  config.seq = 16;
  config.precision = precision;
  config.branch = BranchKind::rotation;
  const Architecture& arch = find_architecture(arch_id);
  return analyze_seed(config, arch, resolve_constants(arch, config), 0);
}
}  // namespace

TEST_CASE("post-ln: measured skip factor is 1/sqrt(2) per sublayer, up to the norm's 1/d projection") {
  const int width = 64, blocks = 8, sublayers = 16;
  const SeedResult run = ideal_run("post-ln", blocks, width);
  const auto& skip = run.sublayers.at(Figure::skip_gain);
  const auto& theory = run.sublayers.at(Figure::skip_gain_theory);
  const double closed_form = 1.0 / std::sqrt(2.0);
  for (int l = 0; l < sublayers; ++l) CHECK(theory[l] == doctest::Approx(closed_form).epsilon(1e-15));
  // Below the top, g_{l+1} is orthogonal to x_{l+1} (the norm above removed that direction), so
  // the projection costs nothing and the factor is 1/sqrt(2) to the norm's eps.
  for (int l = 1; l < sublayers - 1; ++l) {
    CAPTURE(l);
    CHECK(skip[l] == doctest::Approx(closed_form).epsilon(1e-5));
  }
  // At the top the probe is a random direction: the projection removes about 1/d of it.
  const double top = skip[sublayers - 1] / closed_form;
  CHECK(top <= 1.0);
  CHECK(top >= std::sqrt(1.0 - 4.0 / width));
  // The skip path's product over the stack: 2^(-S/2) (Keel Eq. 15), up to the first sublayer
  // (x_0 is not normalised) and the top one's projection.
  double log10_skip_product = 0;
  for (int l = 0; l < sublayers; ++l) log10_skip_product += std::log10(skip[l]);
  CHECK(std::abs(log10_skip_product - (-sublayers / 2.0) * std::log10(2.0)) < 0.1);
  // The full gain also carries the branch: (I + R) scales by sqrt(2) and cancels the norm's 1/sqrt(2).
  for (int l = 1; l < sublayers - 1; ++l)
    CHECK(run.sublayers.at(Figure::gain)[l] == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("keel: measured skip factor is S/sqrt(S^2+1) beyond its first two sublayers, within 1/d") {
  const int width = 64, blocks = 8, sublayers = 16;
  const SeedResult run = ideal_run("keel", blocks, width);
  const auto& skip = run.sublayers.at(Figure::skip_gain);
  const auto& theory = run.sublayers.at(Figure::skip_gain_theory);
  const double s = sublayers, closed_form = s / std::sqrt(s * s + 1.0);
  CHECK(theory[0] == doctest::Approx(1.0));                   // v2: first attention is plain pre-ln
  CHECK(theory[1] == doctest::Approx(1.0 / std::sqrt(2.0)));  // v2: first FFN uses a = 1
  for (int l = 2; l < sublayers; ++l) {
    CAPTURE(l);
    CHECK(theory[l] == doctest::Approx(closed_form).epsilon(1e-15));
    const double ratio = skip[l] / closed_form;
    CHECK(ratio <= 1.0 + 1e-9);
    CHECK(ratio >= std::sqrt(1.0 - 4.0 / width));
  }
}

TEST_CASE(
    "keel at the Keel paper's depths: gradflow's skip path gives (1+1/S^2)^(-S/2), 0.9922 at S = 64, "
    "0.99902 at S = 512") {
  const int width = 64;
  for (const auto& [s, paper] : {std::pair{64, 0.9922}, std::pair{512, 0.99902}}) {
    CAPTURE(s);
    const SeedResult run = ideal_run("keel", s / 2, width);
    const auto& skip = run.sublayers.at(Figure::skip_gain);
    const auto& theory = run.sublayers.at(Figure::skip_gain_theory);
    const double closed_form = std::pow(1.0 + 1.0 / (double(s) * s), -s / 2.0);  // Keel Eq. 19
    CHECK(closed_form == doctest::Approx(paper).epsilon(1e-4));                  // the paper's digits
    // The first two sublayers are v2's own (checked above); the geometric mean of gradflow's
    // factors over the rest, taken to the power S, is the paper's product over a uniform stack.
    double log_theory = 0, log_skip = 0;
    for (int l = 2; l < s; ++l) log_theory += std::log(theory[l]);
    for (int l = 2; l < s - 1; ++l) log_skip += std::log(skip[l]);  // the top loses ~1/d to its projection
    const double theory_product = std::exp(log_theory * s / (s - 2));
    const double measured_product = std::exp(log_skip * s / (s - 3));
    CHECK(theory_product == doctest::Approx(closed_form).epsilon(1e-12));
    // Measured through the backward pass: the norms' projections take a little more (1.2e-4 at
    // S = 64, d = 64), never less.
    CHECK(measured_product <= closed_form * (1 + 1e-12));
    CHECK(measured_product == doctest::Approx(closed_form).epsilon(1e-3));
  }
}

TEST_CASE("the JSON's skip_gain_theory carries the closed forms") {
  ModelConfig config;
  config.blocks = 4;
  config.width = 16;
  config.seq = 8;
  config.branch = BranchKind::rotation;
  AnalysisReport report;
  for (const char* id : {"post-ln", "keel"}) {
    ArchResult result;
    result.arch = &find_architecture(id);
    result.config = config;
    result.constants = resolve_constants(*result.arch, config);
    result.seeds.push_back(analyze_seed(config, *result.arch, result.constants, 0));
    report.results.push_back(std::move(result));
  }
  const auto doc = report_to_json(report);
  const auto& post = doc["runs"][0]["seeds"][0]["sublayers"]["skip_gain_theory"];
  const auto& keel = doc["runs"][1]["seeds"][0]["sublayers"]["skip_gain_theory"];
  CHECK(post[3].get<double>() == doctest::Approx(1.0 / std::sqrt(2.0)));
  CHECK(keel[5].get<double>() == doctest::Approx(8.0 / std::sqrt(65.0)));
}
