// Depth sweeps: the grid of (arch, depth, width, seed) cells in one global order, sharding, and
// the cross-depth fits of the summary. Plain data in, plain data out; the CLI does the files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gradflow {

struct SweepCell {
  std::string arch;
  int depth = 0;  // blocks B
  int width = 0;
  std::uint64_t seed = 0;
};

struct SweepGrid {
  std::vector<std::string> archs;  // in the order given
  std::vector<int> depths, widths;
  int seeds = 1;  // seeds 0..seeds-1
};

// The most cells one sweep may have: each cell is a file and a row of the summary, and the
// grid is held in memory (a million cells is about 100 MB of summary).
inline constexpr long long kMaxSweepCells = 1 << 20;
// Throws InputError (naming `origin`, e.g. "--seeds" or a sweep.json path) when the grid is
// empty, has a non-positive or too large depth, width or seed count, more than kMaxSweepCells
// cells (counted in 64 bits, before any cell is made), or lists a placement, depth or width twice.
void validate_grid(const SweepGrid& grid, const std::string& origin);

// Every cell in the global order: arch (as given), then depth, width, seed (nested loops).
std::vector<SweepCell> sweep_cells(const SweepGrid& grid);
// Shard `index` of `count` (0-based) takes the cells whose global position % count == index.
std::vector<SweepCell> shard_cells(const std::vector<SweepCell>& cells, int index, int count);
// "<arch>_B<depth>_d<width>_s<seed>.json"
std::string cell_file_name(const SweepCell& cell);
// Parses "i/n" with 0 <= i < n; throws InputError naming the text otherwise.
std::pair<int, int> parse_shard(const std::string& text);
// Parses a comma-separated list of positive integers (e.g. "8,16,32"); `option` names the flag in errors.
std::vector<int> parse_int_list(const std::string& text, const std::string& option);

// The figures of one finished cell that the cross-depth fits use.
struct CellFigures {
  SweepCell cell;
  int sublayers = 0;       // S
  double rms_final = 0.0;  // rms(x_S)
  double log10_grad_ratio = 0.0;
  // --update: output_update_rel per learning rate (summary.update), and those learning rates
  std::vector<double> learning_rates, output_update_rel;
};

// A slope with its percentile bootstrap interval over seeds.
struct BootstrapFit {
  double slope = 0.0, ci95_low = 0.0, ci95_high = 0.0;
  int depths = 0;  // depths with a finite per-depth mean
};

// Fixed so that the intervals are reproducible: every run of the same cells gives the same bytes.
inline constexpr int kBootstrapResamples = 1000;
inline constexpr std::uint64_t kBootstrapSeed = 0x6772616466ULL;  // "gradf"

// Least-squares slope of y against x across depths, fitted on the per-depth mean over seeds.
// values[d][s] is seed s at depth d (every depth has the same seed count). The 95% interval
// resamples seed indices with replacement (the same draw for every depth, since a seed is one
// model family across depths), refits, and takes the 2.5% and 97.5% percentiles of the slopes.
BootstrapFit fit_across_depths(const std::vector<double>& x, const std::vector<std::vector<double>>& values,
                               int resamples = kBootstrapResamples,
                               std::uint64_t bootstrap_seed = kBootstrapSeed);

// Cross-depth summary of one (arch, width): exponent of rms(x_S) against S (log-log, per-depth
// mean of log rms over seeds, i.e. the geometric mean), slope of log10_grad_ratio against S
// (decades per sublayer), and growth_class() of the exponent.
struct SweepFit {
  std::string arch;
  int width = 0;
  std::vector<int> depths, sublayers;
  std::vector<double> mean_rms_final, mean_log10_grad_ratio;  // per depth; geometric mean for rms
  BootstrapFit growth_exponent, grad_ratio_slope;
  std::string growth_class;
  // --update: per learning rate, the exponent of output_update_rel against S (log-log, per-depth
  // mean of its log over seeds), as growth_exponent
  std::vector<double> learning_rates;
  std::vector<BootstrapFit> update_exponents;
};
// One fit per (arch, width) of the grid, in grid order. `cells` must hold every cell of the grid.
std::vector<SweepFit> fit_sweep(const SweepGrid& grid, const std::vector<CellFigures>& cells);

}  // namespace gradflow
