// The figures an analysis reports (metrics.md), identified by compile-time ids: every column's
// name, axis and description are written once, in the table of src/science/figures.cpp, whose
// order is the output's column order. Reporters print names; the engine and its figure modules
// address columns by id.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/config.hpp"

namespace gradflow {

// In output order: the per-state figures (index 0..S), then the per-sublayer figures (0..S-1).
enum class Figure {
  rms,
  log10_grad,
  log10_grad_rel,
  log10_grad_se,
  token_cos,
  erank,
  log10_singular_value,  // numbered 1..--spectrum
  log10_jacobian_fro_exact,
  log10_jacobian_spectral_exact,
  log10_singular_value_exact,  // numbered 1..--spectrum, with --exact-jacobian
  update_rms,                  // numbered 1..(number of --lr), with --update
  log10_update_rel,            // numbered like update_rms
  gain,
  skip_gain,
  branch_gain,
  skip_gain_theory,
  branch_rms,
  stream_share,
  output_share,
  output_share_se,
  stream_decomposition,
  angle,
  block_influence,
  log10_param_grad,
  update_loss,        // numbered like update_rms
  update_loss_share,  // numbered like update_rms
};

enum class FigureAxis { state, sublayer };

struct FigureInfo {
  Figure figure;
  std::string_view name;  // numbered figures hold "{}" where the number goes
  FigureAxis axis;
  // How many columns of it a run with this configuration reports (0: none, 1: one, k: numbered).
  int (*count)(const ModelConfig& config);
  std::string_view description;
};

// The table, in output order (one row per Figure).
const std::vector<FigureInfo>& figure_table();
const FigureInfo& figure_info(Figure figure);

// One column: a figure, and for numbered figures its number (1-based).
struct FigureId {
  Figure figure;
  int number = 0;
  constexpr FigureId(Figure f, int n = 0) : figure(f), number(n) {}  // NOLINT: a Figure is an id
  bool operator==(const FigureId&) const = default;
};
std::string figure_name(FigureId id);  // "gain", "log10_singular_value_2", ...

// Columns of equal length, in output order. NaN marks "no value" (null / empty cell).
struct FigureColumns {
  std::vector<FigureId> ids;
  std::vector<std::string> names;  // figure_name(ids[i]): the output's keys
  std::vector<std::vector<double>> values;

  std::vector<double>& add(FigureId id, std::size_t length);
  const std::vector<double>* find(FigureId id) const;
  std::vector<double>& at(FigureId id);  // throws std::logic_error when missing
  const std::vector<double>& at(FigureId id) const;
};

// The columns of `axis` that a run of `config` reports, in table order, each `length` NaNs.
FigureColumns allocate_figures(const ModelConfig& config, FigureAxis axis, std::size_t length);

}  // namespace gradflow
