// `gradflow merge`: the cells of one or more sweep directories (shards) as one sweep document,
// with the cross-depth fits; refuses shards whose configurations disagree.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <sstream>

#include "commands.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/sweep.hpp"

namespace gradflow::cli {

namespace {
using json = nlohmann::ordered_json;

struct MergeOptions {
  std::vector<std::string> directories;
  std::string output;
  std::string format;  // "": by -o's extension, else JSON
  const CLI::Option* output_flag = nullptr;
};

// Every directory's sweep.json, refused unless they are shards of one sweep (same grid, same model).
std::vector<json> read_manifests(const MergeOptions& options) {
  std::vector<json> manifests;
  for (const auto& directory : options.directories) {
    const std::string path = (std::filesystem::path(directory) / "sweep.json").string();
    if (!path_exists(path)) {
      throw InputError(
          fmt::format("{}: missing; {} is not a gradflow sweep directory (run 'gradflow sweep -o {}')", path,
                      directory, directory));
    }
    manifests.push_back(read_json_file(path));
    grid_from_manifest(manifests.back(), path);  // validates its shape
  }
  for (std::size_t i = 1; i < manifests.size(); ++i) {
    // config_file (sweep --config) may be absent: absent in both is agreement.
    for (const char* section : {"grid", "model", "config_file"}) {
      const std::string difference =
          first_difference(manifests.front().value(section, json::object()),
                           manifests[i].value(section, json::object()), std::string(section) + ".");
      if (!difference.empty()) {
        throw InputError(
            fmt::format("the shards disagree on {} (in {} vs {}); merge only shards of one sweep", difference,
                        options.directories.front(), options.directories[i]));
      }
    }
  }
  return manifests;
}

// The cells are all held at once: refuse up front what would not fit (about 8 bytes of memory per
// byte of JSON text, as parsed documents).
void check_merge_memory(const MergeOptions& options, const std::vector<SweepCell>& all_cells) {
  std::uint64_t cell_bytes = 0;
  for (const SweepCell& cell : all_cells) {
    for (const auto& directory : options.directories) {
      const std::string path = (std::filesystem::path(directory) / "cells" / cell_file_name(cell)).string();
      std::error_code error;
      const auto size = std::filesystem::file_size(path, error);
      if (!error && size > kMaxDocumentBytes) check_json_file_bounds(path);  // refused as too large, by name
      if (!error) {
        cell_bytes += size;
        break;
      }
    }
  }
  check_memory_need(8.0 * static_cast<double>(cell_bytes) + 1e3 * static_cast<double>(all_cells.size()), 1,
                    fmt::format("{} cells, {:.2f} GB of JSON", all_cells.size(), cell_bytes / 1e9),
                    "merge fewer cells at once");
}

// A cell document holds one run of one seed; cell_figures reads only the first, so a second one
// (two documents pasted together, or an analyze document copied in) would be dropped unseen.
void require_one_run(const json& doc, const std::string& path) {
  const auto runs = doc.find("runs");
  if (!doc.is_object() || runs == doc.end() || !runs->is_array() || runs->empty())
    return;  // cell_figures names it
  const auto seeds = runs->front().find("seeds");
  const std::size_t seed_count =
      seeds != runs->front().end() && seeds->is_array() ? seeds->size() : std::size_t{1};
  if (runs->size() != 1 || seed_count != 1) {
    throw InputError(
        fmt::format("{} holds {} run(s) with {} seed(s) but a cell holds one run of one seed; it is not "
                    "this sweep's cell: remove it and rerun the sweep to recompute it",
                    path, runs->size(), seed_count));
  }
}

// merge -o must not replace a file it reads: the sweep's own sweep.json or one of its cells (by
// identity, so another spelling, a symbolic link or a hard link of one is refused too).
void refuse_output_onto_inputs(const MergeOptions& options, const std::vector<SweepCell>& all_cells) {
  if (options.output.empty() || options.output == "-") return;
  std::error_code error;
  if (!std::filesystem::exists(options.output, error)) return;  // a new file cannot be an input
  const auto refuse_if_same = [&](const std::filesystem::path& input) {
    if (same_file(options.output, input.string())) {
      throw InputError(
          fmt::format("-o {} is {}, one of the files merge reads; write the merged document "
                      "elsewhere (e.g. -o {})",
                      options.output, input.string(),
                      (std::filesystem::path(options.directories.front()) / "summary.json").string()));
    }
  };
  for (const auto& directory : options.directories) {
    refuse_if_same(std::filesystem::path(directory) / "sweep.json");
    for (const SweepCell& cell : all_cells)
      refuse_if_same(std::filesystem::path(directory) / "cells" / cell_file_name(cell));
  }
}

// The cell document at `path`, refused unless it holds `cell` of this sweep: the cell its name
// says, with the sweep's shared model fields (config_fields marked in_sweep_model and compared).
json read_cell(const std::string& path, const SweepCell& cell, const json& manifest) {
  json doc = read_json_file(path);
  require_one_run(doc, path);
  const CellFigures figures = cell_figures(doc, path);  // validates the cell's shape
  if (figures.cell.arch != cell.arch || figures.cell.depth != cell.depth ||
      figures.cell.width != cell.width || figures.cell.seed != cell.seed) {
    throw InputError(
        fmt::format("{} holds the cell {}, not the one its name says; remove it and rerun the "
                    "sweep to recompute it",
                    path, cell_file_name(figures.cell)));
  }
  try {
    const json& config = doc.at("runs").at(0).at("config");
    for (const ConfigField& shared : config_fields()) {
      if (!shared.in_sweep_model || !shared.compared) continue;
      const std::string field(shared.key);
      // Issue 19's fields absent from an older document read as the defaults; a field recorded
      // only when used (--update's) is null where it is absent.
      const json cell_value = recorded_config_value(config, field),
                 sweep_value = recorded_config_value(manifest.at("model"), field);
      if (cell_value.is_null() && !shared.present)
        throw InputError(fmt::format("{}: not a gradflow cell document (config lacks {:?})", path, field));
      if (cell_value != sweep_value) {
        throw InputError(fmt::format("{} has {} {} but the sweep has {} {}; it belongs to another sweep",
                                     path, field, cell_value.dump(), field, sweep_value.dump()));
      }
    }
  } catch (const json::exception& error) {
    throw InputError(fmt::format("{}: not a gradflow cell document ({})", path, error.what()));
  }
  return doc;
}

// Every cell of the grid, each from the first directory that has it; refused when any is missing.
std::vector<json> read_cells(const MergeOptions& options, const std::vector<SweepCell>& all_cells,
                             const json& manifest) {
  std::vector<json> cells;
  std::vector<std::string> missing;
  for (const SweepCell& cell : all_cells) {
    bool found = false;
    for (const auto& directory : options.directories) {
      const std::string path = (std::filesystem::path(directory) / "cells" / cell_file_name(cell)).string();
      if (!path_exists(path)) continue;
      cells.push_back(read_cell(path, cell, manifest));
      found = true;
      break;
    }
    if (!found) missing.push_back(cell_file_name(cell));
  }
  if (!missing.empty()) {
    throw InputError(
        fmt::format("{} of {} cells are missing from {} (first: {}); run the missing shards, or rerun "
                    "'gradflow sweep' with the same options on a shard's DIR to finish it",
                    missing.size(), missing.size() + cells.size(), fmt::join(options.directories, ", "),
                    missing.front()));
  }
  return cells;
}

int run_merge(const MergeOptions& options) {
  const std::string format =
      resolve_output_format(options.format, options.output_flag, options.output, OutputKind::sweep, "json");
  const std::vector<json> manifests = read_manifests(options);
  const json& manifest = manifests.front();
  const SweepGrid grid = grid_from_manifest(manifest, options.directories.front());
  const std::vector<SweepCell> all_cells = sweep_cells(grid);
  refuse_output_onto_inputs(options, all_cells);
  check_merge_memory(options, all_cells);
  const SweepSummary sweep = sweep_summary(manifest, read_cells(options, all_cells, manifest));
  std::ostringstream text;
  find_format(format, OutputKind::sweep).sweep(sweep, text);
  write_file_atomically(options.output, text.str(), "-o");
  return 0;
}
}  // namespace

Command setup_merge(CLI::App& app) {
  auto options = std::make_shared<MergeOptions>();
  CLI::App* sub =
      app.add_subcommand("merge", "Combine sweep directories (shards) into one sweep document with the fits");
  sub->option_defaults()->always_capture_default();
  sub->add_option("DIR", options->directories, "Sweep directories (each with sweep.json and cells/)")
      ->required();
  options->output_flag =
      sub->add_option("-o,--output", options->output, "Write to FILE (whole or not at all)")
          ->default_str("stdout");
  add_format_option(
      sub, options->format, OutputKind::sweep,
      fmt::format("Output format: {}. json: the sweep document (as sweep's summary.json, byte for "
                  "byte); csv: one row per cell with its summary figures (per-state arrays stay "
                  "in the cell files)",
                  format_list_help(OutputKind::sweep)))
      ->default_str(fmt::format("by -o's extension ({}), else json",
                                fmt::join(format_extensions(OutputKind::sweep), ", ")));
  return {sub, [options] { return run_merge(*options); }};
}

}  // namespace gradflow::cli
