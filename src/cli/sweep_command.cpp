// `gradflow sweep`: the (arch, depth, width, seed) grid, one atomic JSON file per cell, resumable
// and shardable (i/n, for job arrays); the unsharded run also writes DIR/summary.json.
#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "commands.hpp"
#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/app/runner.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/sweep.hpp"

namespace gradflow::cli {

namespace {
using json = nlohmann::ordered_json;

struct SweepOptions {
  ModelOptions model;
  std::string arch, depths, widths;
  std::string config;  // --config PATH|NAME: "" when not given
  int seeds = 1;
  std::string directory, shard = "0/1";
  const CLI::Option* shard_flag = nullptr;  // given: a shard, which shares DIR's lock with the others
  int jobs = 1;
  int threads = 0;  // 0: every core
  bool verbose = false, quiet = false, plan = false;
  const CLI::App* app = nullptr;  // to tell the flags given from the defaults a config.json replaces
};

// --threads, or OpenMP's thread count: every core the process may use, or OMP_NUM_THREADS (which
// scripts/sweep-slurm sets to the task's --cpus-per-task).
int sweep_threads(const SweepOptions& options) {
  return options.threads > 0 ? options.threads : std::max(1, omp_get_max_threads());
}

// A sweep killed by SIGKILL (which no handler sees) leaves its cells' temporary files,
// NAME.tmp.PID.HEX.HOST; those of this machine's processes no longer running are removed when the
// sweep resumes. Another machine's (a job array's task elsewhere, on a shared file system) are left
// alone: its PID means nothing here.
void remove_stale_temporaries(const std::filesystem::path& cells_directory) {
  std::error_code error;
  const std::string host = host_tag();
  for (const auto& entry : std::filesystem::directory_iterator(cells_directory, error)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.find(".json.tmp.");
    if (at == std::string::npos) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + at + 10, &end, 10);
    const char* host_at = std::strchr(end, '.') ? std::strchr(std::strchr(end, '.') + 1, '.') : nullptr;
    const bool this_host = host_at == nullptr || host == host_at + 1;  // no host: an older gradflow's
    if (this_host && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
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

// The model every cell shares: the flags over --config's file by analyze's rules (config_option.cpp:
// a flag given overrides the file; without --arch, `arch_list` becomes the family's placement).
// --width is the grid's list here, so the model is resolved at its first width (else the file's,
// else the default); validate_cells checks every cell at its own.
ModelConfig shared_model(const SweepOptions& options, std::optional<ConfigOption>& config_file,
                         std::string& arch_list) {
  ModelOptions flags = options.model;
  if (!options.widths.empty()) flags.model.width = parse_int_list(options.widths, "--width").front();
  return resolve_model(flags, [&](ModelConfig& model) {
    if (config_file) apply_config_option(*config_file, *options.app, model, arch_list);
  });
}

// The grid the flags describe (refused, naming the flags, when empty or too large); without
// --width, the shared model's width (256, or the config.json's hidden_size).
SweepGrid checked_grid(const SweepOptions& options, const std::string& arch_list, int model_width,
                       std::vector<const Architecture*>& archs) {
  SweepGrid grid;
  grid.depths = parse_int_list(options.depths, "--depth");
  grid.widths =
      options.widths.empty() ? std::vector<int>{model_width} : parse_int_list(options.widths, "--width");
  grid.seeds = options.seeds;
  archs = parse_architecture_list(arch_list);
  for (const Architecture* arch : archs) grid.archs.emplace_back(arch->id);
  validate_grid(grid, "--arch, --depth, --width, --seeds");
  return grid;
}

// Every cell's configuration must be valid before any work.
void validate_cells(const SweepGrid& grid, const ModelConfig& model) {
  for (const int width : grid.widths) {
    for (const int depth : grid.depths) {
      ModelConfig cell = model;
      cell.width = width, cell.blocks = depth;
      validate(cell);
    }
  }
}

// The config.json a manifest records (sweep --config), "" when none.
std::string config_file_path(const json& manifest) {
  const auto file = manifest.find("config_file");
  if (file == manifest.end() || !file->is_object() || !file->contains("path") ||
      !file->at("path").is_string())
    return {};
  return file->at("path").get<std::string>();
}

// The manifest of this sweep, after checking that DIR/sweep.json, if there, describes the same
// model and the same grid: shards may share DIR; another model or grid in it is refused. A
// directory holds one grid because its summary.json and every merge of it follow its sweep.json:
// a second grid written over the first left a summary of one grid beside the manifest of another.
// The model's values (a config.json's included: they are in "model") decide the cells; the file
// itself must be the same too (by identity, or the path as given), or absent from both.
// Reads only.
json checked_manifest(const std::filesystem::path& directory, const SweepGrid& grid, const ModelConfig& model,
                      const json& config_file) {
  json manifest = json::parse(sweep_manifest(grid, model, config_file).dump());
  const std::string manifest_path = (directory / "sweep.json").string();
  if (path_exists(manifest_path)) {
    const json existing = read_json_file(manifest_path);
    grid_from_manifest(existing, manifest_path);  // a damaged manifest is named, not silently replaced
    const std::string difference = first_difference(existing.at("model"), manifest.at("model"), "");
    const std::string there = config_file_path(existing), here = config_file_path(manifest);
    if (!difference.empty()) {
      const std::string key = difference.substr(0, difference.find(':'));
      const auto recorded = [&key](const json& model) {
        return model.contains(key) ? model.at(key).dump() : std::string("absent");
      };
      throw InputError(fmt::format(
          "{} holds a sweep with another model configuration ({} {} there, {} in this run); {}use another -o "
          "DIR",
          manifest_path, key, recorded(existing.at("model")), recorded(manifest.at("model")),
          there.empty() && here.empty() ? "" : "give the flags and --config that sweep was given, or "));
    }
    if (there != here && (there.empty() || here.empty() || !same_file(there, here))) {
      throw InputError(fmt::format(
          "{} holds a sweep of {} but this run has {}; give the --config that sweep was given, or use "
          "another -o DIR",
          manifest_path, there.empty() ? "no --config" : "--config " + there,
          here.empty() ? "no --config" : "--config " + here));
    }
    const std::string grid_difference = first_difference(existing.at("grid"), manifest.at("grid"), "");
    if (!grid_difference.empty()) {
      const std::string key = grid_difference.substr(0, grid_difference.find(':'));
      throw InputError(fmt::format(
          "{} holds a sweep over another grid ({} {} there, {} in this run); a sweep directory holds one "
          "grid: use a new -o DIR (copy {} into its cells/ to reuse the cells both grids share)",
          manifest_path, key, existing.at("grid").value(key, json()).dump(),
          manifest.at("grid").value(key, json()).dump(), (directory / "cells" / "*.json").string()));
    }
  }
  return manifest;
}

// F_OFD_SETLK on `length` bytes from `start` (0: to the end); false with errno when refused.
bool set_lock(int fd, short type, off_t start, off_t length) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = start;
  lock.l_len = length;
  return ::fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

// Whether `fd` is still the file at `path` (a sweep that ended may have removed it meanwhile).
bool still_at_path(int fd, const std::string& path) {
  struct stat open_status {
  }, path_status{};
  return ::fstat(fd, &open_status) == 0 && ::stat(path.c_str(), &path_status) == 0 &&
         open_status.st_dev == path_status.st_dev && open_status.st_ino == path_status.st_ino;
}

// DIR/sweep.lock, held while a sweep writes DIR (docs/output.md, "The sweep directory"). Byte 0 is
// the run: exclusive for an unsharded sweep, shared by shards (any run given --shard i/n: a job
// array's tasks share DIR side by side, and a requeued task may start beside the one it replaces), so a
// second sweep into DIR is refused at once, never waited for. Byte 1 is the manifest, held exclusively only
// while sweep.json is checked and written, so that two shards of different grids cannot both find DIR empty.
// Open file description locks (F_OFD_SETLK): per open file like flock, byte ranges like fcntl, and real locks
// on NFS (where flock is emulated with them). The file is removed by the last sweep to leave.
class SweepLock {
 public:
  SweepLock(const std::filesystem::path& directory, bool shared)
      : path_((directory / "sweep.lock").string()) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd_ < 0)
        throw InputError(
            fmt::format("{}: cannot create the sweep's lock file ({})", path_, std::strerror(errno)));
      if (!set_lock(fd_, shared ? F_RDLCK : F_WRLCK, 0, 1)) {
        refused(directory, errno);
        return;
      }
      if (still_at_path(fd_, path_)) return;
      release();  // locked a file being removed by a sweep that just ended: lock the new one
    }
    throw InputError(fmt::format("{}: could not lock the sweep directory; retry", path_));
  }
  SweepLock(const SweepLock&) = delete;
  SweepLock& operator=(const SweepLock&) = delete;
  ~SweepLock() {
    // Removed only when no other sweep holds it: taking both bytes exclusively fails otherwise.
    if (fd_ >= 0 && set_lock(fd_, F_WRLCK, 0, 2)) ::unlink(path_.c_str());
    release();
  }

