// Sweep grids, shards and cross-depth fits (src/sweep.cpp).
#include "gradflow/sweep.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "gradflow/errors.hpp"

using namespace gradflow;

TEST_CASE("cells come in one global order and shards partition them") {
  const SweepGrid grid{{"pre-ln", "keel"}, {8, 16}, {32, 64}, 3};
  const auto cells = sweep_cells(grid);
  REQUIRE(cells.size() == 24);
  CHECK(cell_file_name(cells.front()) == "pre-ln_B8_d32_s0.json");
  CHECK(cell_file_name(cells[1]) == "pre-ln_B8_d32_s1.json");
  CHECK(cell_file_name(cells[3]) == "pre-ln_B8_d64_s0.json");
  CHECK(cell_file_name(cells.back()) == "keel_B16_d64_s2.json");
  std::multiset<std::string> seen;
  for (int i = 0; i < 5; ++i) {
    const auto shard = shard_cells(cells, i, 5);
    if (!shard.empty())
      CHECK(cell_file_name(shard.front()) == cell_file_name(cells[static_cast<std::size_t>(i)]));
    for (const auto& cell : shard) seen.insert(cell_file_name(cell));
  }
  CHECK(seen.size() == cells.size());
  CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == cells.size());
}

TEST_CASE("shard and list parsing refuse what they cannot mean") {
  CHECK(parse_shard("0/3") == std::pair{0, 3});
  CHECK(parse_shard("2/3") == std::pair{2, 3});
  CHECK_THROWS_AS(parse_shard("3/3"), InputError);
  CHECK_THROWS_AS(parse_shard("1/0"), InputError);
  CHECK_THROWS_AS(parse_shard("1"), InputError);
  CHECK(parse_int_list("8,16,32", "--depth") == std::vector<int>{8, 16, 32});
  CHECK_THROWS_AS(parse_int_list("8,,32", "--depth"), InputError);
  CHECK_THROWS_AS(parse_int_list("8,-1", "--depth"), InputError);
  CHECK_THROWS_AS(parse_int_list("8,8", "--depth"), InputError);
}

TEST_CASE("the cross-depth fit recovers an exact power law, and its interval is zero without seed noise") {
  const std::vector<double> x = {std::log(16.0), std::log(32.0), std::log(64.0)};
  std::vector<std::vector<double>> values;
  for (double lx : x) values.push_back({0.5 * lx + 1.0, 0.5 * lx + 1.0, 0.5 * lx + 1.0});
  const BootstrapFit fit = fit_across_depths(x, values);
  CHECK(fit.slope == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(fit.ci95_low == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(fit.ci95_high == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(fit.depths == 3);
}

TEST_CASE("the bootstrap interval brackets the point fit, is reproducible, and widens with seed noise") {
  const std::vector<double> x = {1, 2, 3, 4};
  // Seed s has slope 0.4 + 0.1 s: the across-seed mean slope is 0.55.
  std::vector<std::vector<double>> values(4);
  for (int d = 0; d < 4; ++d) {
    for (int s = 0; s < 4; ++s) values[d].push_back((0.4 + 0.1 * s) * x[d]);
  }
  const BootstrapFit a = fit_across_depths(x, values), b = fit_across_depths(x, values);
  CHECK(a.slope == doctest::Approx(0.55));
  CHECK(a.ci95_low < a.slope);
  CHECK(a.ci95_high > a.slope);
  CHECK(a.ci95_low >= 0.4 - 1e-12);
  CHECK(a.ci95_high <= 0.7 + 1e-12);
  CHECK(a.ci95_low == b.ci95_low);
  CHECK(a.ci95_high == b.ci95_high);
  const BootstrapFit other_seed = fit_across_depths(x, values, kBootstrapResamples, 7);
  CHECK(other_seed.slope == a.slope);
}

TEST_CASE("fit_sweep fits rms(x_S) against S per arch and width and names the class") {
  const SweepGrid grid{{"a", "b"}, {4, 8, 16}, {32}, 2};
  std::vector<CellFigures> cells;
  for (const auto& cell : sweep_cells(grid)) {
    const int sublayers = 2 * cell.depth;
    const double p = cell.arch == "a" ? 0.5 : 0.0;
    const double noise = cell.seed == 0 ? 1.01 : 0.99;
    cells.push_back({cell, sublayers, noise * std::pow(sublayers, p), -0.001 * sublayers, {}, {}});
  }
  const auto fits = fit_sweep(grid, cells);
  REQUIRE(fits.size() == 2);
  CHECK(fits[0].update_exponents.empty());  // no --update, no update fit
  CHECK(fits[0].arch == "a");
  CHECK(fits[0].growth_exponent.slope == doctest::Approx(0.5).epsilon(1e-9));
  CHECK(fits[0].growth_class == "sqrt");
  CHECK(fits[1].growth_class == "bounded");
  CHECK(fits[1].grad_ratio_slope.slope == doctest::Approx(-0.001).epsilon(1e-9));
  CHECK(fits[0].sublayers == std::vector<int>{8, 16, 32});
  cells.pop_back();
  CHECK_THROWS(fit_sweep(grid, cells));
}

TEST_CASE("fit_sweep fits output_update_rel's exponent against S per learning rate, with its interval") {
  const SweepGrid grid{{"post-ln", "deepnorm"}, {4, 8, 16}, {32}, 3};
  std::vector<CellFigures> cells;
  for (const auto& cell : sweep_cells(grid)) {
    const int sublayers = 2 * cell.depth;
    const double p = cell.arch == "post-ln" ? 0.5 : 0.0;
    const double noise = 1.0 + 0.02 * (static_cast<double>(cell.seed) - 1.0);
    // learning rate 1e-3 moves the output 10x as far as 1e-4, with the same exponent
    cells.push_back({cell,
                     sublayers,
                     1.0,
                     0.0,
                     {1e-4, 1e-3},
                     {1e-4 * noise * std::pow(sublayers, p), 1e-3 * noise * std::pow(sublayers, p + 0.25)}});
  }
  const auto fits = fit_sweep(grid, cells);
  REQUIRE(fits.size() == 2);
  REQUIRE(fits[0].update_exponents.size() == 2);
  CHECK(fits[0].learning_rates == std::vector<double>{1e-4, 1e-3});
  CHECK(fits[0].update_exponents[0].slope == doctest::Approx(0.5).epsilon(1e-9));
  CHECK(fits[0].update_exponents[1].slope == doctest::Approx(0.75).epsilon(1e-9));
  CHECK(fits[1].update_exponents[0].slope == doctest::Approx(0.0).epsilon(1e-9));
  CHECK(fits[0].update_exponents[0].ci95_low <= 0.5);
  CHECK(fits[0].update_exponents[0].ci95_high >= 0.5);
  CHECK(fits[0].update_exponents[0].depths == 3);
}
