// Sweep documents: per-cell files (analyze documents without timing), the manifest every shard
// shares, and the merged document with the cross-depth fits (metrics.md, "A depth sweep fits the
// same slope across depths").
#include <fmt/format.h>

#include <cmath>

#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

namespace {
double to_double(const json& value) {
  return value.is_number() ? value.get<double>() : std::nan("");
}

json bootstrap_to_json(const BootstrapFit& fit) {
  return {{"value", json_number(fit.slope)},
          {"ci95_low", json_number(fit.ci95_low)},
          {"ci95_high", json_number(fit.ci95_high)},
          {"depths_fitted", fit.depths}};
}

constexpr const char* kCellOrder =
    "arch (as given), then depth, width, seed; shard i/n takes positions p with p % n == i";
}  // namespace

json cell_document(const ArchResult& result) {
  AnalysisReport report;
  report.results.push_back(result);
  json doc = report_to_json(report);
  doc.erase("threads");
  doc.erase("timing");
  for (auto& run : doc["runs"]) {
    for (auto& seed : run["seeds"]) seed.erase("timing");
  }
  return doc;
}

std::string first_difference(const json& a, const json& b, const std::string& prefix) {
  for (const auto& [key, value] : a.items()) {
    if (!b.contains(key)) return fmt::format("{}{}: {} vs absent", prefix, key, value.dump());
    if (value != b.at(key)) return fmt::format("{}{}: {} vs {}", prefix, key, value.dump(), b.at(key).dump());
  }
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) return fmt::format("{}{}: absent vs {}", prefix, key, value.dump());
  }
  return {};
}

json sweep_manifest(const SweepGrid& grid, const ModelConfig& config, const json& config_file) {
  json manifest = {{"schema_version", kSchemaVersion},
                   {"tool", provenance_to_json()},
                   {"command", "sweep"},
                   {"grid",
                    {{"archs", grid.archs},
                     {"depths", grid.depths},
                     {"widths", grid.widths},
                     {"seeds", grid.seeds},
                     {"cell_order", kCellOrder}}},
                   {"model", sweep_model_to_json(config)}};
  if (!config_file.is_null()) manifest["config_file"] = config_file;
  return manifest;
}

SweepGrid grid_from_manifest(const json& manifest, const std::string& origin) {
  SweepGrid out;
  try {
    if (!manifest.is_object())
      throw InputError(fmt::format("{}: not a gradflow sweep manifest (not an object)", origin));
    const json& version = manifest.at("schema_version");
    if (!version.is_number_integer() || version != kSchemaVersion) {
      throw InputError(
          fmt::format("{}: schema_version {} but this gradflow reads {}; rerun the sweep with this "
                      "version",
                      origin, version.dump(), kSchemaVersion));
    }
    if (manifest.at("command") != "sweep")
      throw InputError(
          fmt::format("{}: command is {}, not \"sweep\"", origin, manifest.at("command").dump()));
    const json& grid = manifest.at("grid");
    out.archs = grid.at("archs").get<std::vector<std::string>>();
    out.depths = grid.at("depths").get<std::vector<int>>();
    out.widths = grid.at("widths").get<std::vector<int>>();
    out.seeds = grid.at("seeds").get<int>();
    const json& model = manifest.at("model");
    if (!model.is_object())
      throw InputError(fmt::format("{}: \"model\" is {}, not an object", origin, model.type_name()));
    for (const ConfigField& field : config_fields()) {
      // Fields recorded only when used (field.present: --update's) may be absent; so may issue 19's
      // in an older manifest (recorded_config_value gives their defaults).
      if (field.in_sweep_model && field.compared && !field.present &&
          recorded_config_value(model, field.key).is_null())
        throw InputError(
            fmt::format("{}: not a gradflow sweep manifest (model lacks {:?})", origin, field.key));
    }
  } catch (const json::exception& error) {
    throw InputError(fmt::format("{}: not a gradflow sweep manifest ({})", origin, error.what()));
  }
  for (const auto& arch : out.archs) {
    try {
      find_architecture(arch);
    } catch (const InputError& error) {
      throw InputError(fmt::format("{}: {}", origin, error.what()));
    }
  }
  validate_grid(out, origin);
  return out;
}

