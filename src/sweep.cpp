// Depth sweeps: cell order, shards, and cross-depth fits with a bootstrap over seeds.
#include "gradflow/sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "gradflow/config.hpp"
#include "gradflow/decimal.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/rng.hpp"
#include "gradflow/statistics.hpp"

namespace gradflow {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool parse_int(std::string_view text, int& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

// The per-depth means of values[d][.] over the seed indices `picks`.
std::vector<double> means_over(const std::vector<std::vector<double>>& values,
                               const std::vector<std::size_t>& picks) {
  std::vector<double> means;
  for (const auto& per_seed : values) {
    double sum = 0;
    for (std::size_t s : picks) sum += per_seed[s];
    means.push_back(picks.empty() ? kNaN : sum / static_cast<double>(picks.size()));
  }
  return means;
}

// Linear-interpolated percentile of sorted finite values (q in [0, 1]).
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return kNaN;
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(position));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (position - static_cast<double>(below)) * (sorted[above] - sorted[below]);
}

// A grid lists each placement, depth and width once: a repeat would make two cells of one file
// (computed twice, counted twice in the fits).
template <typename T>
void refuse_repeats(const std::vector<T>& values, const char* what, const std::string& origin) {
  std::vector<T> sorted = values;  // sorted, so that a list of a million depths is checked at once
  std::sort(sorted.begin(), sorted.end());
  const auto repeat = std::adjacent_find(sorted.begin(), sorted.end());
  if (repeat != sorted.end())
    throw InputError(
        fmt::format("{}: {} lists {} twice; a sweep's grid names each once", origin, what, *repeat));
}
}  // namespace

void validate_grid(const SweepGrid& grid, const std::string& origin) {
  if (grid.archs.empty()) throw InputError(fmt::format("{}: the sweep lists no placement (archs)", origin));
  if (grid.depths.empty() || grid.widths.empty())
    throw InputError(fmt::format("{}: the sweep lists no depth or no width", origin));
  for (const int depth : grid.depths) {
    if (depth < 1 || depth > kMaxBlocks)
      throw InputError(fmt::format("{}: depth {} is not in [1, {}]", origin, depth, kMaxBlocks));
  }
  for (const int width : grid.widths) {
    if (width < 1 || width > kMaxWidth)
      throw InputError(fmt::format("{}: width {} is not in [1, {}]", origin, width, kMaxWidth));
  }
  if (grid.seeds < 1) throw InputError(fmt::format("{}: seeds {} must be at least 1", origin, grid.seeds));
  const long long cells = static_cast<long long>(grid.archs.size()) *
                          static_cast<long long>(grid.depths.size()) *
                          static_cast<long long>(grid.widths.size()) * grid.seeds;
  if (grid.seeds > kMaxSweepCells || cells > kMaxSweepCells) {
    throw InputError(
        fmt::format("{}: {} placement(s) x {} depth(s) x {} width(s) x {} seed(s) is {} cells, "
                    "more than the {} one sweep holds; split it into several sweeps",
                    origin, grid.archs.size(), grid.depths.size(), grid.widths.size(), grid.seeds, cells,
                    kMaxSweepCells));
  }
  refuse_repeats(grid.archs, "archs", origin);
  refuse_repeats(grid.depths, "depths", origin);
  refuse_repeats(grid.widths, "widths", origin);
}

std::vector<SweepCell> sweep_cells(const SweepGrid& grid) {
  std::vector<SweepCell> cells;
  for (const auto& arch : grid.archs) {
    for (const int depth : grid.depths) {
      for (const int width : grid.widths) {
        for (int seed = 0; seed < grid.seeds; ++seed)
          cells.push_back({arch, depth, width, static_cast<std::uint64_t>(seed)});
      }
    }
  }
  return cells;
}

std::vector<SweepCell> shard_cells(const std::vector<SweepCell>& cells, int index, int count) {
  std::vector<SweepCell> mine;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(count)) == index) mine.push_back(cells[i]);
  }
  return mine;
}

std::string cell_file_name(const SweepCell& cell) {
  return fmt::format("{}_B{}_d{}_s{}.json", cell.arch, cell.depth, cell.width, cell.seed);
}

std::pair<int, int> parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  int index = -1, count = 0;
  if (slash == std::string::npos || !parse_int(std::string_view(text).substr(0, slash), index) ||
      !parse_int(std::string_view(text).substr(slash + 1), count) || count < 1 || index < 0 ||
      index >= count) {
    throw InputError(
        fmt::format("--shard {:?} is not i/n with 0 <= i < n (shards are 0-based: 0/3, 1/3, 2/3)", text));
  }
  return {index, count};
}

std::vector<int> parse_int_list(const std::string& text, const std::string& option) {
  std::vector<int> values;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto end = std::min(text.find(',', start), text.size());
    int value = 0;
    const std::string_view item = std::string_view(text).substr(start, end - start);
    if (item.empty()) {
      throw InputError(
          fmt::format("{} {:?} has an empty item between ','s; remove the extra ','", option, text));
    }
    // Read as every numeric option is (decimal.hpp): "010" is ten, 0x10 and 1e3 are refused.
    if (const DecimalReading reading = read_decimal(item, NumberKind::whole); !reading.problem.empty()) {
      throw InputError(fmt::format("{} {:?} {}; give a list such as 8,16,32", option, item, reading.problem));
    }
    if (!parse_int(item, value) || value < 1) {
      throw InputError(fmt::format("{} {:?}: {:?} is not a positive integer; give a list such as 8,16,32",
                                   option, text, item));
    }
    if (std::find(values.begin(), values.end(), value) != values.end()) {
      throw InputError(fmt::format("{} {:?} lists {} twice", option, text, value));
    }
    values.push_back(value);
    start = end + 1;
  }
  return values;
}