  // Holds the manifest's byte for `section`. Another shard holds it for milliseconds: retried for
  // up to 30 s (a slow shared file system), then refused rather than waited on forever. On an
  // exception the destructor's close releases it.
  json with_manifest(const std::function<json()>& section) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (fd_ >= 0 && !set_lock(fd_, F_WRLCK, 1, 1)) {
      const int error = errno;
      if ((error != EAGAIN && error != EACCES) || std::chrono::steady_clock::now() > deadline)
        throw InputError(fmt::format("{}: could not take the manifest's lock within 30 s ({}); retry", path_,
                                     std::strerror(error)));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    json manifest = section();
    if (fd_ >= 0) set_lock(fd_, F_UNLCK, 1, 1);
    return manifest;
  }

 private:
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Another sweep holds DIR: exit 2. A file system without locks: go on, and say so.
  void refused(const std::filesystem::path& directory, int error) {
    release();
    if (error == EAGAIN || error == EACCES) {
      throw InputError(fmt::format(
          "another sweep is writing {} (it holds {}); wait for it to end, or give this run another -o DIR "
          "(shards of one sweep, --shard i/n, may share DIR)",
          directory.string(), path_));
    }
    ::unlink(path_.c_str());
    fmt::print(stderr,
               "gradflow: warning: {}: the file system does not lock files ({}); nothing stops another "
               "sweep from writing {} at the same time\n",
               path_, std::strerror(error), directory.string());
  }