CellFigures cell_figures(const json& cell, const std::string& origin) {
  try {
    if (cell.at("schema_version") != kSchemaVersion) {
      throw InputError(fmt::format("{}: schema_version {} but this gradflow reads {}", origin,
                                   cell.at("schema_version").dump(), kSchemaVersion));
    }
    const json& run = cell.at("runs").at(0);
    const json& config = run.at("config");
    const json& seed = run.at("seeds").at(0);
    CellFigures figures;
    figures.cell = {config.at("arch").get<std::string>(), config.at("blocks").get<int>(),
                    config.at("width").get<int>(), seed.at("seed").get<std::uint64_t>()};
    figures.sublayers = config.at("sublayers").get<int>();
    const json& rms = seed.at("states").at("rms");
    if (!rms.is_array() || rms.size() != static_cast<std::size_t>(figures.sublayers) + 1) {
      throw InputError(
          fmt::format("{}: states.rms has {} entries but the cell has {} sublayers; the file is "
                      "incomplete or edited",
                      origin, rms.is_array() ? rms.size() : 0, figures.sublayers));
    }
    figures.rms_final = to_double(rms.at(rms.size() - 1));
    figures.log10_grad_ratio = to_double(seed.at("summary").at("log10_grad_ratio"));
    if (const auto update = seed.at("summary").find("update"); update != seed.at("summary").end()) {
      for (const json& step : *update) {
        figures.learning_rates.push_back(to_double(step.at("learning_rate")));
        figures.output_update_rel.push_back(to_double(step.at("output_update_rel")));
      }
    }
    for (const char* key : {"gain_min", "gain_max"}) {
      if (!seed.at("summary").at(key).is_object())
        throw InputError(fmt::format("{}: summary.{} is not an object", origin, key));
    }
    return figures;
  } catch (const json::exception& error) {
    throw InputError(fmt::format("{}: not a gradflow cell document ({})", origin, error.what()));
  }
}

SweepSummary sweep_summary(const json& manifest, const std::vector<json>& cells) {
  SweepSummary sweep;
  sweep.manifest = manifest;
  const SweepGrid grid = grid_from_manifest(manifest, "manifest");
  std::vector<CellFigures> figures;
  for (const json& cell : cells) {
    const CellFigures f = cell_figures(cell, "cell");
    const json& summary = cell["runs"][0]["seeds"][0]["summary"];
    SweepRow row;
    row.cell = f.cell, row.sublayers = f.sublayers, row.rms_final = f.rms_final;
    for (const SummaryField& field : summary_fields()) {
      // A cell written before a field was added lacks it: null, as a non-finite figure.
      if (field.in_sweep_cell) row.summary.emplace_back(field.key, summary.value(field.key, json()));
    }
    row.output_update_rel = f.output_update_rel;
    sweep.rows.push_back(std::move(row));
    figures.push_back(f);
  }
  sweep.fits = fit_sweep(grid, figures);
  return sweep;
}

namespace {
json row_to_json(const SweepRow& row) {
  json out = {{"arch", row.cell.arch},
              {"blocks", row.cell.depth},
              {"sublayers", row.sublayers},
              {"width", row.cell.width},
              {"seed", row.cell.seed},
              {"file", "cells/" + cell_file_name(row.cell)},
              {"rms_final", json_number(row.rms_final)}};
  for (const auto& [key, value] : row.summary) out[std::string(key)] = value;
  // --update: output_update_rel per learning rate (the model's learning_rates order).
  if (!row.output_update_rel.empty()) out["output_update_rel"] = json_numbers(row.output_update_rel);
  return out;
}

json fit_to_json(const SweepFit& fit) {
  json ratio_slope = bootstrap_to_json(fit.grad_ratio_slope);
  ratio_slope["unit"] = "decades per sublayer";
  json out = {{"arch", fit.arch},
              {"width", fit.width},
              {"blocks", fit.depths},
              {"sublayers", fit.sublayers},
              {"rms_final_geometric_mean", json_numbers(fit.mean_rms_final)},
              {"log10_grad_ratio_mean", json_numbers(fit.mean_log10_grad_ratio)},
              {"growth_exponent", bootstrap_to_json(fit.growth_exponent)},
              {"growth_class", fit.growth_class},
              {"log10_grad_ratio_slope", ratio_slope}};
  if (!fit.update_exponents.empty()) {
    json exponents = json::array();
    for (std::size_t i = 0; i < fit.update_exponents.size(); ++i) {
      json one = bootstrap_to_json(fit.update_exponents[i]);
      one["learning_rate"] = fit.learning_rates[i];
      exponents.push_back(one);
    }
    out["output_update_rel_exponent"] = exponents;
  }
  return out;
}
}  // namespace

