// The library runner (runner.hpp): the parallel loop over independent runs, progress aggregation,
// and the plans of analyze and sweep, with the resume check of a sweep's cell files.
#include "gradflow/app/runner.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <mutex>
#include <sstream>

#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

namespace {
// One run: analyze_seed, timed, handed to `finished`.
void run_one(const RunRequest& request, std::size_t index, const ExecutionOptions& execution,
             const ProgressCallback& progress, const RunFinished& finished) {
  const auto start = std::chrono::steady_clock::now();
  SeedResult result =
      analyze_seed(*request.config, *request.arch, *request.constants, request.seed, execution, progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  finished(index, std::move(result), seconds);
}
}  // namespace

int threads_per_run(int threads, int runs_at_once) {
  return std::max(1, threads / std::max(1, runs_at_once));
}

void run_all(const std::vector<RunRequest>& runs, const RunnerOptions& options, const RunFinished& finished) {
  long long total_work = 0;
  for (const RunRequest& run : runs) total_work += analysis_work_units(*run.config);
  std::mutex mutex;
  std::vector<long long> run_done(runs.size(), 0);
  std::exception_ptr failure;  // the first run's exception, rethrown once every run is done
  const auto progress_of = [&](std::size_t j) -> ProgressCallback {
    return [&, j](long long done, long long) {
      std::lock_guard lock(mutex);
      run_done[j] = done;
      long long sum = 0;
      for (const long long d : run_done) sum += d;
      if (options.progress) options.progress(sum, total_work);
    };
  };
  const int at_once = std::max(1, std::min(options.runs_at_once, static_cast<int>(runs.size())));
  // The threads are shared out between the runs side by side; each run splits its ops' pieces over
  // its share (same numbers for any share). The thread counts go to the engine and to this loop's
  // clause, never to OpenMP's global state.
  const ExecutionOptions execution{threads_per_run(options.threads, at_once)};
  // An exception must not leave an OpenMP region (that is std::terminate): each is caught and the
  // first one rethrown after the loop.
#pragma omp parallel for schedule(dynamic, 1) num_threads(at_once) if (at_once > 1)
  for (std::size_t j = 0; j < runs.size(); ++j) {
    try {
      run_one(runs[j], j, execution, progress_of(j), finished);
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

std::vector<ArchResult> plan_analysis(const ModelConfig& model, const std::vector<const Architecture*>& archs,
                                      const std::vector<std::uint64_t>& seeds) {
  std::vector<ArchResult> results;
  for (const Architecture* arch : archs) {
    ArchResult result;
    result.arch = arch;
    result.config = model;
    result.config.arch = std::string(arch->id);
    result.constants = resolve_constants(*arch, result.config);
    result.seeds.resize(seeds.size());
    for (std::size_t s = 0; s < seeds.size(); ++s) result.seeds[s].seed = seeds[s];
    results.push_back(std::move(result));
  }
  return results;
}

void run_analysis(std::vector<ArchResult>& results, const RunnerOptions& options) {
  std::vector<RunRequest> runs;
  std::vector<SeedResult*> slots;
  for (ArchResult& result : results) {
    for (SeedResult& slot : result.seeds) {
      runs.push_back({&result.config, result.arch, &result.constants, slot.seed});
      slots.push_back(&slot);
    }
  }
  run_all(runs, options, [&](std::size_t run, SeedResult&& seed, double) { *slots[run] = std::move(seed); });
}

namespace {
// What a finished cell file must contain: a result for this cell's exact configuration.
ArchResult cell_run(const ModelConfig& model, const SweepCell& cell) {
  const Architecture& arch = find_architecture(cell.arch);
  ArchResult result;
  result.arch = &arch;
  result.config = model;
  result.config.arch = std::string(arch.id);
  result.config.blocks = cell.depth;
  result.config.width = cell.width;
  result.config.seed = cell.seed;
  result.constants = resolve_constants(arch, result.config);
  result.seeds.resize(1);
  result.seeds[0].seed = cell.seed;
  return result;
}

// Why an existing cell file cannot be reused, empty when it can. It is gradflow's own document:
// the same schema, the same configuration, every state, and every field the summary reads.
std::string stale_reason(const std::filesystem::path& path, const ArchResult& expected) {
  using json = nlohmann::ordered_json;
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  if (!(file && text << file.rdbuf())) return "unreadable";
  try {
    const json doc = json::parse(text.str());
    if (doc.at("schema_version") != kSchemaVersion) return "another schema version";
    const json& run = doc.at("runs").at(0);
    const std::string difference = first_difference(run.at("config"), config_to_json(expected), "config.");
    if (!difference.empty()) return "different configuration (" + difference + ")";
    if (run.at("seeds").at(0).at("states").at("rms").size() !=
        static_cast<std::size_t>(expected.config.sublayers() + 1)) {
      return "incomplete";
    }
    cell_figures(doc, path.string());
  } catch (const json::exception& error) {
    return fmt::format("not a cell document ({})", error.what());
  } catch (const InputError& error) {
    return error.what();
  }
  return {};
}
}  // namespace

std::vector<CellPlan> plan_sweep_cells(const ModelConfig& model, const std::vector<SweepCell>& cells,
                                       const std::filesystem::path& cells_directory) {
  std::vector<CellPlan> plans;
  for (const SweepCell& cell : cells) {
    CellPlan plan{cell, cell_run(model, cell), cells_directory / cell_file_name(cell), false, ""};
    std::error_code error;
    plan.exists = std::filesystem::exists(plan.path, error);
    if (error && error != std::errc::no_such_file_or_directory)
      throw InputError(fmt::format("{}: cannot be read ({})", plan.path.string(), error.message()));
    if (plan.exists) plan.stale_reason = stale_reason(plan.path, plan.run);
    plans.push_back(std::move(plan));
  }
  return plans;
}

}  // namespace gradflow
