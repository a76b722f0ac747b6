// The figure table (src/science/figures.cpp): one row per id in enum order, unique names, and
// the columns a configuration gets, in the output's order.
#include "gradflow/figures.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <stdexcept>

using namespace gradflow;

TEST_CASE("the figure table has one row per Figure, in enum order, with unique names") {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < figure_table().size(); ++i) {
    const FigureInfo& row = figure_table()[i];
    CHECK(static_cast<std::size_t>(row.figure) == i);
    CHECK(names.insert(row.name).second);
    CHECK_FALSE(row.description.empty());
  }
  CHECK(figure_table().back().figure == Figure::update_loss_share);  // the last Figure: every one has a row
  CHECK(figure_name({Figure::log10_singular_value_exact, 3}) == "log10_singular_value_3_exact");
  CHECK(figure_name({Figure::log10_update_rel, 2}) == "log10_update_rel_2");
}

TEST_CASE("allocate_figures gives a configuration's columns in output order") {
  ModelConfig config;
  config.spectrum = 2;
  config.exact_jacobian = true;
  const FigureColumns states = allocate_figures(config, FigureAxis::state, 4);
  const std::vector<std::string> expected = {"rms",
                                             "log10_grad",
                                             "log10_grad_rel",
                                             "log10_grad_se",
                                             "token_cos",
                                             "erank",
                                             "log10_singular_value_1",
                                             "log10_singular_value_2",
                                             "log10_jacobian_fro_exact",
                                             "log10_jacobian_spectral_exact",
                                             "log10_singular_value_1_exact",
                                             "log10_singular_value_2_exact"};
  CHECK(states.names == expected);
  CHECK(states.values.at(0).size() == 4);
  CHECK(std::isnan(states.at(Figure::rms)[3]));
  CHECK(&states.at({Figure::log10_singular_value, 2}) == &states.values[7]);

  config.spectrum = 0;
  config.exact_jacobian = false;
  const FigureColumns sublayers = allocate_figures(config, FigureAxis::sublayer, 3);
  CHECK(sublayers.names.size() == 12);
  CHECK(sublayers.names.front() == "gain");
  CHECK(sublayers.names.back() == "log10_param_grad");
  CHECK_THROWS_AS(sublayers.at(Figure::rms), std::logic_error);
  CHECK(allocate_figures(config, FigureAxis::state, 3).find(Figure::log10_singular_value) == nullptr);
}
