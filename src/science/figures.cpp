// The one table of figure columns (metrics.md has the full definitions): name, axis, how many
// columns a configuration reports, one line of meaning. Its order is the JSON's and the CSV's.
#include "gradflow/figures.hpp"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace gradflow {

namespace {
int always(const ModelConfig&) {
  return 1;
}
int spectrum(const ModelConfig& config) {
  return config.spectrum;
}
int exact_jacobian(const ModelConfig& config) {
  return config.exact_jacobian ? 1 : 0;
}
int exact_spectrum(const ModelConfig& config) {
  return config.exact_jacobian ? config.spectrum : 0;
}
int learning_rates(const ModelConfig& config) {
  return config.update_count();
}

constexpr auto kState = FigureAxis::state;
constexpr auto kSublayer = FigureAxis::sublayer;
}  // namespace

const std::vector<FigureInfo>& figure_table() {
  static const std::vector<FigureInfo> table = {
      {Figure::rms, "rms", kState, always, "root mean square of the state"},
      {Figure::log10_grad, "log10_grad", kState, always, "log10 of the probe-RMS of norm(dL/dx_l)"},
      {Figure::log10_grad_rel, "log10_grad_rel", kState, always, "log10_grad[l] - log10_grad[S]"},
      {Figure::log10_grad_se, "log10_grad_se", kState, always,
       "standard error of log10_grad across probes (delta method)"},
      {Figure::token_cos, "token_cos", kState, always, "mean cosine similarity over distinct token pairs"},
      {Figure::erank, "erank", kState, always, "effective rank of the state (Roy & Vetterli 2007)"},
      {Figure::log10_singular_value, "log10_singular_value_{}", kState, spectrum,
       "log10 of the i-th singular value of J_{l->out}, by subspace iteration (--spectrum)"},
      {Figure::log10_jacobian_fro_exact, "log10_jacobian_fro_exact", kState, exact_jacobian,
       "log10 of the exact Frobenius norm of J_{l->out} (--exact-jacobian)"},
      {Figure::log10_jacobian_spectral_exact, "log10_jacobian_spectral_exact", kState, exact_jacobian,
       "log10 of the exact spectral norm of J_{l->out} (--exact-jacobian)"},
      {Figure::log10_singular_value_exact, "log10_singular_value_{}_exact", kState, exact_spectrum,
       "log10 of the i-th singular value of the exact J_{l->out}"},
      {Figure::update_rms, "update_rms_{}", kState, learning_rates,
       "rms(x_l(theta + Delta theta) - x_l(theta)) after one step at the i-th --lr (--update)"},
      {Figure::log10_update_rel, "log10_update_rel_{}", kState, learning_rates,
       "log10(norm(Delta x_l) / norm(x_l)) after one step at the i-th --lr (--update)"},
      {Figure::gain, "gain", kSublayer, always, "norm(g_l) / norm(g_{l+1}), probe-RMS"},
      {Figure::skip_gain, "skip_gain", kSublayer, always, "the part of gain through the skip path only"},
      {Figure::branch_gain, "branch_gain", kSublayer, always, "the part of gain through the branch F"},
      {Figure::skip_gain_theory, "skip_gain_theory", kSublayer, always,
       "the placement's closed form of skip_gain, where it has one"},
      {Figure::branch_rms, "branch_rms", kSublayer, always, "RMS of the update added to the stream"},
      {Figure::stream_share, "stream_share", kSublayer, always, "norm(update) / norm(pre-norm sum)"},
      {Figure::output_share, "output_share", kSublayer, always,
       "the sublayer's share of the first-order contributions to the output"},
      {Figure::output_share_se, "output_share_se", kSublayer, always,
       "delete-one-probe jackknife standard error of output_share"},
      {Figure::stream_decomposition, "stream_decomposition", kSublayer, always,
       "<update_l, x_S> / norm(x_S)^2 for additive streams"},
      {Figure::angle, "angle", kSublayer, always, "mean angular distance / pi between x_l and x_{l+1}"},
      {Figure::block_influence, "block_influence", kSublayer, always,
       "1 - mean cosine between x_l and x_{l+1} per token (ShortGPT)"},
      {Figure::log10_param_grad, "log10_param_grad", kSublayer, always,
       "log10 of the probe-RMS of norm(dL/dW) over the sublayer's matrices"},
      {Figure::update_loss, "update_loss_{}", kSublayer, learning_rates,
       "<dL/dtheta_l, Delta theta_l>: the first-order change of L from the sublayer's step at the i-th --lr"},
      {Figure::update_loss_share, "update_loss_share_{}", kSublayer, learning_rates,
       "update_loss_i[l] / sum over sublayers of update_loss_i"},
  };
  return table;
}

const FigureInfo& figure_info(Figure figure) {
  const auto& row = figure_table()[static_cast<std::size_t>(figure)];
  if (row.figure != figure) throw std::logic_error("figure table out of enum order");
  return row;
}

std::string figure_name(FigureId id) {
  const std::string_view name = figure_info(id.figure).name;
  return id.number > 0 ? fmt::format(fmt::runtime(name), id.number) : std::string(name);
}

std::vector<double>& FigureColumns::add(FigureId id, std::size_t length) {
  ids.push_back(id);
  names.push_back(figure_name(id));
  values.emplace_back(length, std::numeric_limits<double>::quiet_NaN());
  return values.back();
}

const std::vector<double>* FigureColumns::find(FigureId id) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return &values[i];
  }
  return nullptr;
}

const std::vector<double>& FigureColumns::at(FigureId id) const {
  if (const auto* column = find(id)) return *column;
  throw std::logic_error(fmt::format("figure column {} missing", figure_name(id)));
}

std::vector<double>& FigureColumns::at(FigureId id) {
  return const_cast<std::vector<double>&>(static_cast<const FigureColumns&>(*this).at(id));
}

FigureColumns allocate_figures(const ModelConfig& config, FigureAxis axis, std::size_t length) {
  FigureColumns columns;
  for (const FigureInfo& info : figure_table()) {
    if (info.axis != axis) continue;
    const int count = info.count(config);
    const bool numbered = info.name.find("{}") != std::string_view::npos;
    if (!numbered && count > 0) columns.add(info.figure, length);
    for (int i = 1; numbered && i <= count; ++i) columns.add({info.figure, i}, length);
  }
  return columns;
}

}  // namespace gradflow