  std::string path_;
  int fd_ = -1;
};

// DIR/sweep.json, written (or found equal) before any cell, under the manifest's lock: the
// manifest is the same for every shard.
json write_manifest(const std::filesystem::path& directory, const SweepGrid& grid, const ModelConfig& model,
                    const json& config_file, SweepLock& lock) {
  return lock.with_manifest([&] {
    json manifest = checked_manifest(directory, grid, model, config_file);
    write_file_atomically((directory / "sweep.json").string(), manifest.dump(1) + "\n");
    return manifest;
  });
}

// An existing cell is read back by the resume's own reader (plan_sweep_cells), which neither
// bounds the document nor refuses a FIFO: both are checked here first. A directory in a cell's
// place is named by pending_cells.
void check_existing_cells(const std::vector<SweepCell>& cells, const std::filesystem::path& cells_directory) {
  for (const SweepCell& cell : cells) {
    const std::filesystem::path path = cells_directory / cell_file_name(cell);
    std::error_code error;
    const auto status = std::filesystem::status(path, error);
    if (error || !std::filesystem::exists(status) || std::filesystem::is_directory(status)) continue;
    check_json_file_bounds(path.string());
  }
}

// This shard's cells that still need computing; complete cell files are kept (a resumed sweep).
std::vector<CellPlan> pending_cells(const SweepOptions& options, const ModelConfig& model,
                                    const std::vector<SweepCell>& mine, const std::filesystem::path& cells) {
  std::vector<CellPlan> pending;
  check_existing_cells(mine, cells);
  for (CellPlan& plan : plan_sweep_cells(model, mine, cells)) {
    if (plan.complete()) {
      if (options.verbose)
        fmt::print(stderr, "gradflow sweep: skipped {} (already complete)\n", cell_file_name(plan.cell));
      continue;
    }
    std::error_code error;
    if (std::filesystem::is_directory(plan.path, error)) {
      throw InputError(
          fmt::format("{} is a directory where the sweep's cell file belongs; remove it (it is not "
                      "gradflow's) and rerun the same command",
                      plan.path.string()));
    }
    if (plan.exists)
      fmt::print(stderr, "gradflow sweep: recomputing {}: {}\n", cell_file_name(plan.cell),
                 plan.stale_reason);
    pending.push_back(std::move(plan));
  }
  return pending;
}

// Runs the pending cells (--jobs side by side), each written to its file as it ends.
void compute_cells(std::vector<CellPlan>& pending, const SweepOptions& options) {
  ProgressBar progress(!options.quiet && !options.verbose && stderr_is_terminal(), "gradflow sweep");
  std::vector<RunRequest> runs;
  for (const CellPlan& plan : pending)
    runs.push_back({&plan.run.config, plan.run.arch, &plan.run.constants, plan.cell.seed});
  std::mutex mutex;
  // Cells are independent and each is deterministic, so --jobs and --threads change no byte of any
  // file: each of the J cells at once splits its ops over threads / J threads (same numbers).
  const RunnerOptions runner{options.jobs, sweep_threads(options), [&](long long done, long long total) {
                               progress.update(done, total);
                               report_progress_to_hooks(done, total);
                             }};
  run_all(runs, runner, [&](std::size_t j, SeedResult&& seed, double seconds) {
    CellPlan& job = pending[j];
    job.run.seeds[0] = std::move(seed);
    write_file_atomically(job.path.string(), cell_document(job.run).dump() + "\n");
    std::lock_guard lock(mutex);
    if (options.verbose)
      fmt::print(stderr, "gradflow sweep: computed {} in {:.2f} s\n", cell_file_name(job.cell), seconds);
    if (job.run.seeds[0].diverged) {
      fmt::print(stderr, "gradflow: warning: {} diverged at sublayer {}: {}\n", cell_file_name(job.cell),
                 job.run.seeds[0].diverged->sublayer, job.run.seeds[0].diverged->reason);
    }
    job.run.seeds[0] = SeedResult{};  // written: its figures need not stay in memory
  });
}

// DIR/summary.json from every cell file, and the fits on stderr.
void write_summary(const SweepOptions& options, const json& manifest, const std::vector<SweepCell>& all_cells,
                   const std::filesystem::path& directory) {
  std::vector<json> cells;
  for (const SweepCell& cell : all_cells) {
    const std::string path = (directory / "cells" / cell_file_name(cell)).string();
    cells.push_back(read_json_file(path));
    cell_figures(cells.back(), path);  // names the file if another process changed it meanwhile
  }
  const json document = sweep_document(manifest, cells);
  write_file_atomically((directory / "summary.json").string(), document.dump() + "\n");
  if (!options.quiet) print_fits(document.at("summary"));
}

// --plan: every cell of the grid in the global order (--shard i/n takes positions i mod n), with
// the time one run takes on one core and the memory it needs (config.hpp's estimates), and whether
// its file in DIR is already complete. Written to stdout; nothing is created. scripts/sweep-slurm
// sizes its job array, time limit and memory request from it.
json plan_document(const SweepGrid& grid, const ModelConfig& model,
                   const std::vector<const Architecture*>& archs,
                   const std::filesystem::path& cells_directory) {
  const std::vector<SweepCell> cells = sweep_cells(grid);
  std::error_code error;
  const bool resumable = std::filesystem::is_directory(cells_directory, error);
  if (resumable) check_existing_cells(cells, cells_directory);
  json rows = json::array();
  double total_seconds = 0, largest_bytes = 0;
  std::size_t complete = 0;
  for (std::size_t position = 0; position < cells.size(); ++position) {
    const SweepCell& cell = cells[position];
    ModelConfig config = model;
    config.blocks = cell.depth, config.width = cell.width;
    const auto arch =
        std::find_if(archs.begin(), archs.end(), [&](const Architecture* a) { return a->id == cell.arch; });
    const int streams = static_cast<int>((*arch)->streams.size());
    const double seconds = estimated_run_seconds(config, 1);
    const double bytes = estimated_memory_bytes(config, streams, (*arch)->history_streams) +
                         estimated_result_bytes(config, streams);
    const bool done = resumable && plan_sweep_cells(model, {cell}, cells_directory).front().complete();
    total_seconds += seconds, largest_bytes = std::max(largest_bytes, bytes), complete += done ? 1 : 0;
    rows.push_back({{"position", position},
                    {"file", "cells/" + cell_file_name(cell)},
                    {"arch", cell.arch},
                    {"blocks", cell.depth},
                    {"width", cell.width},
                    {"seed", cell.seed},
                    {"estimated_seconds", seconds},
                    {"estimated_memory_bytes", bytes},
                    {"complete", done}});
  }
  return {
      {"cell_count", cells.size()},
      {"complete_count", complete},
      {"estimated_seconds", total_seconds},
      {"largest_memory_bytes", largest_bytes},
      {"estimate_note", "seconds of one run on one core and bytes at its peak; good to a factor of about 2"},
      {"cells", rows}};
}

constexpr int kMaxJobs = 1024;

int run_sweep(const SweepOptions& options) {
  if (options.directory.empty())
    throw InputError("-o '' is an empty directory name; give the sweep's directory, e.g. -o sweep-out");
  if (options.arch.empty() && options.config.empty()) {
    throw InputError(
        "--arch is required (or --config FILE, whose model_type names the placement); see 'gradflow sweep "
        "--help'");
  }
  const auto [shard_index, shard_count] = parse_shard(options.shard);
  std::optional<ConfigOption> config_file;
  if (!options.config.empty()) config_file = read_config_option(options.config, *options.app);
  std::string arch_list = options.arch;
  const ModelConfig model = shared_model(options, config_file, arch_list);
  std::vector<const Architecture*> archs;
  const SweepGrid grid = checked_grid(options, arch_list, model.width, archs);
  validate_cells(grid, model);
  check_options_apply(model, archs, arch_list);
  const json config_record = config_file ? config_file->document : json();
  if (options.plan) {
    checked_manifest(options.directory, grid, model, config_record);  // what every task would refuse, now
    if (config_file) print_config_notes(*config_file, options.verbose);
    AtomicOutput output("");
    output.stream()
        << plan_document(grid, model, archs, std::filesystem::path(options.directory) / "cells").dump(1)
        << "\n";
    output.commit();
    return 0;
  }
  ModelConfig largest = model;
  largest.blocks = *std::max_element(grid.depths.begin(), grid.depths.end());
  largest.width = *std::max_element(grid.widths.begin(), grid.widths.end());
  if (options.jobs > kMaxJobs) {
    throw InputError(
        fmt::format("--jobs {} must lie in [1, {}]; each job runs one cell, and this machine has {} "
                    "cores; try --jobs {}",
                    options.jobs, kMaxJobs, std::max(1u, std::thread::hardware_concurrency()),
                    std::max(1u, std::thread::hardware_concurrency())));
  }
  // No more cells run at once than this shard has: --jobs 64 for 3 cells needs the memory of 3.
  const auto shard_size =
      static_cast<long long>(shard_cells(sweep_cells(grid), shard_index, shard_count).size());
  const int concurrent = static_cast<int>(std::clamp<long long>(shard_size, 1, options.jobs));
  check_memory(largest, archs, concurrent, concurrent * threads_per_run(sweep_threads(options), concurrent),
               concurrent);

  const std::filesystem::path directory(options.directory), cells_directory = directory / "cells";
  // Another model, config.json or grid: refused before anything is created.
  checked_manifest(directory, grid, model, config_record);
  // After every refusal, so that a refused sweep says one line.
  if (config_file) print_config_notes(*config_file, options.verbose);
  std::error_code error;
  std::filesystem::create_directories(cells_directory, error);
  if (error)
    throw InputError(fmt::format("-o {}: cannot create {} ({})", options.directory, cells_directory.string(),
                                 error.message()));
  SweepLock lock(directory, options.shard_flag != nullptr && options.shard_flag->count() > 0);
  const json manifest = write_manifest(directory, grid, model, config_record, lock);
  remove_stale_temporaries(cells_directory);
  const std::vector<SweepCell> all_cells = sweep_cells(grid);
  const std::vector<SweepCell> mine = shard_cells(all_cells, shard_index, shard_count);
  std::vector<CellPlan> pending = pending_cells(options, model, mine, cells_directory);
  if (!options.quiet) {
    fmt::print(
        stderr,
        "gradflow sweep: shard {}/{}: {} of {} cells; {} already complete, computing {} with {} job(s)\n",
        shard_index, shard_count, mine.size(), all_cells.size(), mine.size() - pending.size(), pending.size(),
        options.jobs);
  }
  compute_cells(pending, options);
  if (shard_count > 1) {
    if (!options.quiet) {
      fmt::print(
          stderr,
          "gradflow sweep: shard {}/{} done; once every shard is, run 'gradflow merge {} -o sweep.json'\n",
          shard_index, shard_count, options.directory);
    }
    return 0;
  }
  write_summary(options, manifest, all_cells, directory);
  return 0;
}
}  // namespace

