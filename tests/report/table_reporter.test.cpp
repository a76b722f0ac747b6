// The table and Markdown reporters: golden layouts from a hand-made report (no engine run, so
// the goldens do not move when placements are added) and the 120-column limit.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iterator>
#include <sstream>

#include "gradflow/app/report.hpp"

namespace gradflow {
namespace {

// Architecture ids are string_views: the fixtures own their storage here.
std::deque<std::string> id_storage;
std::deque<Architecture> arch_storage;

const Architecture& fake_arch(std::string id) {
  id_storage.push_back(std::move(id));
  Architecture arch;
  arch.id = id_storage.back();
  arch_storage.push_back(arch);
  return arch_storage.back();
}

struct SeedFigures {
  double log10_grad_ratio, rms_top, skip_gain, exponent, exponent_se;
  std::string_view growth_class;
  Extremum gain_min, gain_max;
  std::optional<Divergence> diverged = std::nullopt;
};

SeedResult make_seed(std::uint64_t seed, int sublayers, const SeedFigures& f) {
  SeedResult result;
  result.seed = seed;
  auto& rms = result.states.add(Figure::rms, sublayers + 1);
  std::fill(rms.begin(), rms.end(), 1.0);
  rms.back() = f.rms_top;
  auto& gain = result.sublayers.add(Figure::gain, sublayers);
  std::fill(gain.begin(), gain.end(), 1.0);
  auto& skip = result.sublayers.add(Figure::skip_gain, sublayers);
  std::fill(skip.begin(), skip.end(), f.skip_gain);
  result.log10_grad_ratio = f.log10_grad_ratio;
  result.gain_min = f.gain_min;
  result.gain_max = f.gain_max;
  result.growth.exponent = f.exponent;
  result.growth.standard_error = f.exponent_se;
  result.growth.growth_class = f.growth_class;
  result.diverged = f.diverged;
  return result;
}

ArchResult make_result(std::string id, int blocks, const std::vector<SeedFigures>& seeds) {
  ArchResult result;
  result.arch = &fake_arch(std::move(id));
  result.config.arch = std::string(result.arch->id);
  result.config.blocks = blocks;
  for (std::size_t s = 0; s < seeds.size(); ++s) {
    result.seeds.push_back(make_seed(s, result.config.sublayers(), seeds[s]));
  }
  return result;
}

// Three placements at depth 8 (S = 16), one seed; the last diverged in its backward pass.
AnalysisReport single_seed_report() {
  AnalysisReport report;
  report.results.push_back(make_result(
      "post-ln", 8, {{0.2113, 1.0, 0.7071, 0.0001, 0.0003, "bounded", {0.7165, 12}, {1.0213, 3}}}));
  report.results.push_back(
      make_result("pre-ln", 8, {{0.8891, 3.012, 0.9998, 0.5932, 0.0041, "sqrt", {0.9999, 15}, {1.3104, 0}}}));
  report.results.push_back(make_result("hybridnorm-star", 8,
                                       {{-12.5,
                                         std::nan(""),
                                         1e-5,
                                         std::nan(""),
                                         std::nan(""),
                                         "undetermined",
                                         {2.5e-7, 9},
                                         {31415.9, 2},
                                         Divergence{9, "backward", "overflow"}}}));
  return report;
}

// Two placements, three seeds each (mean ± std across seeds); one seed of keel diverged.
AnalysisReport three_seed_report() {
  AnalysisReport report;
  report.results.push_back(
      make_result("pre-ln", 64,
                  {{0.881, 7.95, 0.9999, 0.591, 0.004, "sqrt", {0.9999, 127}, {1.2, 0}},
                   {0.889, 7.96, 0.9999, 0.593, 0.004, "sqrt", {0.9998, 101}, {1.3, 1}},
                   {0.897, 7.97, 0.9999, 0.595, 0.004, "sqrt", {0.9997, 88}, {1.4, 2}}}));
  report.results.push_back(
      make_result("keel", 64,
                  {{0.030, 1.0, 0.95, -0.0002, 0.0001, "bounded", {0.9545, 4}, {1.01, 7}},
                   {0.032, 1.0, 0.95, 0.0000, 0.0001, "bounded", {0.9501, 6}, {1.02, 9}},
                   {0.034,
                    1.0,
                    0.95,
                    0.0002,
                    0.0001,
                    "bounded",
                    {0.9580, 2},
                    {1.03, 5},
                    Divergence{100, "forward", "overflow"}}}));
  return report;
}

std::string table(const AnalysisReport& report, bool colour = false) {
  std::ostringstream out;
  write_table(report, out, {.colour = colour});
  return out.str();
}

std::string markdown(const AnalysisReport& report) {
  std::ostringstream out;
  write_markdown(report, out);
  return out.str();
}

// Terminal columns of a line: UTF-8 continuation bytes and ANSI SGR sequences take none.
std::size_t display_width(const std::string& line) {
  std::size_t width = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\033') {
      while (i < line.size() && line[i] != 'm') ++i;
      continue;
    }
    width += (static_cast<unsigned char>(line[i]) & 0xC0) != 0x80;
  }
  return width;
}

