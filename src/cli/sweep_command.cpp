// `gradflow sweep`: the (arch, depth, width, seed) grid, one atomic JSON file per cell, resumable
// and shardable (i/n, for job arrays); the unsharded run also writes DIR/summary.json.
#include <fmt/format.h>
#include <omp.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <mutex>

#include "commands.hpp"
#include "gradflow/analysis.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/report.hpp"
#include "gradflow/sweep.hpp"

namespace gradflow::cli {

namespace {
using json = nlohmann::ordered_json;

struct SweepOptions {
  ModelOptions model;
  std::string arch, depths, widths;
  int seeds = 1;
  std::string directory, shard = "0/1";
  int jobs = 1;
  bool verbose = false, quiet = false;
};

// What a finished cell file must contain: a result for this cell's exact configuration.
ArchResult cell_run(const ModelConfig& model, const Architecture& arch, const SweepCell& cell) {
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

// Why an existing cell file cannot be reused, empty when it can.
std::string stale_reason(const std::string& path, const ArchResult& expected) {
  const auto text = read_text_file(path);
  if (!text) return "unreadable";
  json doc;
  try {
    doc = json::parse(*text);
    if (doc.at("schema_version") != kSchemaVersion) return "another schema version";
    const json& run = doc.at("runs").at(0);
    const std::string difference = first_difference(run.at("config"), config_to_json(expected), "config.");
    if (!difference.empty()) return "different configuration (" + difference + ")";
    if (run.at("seeds").at(0).at("states").at("rms").size() !=
        static_cast<std::size_t>(expected.config.sublayers() + 1)) {
      return "incomplete";
    }
    cell_figures(doc, path);  // every field the summary reads
  } catch (const json::exception& error) {
    return fmt::format("not a cell document ({})", error.what());
  } catch (const InputError& error) {
    return error.what();
  }
  return {};
}

// A sweep killed by SIGKILL (which no handler sees) leaves its cells' temporary files,
// NAME.tmp.PID.HEX; those of processes no longer running are removed when the sweep resumes.
void remove_stale_temporaries(const std::filesystem::path& cells_directory) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(cells_directory, error)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.find(".json.tmp.");
    if (at == std::string::npos) continue;
    const long pid = std::strtol(name.c_str() + at + 10, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::filesystem::remove(entry.path(), error);
    }
  }
}

void print_fits(const json& summary) {
  fmt::print(stderr, "{:<12} {:>6} {:>9} {:>21} {:<8} {:>14} {:>27}\n", "arch", "width", "exponent", "95% CI",
             "class", "grad slope", "95% CI");
  const auto num = [](const json& v) { return v.is_number() ? v.get<double>() : std::nan(""); };
  for (const json& fit : summary.at("fits")) {
    const json& p = fit.at("growth_exponent");
    const json& g = fit.at("log10_grad_ratio_slope");
    fmt::print(stderr, "{:<12} {:>6} {:>9.4f} [{:>8.4f}, {:>8.4f}] {:<8} {:>14.3e} [{:>11.3e}, {:>11.3e}]\n",
               fit.at("arch").get<std::string>(), fit.at("width").get<int>(), num(p.at("value")),
               num(p.at("ci95_low")), num(p.at("ci95_high")), fit.at("growth_class").get<std::string>(),
               num(g.at("value")), num(g.at("ci95_low")), num(g.at("ci95_high")));
  }
}

int run_sweep(const SweepOptions& options) {
  if (options.directory.empty())
    throw InputError("-o '' is an empty directory name; give the sweep's directory, e.g. -o sweep-out");
  const auto [shard_index, shard_count] = parse_shard(options.shard);
  SweepGrid grid;
  grid.depths = parse_int_list(options.depths, "--depth");
  grid.widths = options.widths.empty() ? std::vector<int>{ModelConfig{}.width}
                                       : parse_int_list(options.widths, "--width");
  grid.seeds = options.seeds;
  const auto archs = parse_architecture_list(options.arch);
  for (const Architecture* arch : archs) grid.archs.emplace_back(arch->id);
  validate_grid(grid, "--arch, --depth, --width, --seeds");
  ModelConfig model = resolve_model(options.model);
  for (const int width : grid.widths) {  // every cell's configuration must be valid before any work
    for (const int depth : grid.depths) {
      ModelConfig cell = model;
      cell.width = width, cell.blocks = depth;
      validate(cell);
    }
  }
  check_options_apply(model, archs, options.arch);
  ModelConfig largest = model;
  largest.blocks = *std::max_element(grid.depths.begin(), grid.depths.end());
  largest.width = *std::max_element(grid.widths.begin(), grid.widths.end());
  check_memory(largest, archs, options.jobs, options.jobs == 1 ? 2 : options.jobs, options.jobs);

  const std::filesystem::path directory(options.directory), cells_directory = directory / "cells";
  std::error_code error;
  std::filesystem::create_directories(cells_directory, error);
  if (error)
    throw InputError(fmt::format("-o {}: cannot create {} ({})", options.directory, cells_directory.string(),
                                 error.message()));

  // The manifest is the same for every shard, so shards may share DIR; a different model is refused.
  const json manifest = json::parse(sweep_manifest(grid, model).dump());
  const std::string manifest_path = (directory / "sweep.json").string();
  if (path_exists(manifest_path)) {
    const json existing = read_json_file(manifest_path);
    grid_from_manifest(existing, manifest_path);  // a damaged manifest is named, not silently replaced
    const std::string difference = first_difference(existing.at("model"), manifest.at("model"), "");
    if (!difference.empty()) {
      throw InputError(fmt::format(
          "{} holds a sweep with another model configuration ({} in this run: {}); use another -o DIR",
          manifest_path, difference.substr(0, difference.find(':')), difference));
    }
  }
  write_file_atomically(manifest_path, manifest.dump(1) + "\n");

  remove_stale_temporaries(cells_directory);
  const std::vector<SweepCell> all_cells = sweep_cells(grid);
  const std::vector<SweepCell> mine = shard_cells(all_cells, shard_index, shard_count);
  struct Pending {
    SweepCell cell;
    ArchResult run;
    std::string path;
  };
  std::vector<Pending> pending;
  int skipped = 0;
  for (const SweepCell& cell : mine) {
    Pending job{cell, cell_run(model, find_architecture(cell.arch), cell),
                (cells_directory / cell_file_name(cell)).string()};
    if (path_exists(job.path)) {
      const std::string reason = stale_reason(job.path, job.run);
      if (reason.empty()) {
        ++skipped;
        if (options.verbose)
          fmt::print(stderr, "gradflow sweep: skipped {} (already complete)\n", cell_file_name(cell));
        continue;
      }
      fmt::print(stderr, "gradflow sweep: recomputing {}: {}\n", cell_file_name(cell), reason);
    }
    pending.push_back(std::move(job));
  }
  if (!options.quiet) {
    fmt::print(
        stderr,
        "gradflow sweep: shard {}/{}: {} of {} cells; {} already complete, computing {} with {} job(s)\n",
        shard_index, shard_count, mine.size(), all_cells.size(), skipped, pending.size(), options.jobs);
  }

  ProgressBar progress(!options.quiet && !options.verbose && stderr_is_terminal(), "gradflow sweep");
  std::mutex mutex;
  std::exception_ptr failure;
  long long done = 0;
  omp_set_max_active_levels(1);
  // Cells are independent and each is deterministic, so --jobs changes no byte of any file. Each
  // cell runs single-threaded; with one job the engine splits each op over two cores (same numbers).
#pragma omp parallel for schedule(dynamic, 1) num_threads(options.jobs) if (options.jobs > 1)
  for (std::size_t j = 0; j < pending.size(); ++j) {
    try {
      Pending& job = pending[j];
      const auto start = std::chrono::steady_clock::now();
      job.run.seeds[0] = analyze_seed(job.run.config, *job.run.arch, job.run.constants, job.cell.seed);
      write_file_atomically(job.path, cell_document(job.run).dump() + "\n");
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::lock_guard lock(mutex);
      ++done;
      if (options.verbose)
        fmt::print(stderr, "gradflow sweep: computed {} in {:.2f} s\n", cell_file_name(job.cell), seconds);
      if (job.run.seeds[0].diverged) {
        fmt::print(stderr, "gradflow: warning: {} diverged at sublayer {}: {}\n", cell_file_name(job.cell),
                   job.run.seeds[0].diverged->sublayer, job.run.seeds[0].diverged->reason);
      }
      progress.update(done, static_cast<long long>(pending.size()));
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);

  if (shard_count > 1) {
    if (!options.quiet) {
      fmt::print(
          stderr,
          "gradflow sweep: shard {}/{} done; once every shard is, run 'gradflow merge {} -o sweep.json'\n",
          shard_index, shard_count, options.directory);
    }
    return 0;
  }
  std::vector<json> cells;
  for (const SweepCell& cell : all_cells) {
    const std::string path = (cells_directory / cell_file_name(cell)).string();
    cells.push_back(read_json_file(path));
    cell_figures(cells.back(), path);  // names the file if another process changed it meanwhile
  }
  const json document = sweep_document(manifest, cells);
  write_file_atomically((directory / "summary.json").string(), document.dump() + "\n");
  if (!options.quiet) print_fits(document.at("summary"));
  return 0;
}
}  // namespace

Command setup_sweep(CLI::App& app) {
  auto options = std::make_shared<SweepOptions>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "Run an (arch, depth, width, seed) grid: one file per cell, resumable, shardable; fits across depths");
  sub->option_defaults()->always_capture_default();
  sub->add_option("--arch", options->arch, "Placement ids, comma-separated, or 'all' (see 'gradflow archs')")
      ->required();
  sub->add_option("--depth", options->depths, "Depths in blocks B, comma-separated (e.g. 8,16,32,64)")
      ->required();
  sub->add_option("--width", options->widths, "Model widths d, comma-separated")->default_str("256");
  add_model_options(sub, options->model);
  sub->add_option("--seeds", options->seeds, "Seeds 0..N-1 per (arch, depth, width)")
      ->check(CLI::PositiveNumber);
  sub->add_option("-o,--output", options->directory,
                  "Directory: cells/<arch>_B<depth>_d<width>_s<seed>.json, sweep.json (grid), summary.json "
                  "(unsharded runs)")
      ->required();
  sub->add_option("--shard", options->shard,
                  "Run shard i of n, i 0-based (0/3, 1/3, 2/3): the cells whose position in the global order "
                  "(arch, depth, width, seed) is i mod n; no summary, use 'gradflow merge'");
  sub->add_option("--jobs", options->jobs,
                  "Cells run in parallel (each single-threaded); files are identical for every J")
      ->check(CLI::PositiveNumber);
  sub->add_flag("-v,--verbose", options->verbose,
                "One line per cell: skipped (already complete) or computed, with its time");
  sub->add_flag("-q,--quiet", options->quiet, "No progress bar, no summary table");
  sub->footer(
      "Finished cells (file present, same configuration) are skipped, so an interrupted sweep resumes where "
      "it stopped.");
  return {sub, [options] { return run_sweep(*options); }};
}

}  // namespace gradflow::cli