Command setup_sweep(CLI::App& app) {
  auto options = std::make_shared<SweepOptions>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "Run an (arch, depth, width, seed) grid: one file per cell, resumable, shardable; fits across depths");
  options->app = sub;
  sub->option_defaults()->always_capture_default();
  sub->add_option("--arch", options->arch,
                  "Placement ids or placement files PATH.toml, comma-separated, or 'all' (see 'gradflow "
                  "archs'); required unless --config names the placement")
      ->default_str("--config's family placement");
  sub->add_option("--depth", options->depths, "Depths in blocks B, comma-separated (e.g. 8,16,32,64)")
      ->required();
  sub->add_option("--width", options->widths, "Model widths d, comma-separated")
      ->default_str("256, or --config's hidden_size");
  sub->add_option(
         "--config", options->config,
         "A Hugging Face config.json (or a shipped one by name: " + shipped_config_names() +
             ") setting the model every cell shares, as for analyze: width, heads, KV heads, FFN, "
             "norm, RoPE, init and the family's placement; --depth is the grid's, flags given "
             "override the file (--width then lists the widths), --seq stays 64 unless given. sweep.json "
             "records it; a rerun into -o DIR must give the same file")
      ->default_str("off");
  add_model_options(sub, options->model);
  sub->add_option("--seeds", options->seeds, "Seeds 0..N-1 per (arch, depth, width)")
      ->check(CLI::PositiveNumber);
  sub->add_option("-o,--output", options->directory,
                  "Directory: cells/<arch>_B<depth>_d<width>_s<seed>.json, sweep.json (grid), summary.json "
                  "(unsharded runs)")
      ->required();
  options->shard_flag = sub->add_option(
      "--shard", options->shard,
      "Run shard i of n, i 0-based (0/3, 1/3, 2/3): the cells whose position in the global order "
      "(arch, depth, width, seed) is i mod n; no summary, use 'gradflow merge'");
  sub->add_option("--jobs", options->jobs,
                  "Cells run side by side, each splitting its ops over threads / J threads; files are "
                  "identical for every J")
      ->check(CLI::PositiveNumber);
  sub->add_option("--threads", options->threads,
                  "Threads shared out between the --jobs cells at once (each gets threads / J, at least "
                  "one); files are identical for every count")
      ->default_str("OMP_NUM_THREADS, else all cores")
      ->check(CLI::Range(1, kMaxJobs));
  sub->add_flag(
      "-v,--verbose", options->verbose,
      "One line per cell: skipped (already complete) or computed, with its time; with --config, also "
      "the config.json keys not used");
  sub->add_flag("-q,--quiet", options->quiet, "No progress bar, no summary table");
  sub->add_flag(
      "--plan", options->plan,
      "Write the plan as JSON on stdout and stop, creating nothing: every cell in the global order with "
      "its estimated seconds on one core and peak bytes, and whether its file in -o DIR is complete "
      "(scripts/sweep-slurm sizes its job array from it)");
  add_placement_options(sub, options->model);
  sub->footer(
      "Finished cells (file present, same configuration) are skipped, so an interrupted sweep resumes where "
      "it stopped.");
  return {sub,
          [options] { return run_sweep(*options); },
          {{"--arch", ListItems::text}, {"--depth", ListItems::whole}, {"--width", ListItems::whole}}};
}

}  // namespace gradflow::cli