json sweep_summary_to_json(const SweepSummary& sweep) {
  json rows = json::array();
  for (const SweepRow& row : sweep.rows) rows.push_back(row_to_json(row));
  json fits = json::array();
  for (const SweepFit& fit : sweep.fits) fits.push_back(fit_to_json(fit));
  json doc = sweep.manifest;
  doc["cells"] = rows;
  doc["summary"] = {
      {"method",
       "per (arch, width): growth_exponent = least-squares slope of the per-depth mean of log rms(x_S) over "
       "seeds "
       "against log S; log10_grad_ratio_slope = slope of the per-depth mean log10_grad_ratio against S; "
       "growth_class = growth_class(growth_exponent) (docs/metrics.md)"},
      {"bootstrap",
       {{"resamples", kBootstrapResamples},
        {"seed", kBootstrapSeed},
        {"interval",
         "95% percentile interval; seeds resampled with replacement (one draw for all depths), then "
         "refitted"}}},
      {"fits", fits}};
  return doc;
}

json sweep_document(const json& manifest, const std::vector<json>& cells) {
  return sweep_summary_to_json(sweep_summary(manifest, cells));
}

void write_sweep_json(const SweepSummary& sweep, std::ostream& out) {
  out << sweep_summary_to_json(sweep).dump() << '\n';
}

// The CSV columns of a sweep row: the cell's identity and rms_final, then every summary field of
// the sweep rows (an extremum as KEY and KEY_sublayer, an event as KEY_sublayer). A field is
// written as its JSON text, so that the CSV and the sweep document agree digit for digit.
void write_sweep_csv(const SweepSummary& sweep, std::ostream& out) {
  const auto text = [](const json& value) {
    if (value.is_null()) return std::string();
    if (value.is_string()) return value.get<std::string>();
    return value.dump();
  };
  std::vector<std::string> header = {"arch", "blocks", "sublayers", "width", "seed", "rms_final"};
  for (const SummaryField& field : summary_fields()) {
    if (!field.in_sweep_cell) continue;
    const std::string key(field.key);
    if (field.kind != SummaryKind::event) header.push_back(key);
    if (field.kind == SummaryKind::extremum || field.kind == SummaryKind::event)
      header.push_back(key + "_sublayer");
  }
  for (std::size_t i = 0; i < header.size(); ++i) out << (i ? "," : "") << header[i];
  out << "\r\n";
  for (const SweepRow& row : sweep.rows) {
    std::vector<std::string> cells = {row.cell.arch,
                                      fmt::format("{}", row.cell.depth),
                                      fmt::format("{}", row.sublayers),
                                      fmt::format("{}", row.cell.width),
                                      fmt::format("{}", row.cell.seed),
                                      text(json_number(row.rms_final))};
    for (const auto& [key, value] : row.summary) {
      const SummaryField* field = find_summary_field(key);
      const json sublayer = value.is_object() ? value.value("sublayer", json()) : json();
      if (field->kind == SummaryKind::extremum) {
        cells.push_back(text(value.is_object() ? value.value("value", json()) : json()));
        cells.push_back(text(sublayer));
      } else if (field->kind == SummaryKind::event) {
        cells.push_back(text(sublayer));
      } else {
        cells.push_back(text(value));
      }
    }
    for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << cells[i];
    out << "\r\n";
  }
}

}  // namespace gradflow
