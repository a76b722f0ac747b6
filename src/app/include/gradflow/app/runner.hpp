// The library runner: many independent analyses side by side on an explicit number of threads,
// their progress aggregated into one callback, each result handed over as its run ends; and the
// plans of analyze (placements x seeds) and of a sweep (its cells, with the resume check). The
// CLI parses, calls these and reports.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gradflow/analysis.hpp"
#include "gradflow/sweep.hpp"

namespace gradflow {

// One analyze_seed call: a placement at a configuration and seed (pointers into the caller's data).
struct RunRequest {
  const ModelConfig* config = nullptr;
  const Architecture* arch = nullptr;
  const Constants* constants = nullptr;
  std::uint64_t seed = 0;
};

struct RunnerOptions {
  int runs_at_once = 1;  // runs side by side
  // Threads in all: each of the runs at once gets threads / runs_at_once of them (at least one),
  // over which its ops' pieces run (work_pool.hpp).
  int threads = 1;
  // (work done, total work) over all runs, in analysis_work_units; serialised, from any thread.
  ProgressCallback progress;
};

// Called once per run as it ends, from the thread that ran it (not serialised): the run's index
// in the requests, its result and its wall time in seconds.
using RunFinished = std::function<void(std::size_t run, SeedResult&& result, double seconds)>;

// Runs every request. Runs are independent and deterministic, so neither their order nor the
// thread counts change a number. The first exception of a run (or of `finished`) is rethrown once
// every run has ended. Changes no global OpenMP state.
void run_all(const std::vector<RunRequest>& runs, const RunnerOptions& options, const RunFinished& finished);

// The threads each of `runs_at_once` runs side by side gets out of `threads`: an even share, at
// least one.
int threads_per_run(int threads, int runs_at_once);

// ---- analyze: every (placement, seed) run of one configuration
// One ArchResult per placement, its configuration and constants resolved and one seed slot per seed.
std::vector<ArchResult> plan_analysis(const ModelConfig& model, const std::vector<const Architecture*>& archs,
                                      const std::vector<std::uint64_t>& seeds);
// Fills every seed slot of `results` (from plan_analysis).
void run_analysis(std::vector<ArchResult>& results, const RunnerOptions& options);

// ---- sweep: one run per cell, each written to its own file, resumable
struct CellPlan {
  SweepCell cell;
  ArchResult run;              // the cell's configuration; its one seed slot is filled when it runs
  std::filesystem::path path;  // its cell file
  bool exists = false;         // a file is there already
  std::string stale_reason;    // why that file cannot be reused; "" when it is complete
  bool complete() const { return exists && stale_reason.empty(); }
};
// The cells' runs and whether each one's file (in `cells_directory`) is already a complete result
// for exactly this configuration, so that a resumed sweep computes only the rest.
std::vector<CellPlan> plan_sweep_cells(const ModelConfig& model, const std::vector<SweepCell>& cells,
                                       const std::filesystem::path& cells_directory);

}  // namespace gradflow