std::size_t widest_line(const std::string& text) {
  std::istringstream lines(text);
  std::size_t widest = 0;
  for (std::string line; std::getline(lines, line);) widest = std::max(widest, display_width(line));
  return widest;
}

std::string without_ansi(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\033') {
      while (i < text.size() && text[i] != 'm') ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

// Compares `actual` with tests/report/golden/NAME; GRADFLOW_UPDATE_GOLDEN=1 rewrites the file
// instead (then review the diff).
void check_golden(const std::string& name, const std::string& actual) {
  const std::string path = std::string(GRADFLOW_TEST_DIR) + "/report/golden/" + name;
  if (const char* update = std::getenv("GRADFLOW_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << actual;
  }
  std::ifstream file(path, std::ios::binary);
  REQUIRE_MESSAGE(file, "missing golden file " << path << "; run with GRADFLOW_UPDATE_GOLDEN=1 to create it");
  const std::string expected((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CAPTURE(name);
  CHECK(actual == expected);
}

}  // namespace

TEST_CASE("table and markdown: golden layouts") {
  check_golden("table_one_seed.txt", table(single_seed_report()));
  check_golden("table_three_seeds.txt", table(three_seed_report()));
  check_golden("markdown_three_seeds.md", markdown(three_seed_report()));
}

// --update: the three-seed report with two learning rates; keel's second step diverged in seed 2.
AnalysisReport update_report() {
  AnalysisReport report = three_seed_report();
  for (ArchResult& result : report.results) {
    result.config.update = UpdateRule::adam;
    result.config.learning_rates = {1e-4, 1e-3};
    for (std::size_t s = 0; s < result.seeds.size(); ++s) {
      for (const double lr : result.config.learning_rates) {
        UpdateStep step;
        step.learning_rate = lr;
        step.output_update_rel = lr * (result.arch->id == "keel" ? 70.0 : 1000.0) * (1.0 + 0.1 * s);
        step.delta_loss = -lr * 1.3e4;
        step.delta_loss_first_order = -lr * 1.4e4;
        if (result.arch->id == "keel" && lr == 1e-3 && s == 2) step.diverged_state = 40;
        result.seeds[s].updates.push_back(step);
      }
    }
  }
  return report;
}

TEST_CASE("table and markdown with --update: one line per placement and learning rate") {
  check_golden("table_update.txt", table(update_report()));
  check_golden("markdown_update.md", markdown(update_report()));
  CHECK(table(three_seed_report()).find("step on the probe loss") == std::string::npos);
}

TEST_CASE("table: colour only when asked, and it does not move any column") {
  const AnalysisReport report = single_seed_report();
  CHECK(table(report, false).find('\033') == std::string::npos);
  const std::string coloured = table(report, true);
  CHECK(coloured.find("\033[1m") != std::string::npos);   // bold header
  CHECK(coloured.find("\033[31m") != std::string::npos);  // red divergence
  CHECK(without_ansi(coloured) == table(report, false));
}

TEST_CASE("table: 21 placements with 16-character ids and extreme figures fit in 120 columns") {
  for (const int seeds : {1, 3}) {
    CAPTURE(seeds);
    AnalysisReport report;
    for (int p = 0; p < 21; ++p) {
      std::vector<SeedFigures> figures;
      for (int s = 0; s < seeds; ++s) {
        const double jitter = 1.0 + 0.37 * s;
        figures.push_back({-300.123 * jitter,
                           12345.6 * jitter,
                           0.7,
                           -0.1234 * jitter,
                           0.4567,
                           "other",
                           {1.234e-5, 2047},
                           {1.234e5, 2046},
                           Divergence{2047, "backward", "overflow"}});
      }
      report.results.push_back(make_result(fmt::format("placement-{:06d}", p), 1024, figures));
    }
    REQUIRE(report.results.front().arch->id.size() == 16);
    const std::string text = table(report, true);
    CHECK(std::count(text.begin(), text.end(), '\n') == 21 + 4);
    CHECK(widest_line(text) <= 120);
  }
}

}  // namespace gradflow