BootstrapFit fit_across_depths(const std::vector<double>& x, const std::vector<std::vector<double>>& values,
                               int resamples, std::uint64_t bootstrap_seed) {
  const std::size_t seeds = values.empty() ? 0 : values.front().size();
  std::vector<std::size_t> all(seeds);
  for (std::size_t s = 0; s < seeds; ++s) all[s] = s;
  const LineFit point = fit_line(x, means_over(values, all));
  BootstrapFit fit{point.slope, kNaN, kNaN, point.points};
  if (seeds < 2 || !std::isfinite(point.slope)) return fit;
  std::vector<double> slopes;
  std::vector<std::size_t> picks(seeds);
  for (int r = 0; r < resamples; ++r) {
    for (std::size_t s = 0; s < seeds; ++s) {
      // Counter-based draw (SplitMix64 of (seed, resample, slot)); the modulo bias is < 2^-50.
      const std::uint64_t draw =
          mix64(stream_key(bootstrap_seed, RandomUse::input, static_cast<std::uint64_t>(r), s));
      picks[s] = static_cast<std::size_t>(draw % seeds);
    }
    const double slope = fit_line(x, means_over(values, picks)).slope;
    if (std::isfinite(slope)) slopes.push_back(slope);
  }
  std::sort(slopes.begin(), slopes.end());
  fit.ci95_low = percentile(slopes, 0.025);
  fit.ci95_high = percentile(slopes, 0.975);
  return fit;
}

namespace {
using CellIndex = std::map<std::tuple<std::string, int, int, std::uint64_t>, const CellFigures*>;

// --update (issue 18): the exponent p of output_update_rel ~ S^p per learning rate, fitted like the
// growth exponent (log-log, per-depth mean of the log over seeds, seeds bootstrapped). DeepNet's
// claim (arXiv 2203.00555, Sec. 4) is that Post-LN's model update grows with depth and DeepNorm's
// stays bounded (p near 0).
void fit_update_exponents(const SweepGrid& grid, const CellIndex& by_cell, const std::string& arch, int width,
                          const std::vector<double>& log_sublayers, SweepFit& fit) {
  const CellFigures& first = *by_cell.at({arch, grid.depths.front(), width, 0});
  fit.learning_rates = first.learning_rates;
  for (std::size_t i = 0; i < first.learning_rates.size(); ++i) {
    std::vector<std::vector<double>> logs;
    for (const int depth : grid.depths) {
      std::vector<double> seeds;
      for (int seed = 0; seed < grid.seeds; ++seed) {
        const CellFigures& c = *by_cell.at({arch, depth, width, static_cast<std::uint64_t>(seed)});
        const double value = i < c.output_update_rel.size() ? c.output_update_rel[i] : kNaN;
        seeds.push_back(value > 0 ? std::log(value) : kNaN);
      }
      logs.push_back(std::move(seeds));
    }
    fit.update_exponents.push_back(fit_across_depths(log_sublayers, logs));
  }
}
}  // namespace

std::vector<SweepFit> fit_sweep(const SweepGrid& grid, const std::vector<CellFigures>& cells) {
  CellIndex by_cell;
  for (const auto& c : cells) by_cell[{c.cell.arch, c.cell.depth, c.cell.width, c.cell.seed}] = &c;
  std::vector<SweepFit> fits;
  for (const auto& arch : grid.archs) {
    for (const int width : grid.widths) {
      SweepFit fit{arch, width, {}, {}, {}, {}, {}, {}, {}, {}, {}};
      std::vector<double> log_sublayers, sublayers;
      std::vector<std::vector<double>> log_rms, grad_ratio;
      for (const int depth : grid.depths) {
        std::vector<double> log_rms_seeds, ratio_seeds;
        int s_count = 0;
        for (int seed = 0; seed < grid.seeds; ++seed) {
          const auto found = by_cell.find({arch, depth, width, static_cast<std::uint64_t>(seed)});
          if (found == by_cell.end()) {
            throw std::logic_error(
                fmt::format("fit_sweep: cell {} missing",
                            cell_file_name({arch, depth, width, static_cast<std::uint64_t>(seed)})));
          }
          const CellFigures& c = *found->second;
          s_count = c.sublayers;
          log_rms_seeds.push_back(c.rms_final > 0 ? std::log(c.rms_final) : kNaN);
          ratio_seeds.push_back(c.log10_grad_ratio);
        }
        fit.depths.push_back(depth);
        fit.sublayers.push_back(s_count);
        log_sublayers.push_back(std::log(static_cast<double>(s_count)));
        sublayers.push_back(static_cast<double>(s_count));
        const auto all = means_over({log_rms_seeds, ratio_seeds}, [&] {
          std::vector<std::size_t> picks;
          for (int s = 0; s < grid.seeds; ++s) picks.push_back(static_cast<std::size_t>(s));
          return picks;
        }());
        fit.mean_rms_final.push_back(std::exp(all[0]));
        fit.mean_log10_grad_ratio.push_back(all[1]);
        log_rms.push_back(std::move(log_rms_seeds));
        grad_ratio.push_back(std::move(ratio_seeds));
      }
      fit_update_exponents(grid, by_cell, arch, width, log_sublayers, fit);
      fit.growth_exponent = fit_across_depths(log_sublayers, log_rms);
      fit.grad_ratio_slope = fit_across_depths(sublayers, grad_ratio);
      fit.growth_class = std::string(growth_class(fit.growth_exponent.slope));
      fits.push_back(std::move(fit));
    }
  }
  return fits;
}

}  // namespace gradflow
