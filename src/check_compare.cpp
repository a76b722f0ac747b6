// The check's comparison: every figure of every run of the baseline against the same run of the
// result, each within its tolerance (figure_scale says how a difference is measured); runs of
// different configurations are reported as mismatches instead of compared.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <set>

#include "check_documents.hpp"
#include "gradflow/app/check.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

using check_detail::is_sweep;
using check_detail::require_document;
using json = nlohmann::ordered_json;

namespace {
// Compares one figure value pair and records a regression when it exceeds its tolerance.
struct FigureComparer {
  const Tolerances& tolerances;
  const std::vector<SummaryField>& fields;
  Comparison& comparison;
  std::string placement, run;

  void compare(const std::string& figure, const std::string& layer, const json& old_value,
               const json& new_value) {
    ++comparison.figures_compared;
    const double tolerance = tolerances.for_figure(figure, fields);
    const auto flag = [&](double difference, std::string note) {
      comparison.regressions.push_back(
          {placement, run, figure, layer, old_value, new_value, difference, tolerance, std::move(note)});
    };
    if (old_value.is_null() && new_value.is_null()) return;
    if (old_value.is_string() || new_value.is_string()) {
      if (old_value != new_value) flag(std::nan(""), "changed");
      return;
    }
    if (old_value.is_null()) return flag(std::nan(""), "was null in the baseline");
    if (new_value.is_null()) return flag(std::nan(""), "became null (non-finite or missing)");
    const double a = old_value.get<double>(), b = new_value.get<double>();
    double difference = std::abs(b - a);
    std::string note;
    if (figure_scale(figure, fields) == FigureScale::linear) {
      if (a > 0 && b > 0) {
        difference = std::abs(std::log10(b / a));
      } else if (a != b) {
        note = "non-positive; absolute difference";
      }
    }
    if (std::isfinite(difference)) {
      auto [entry, added] = comparison.largest.try_emplace(figure);
      if (added || difference > entry->second.difference)
        entry->second = {difference, tolerance, placement, run, layer};
    }
    if (difference > tolerance) flag(difference, note);
  }

  void compare_arrays(const std::string& figure, const json& old_values, const json& new_values,
                      const std::function<std::string(std::size_t)>& layer_name) {
    if (!old_values.is_array() || !new_values.is_array() || old_values.size() != new_values.size()) {
      comparison.regressions.push_back({placement, run, figure, "-",
                                        old_values.is_array() ? json(old_values.size()) : json(),
                                        new_values.is_array() ? json(new_values.size()) : json(),
                                        std::nan(""), 0.0, "array lengths differ"});
      return;
    }
    for (std::size_t i = 0; i < old_values.size(); ++i)
      compare(figure, layer_name(i), old_values[i], new_values[i]);
  }

  // Every number, word and extremum of the summary table (of the sweep rows' fields when
  // `sweep_row`) that the baseline has: a field added after the baseline was written is skipped.
  void compare_summary(const json& old_summary, const json& new_summary, bool sweep_row) {
    for (const SummaryField& field : fields) {
      const std::string key(field.key);
      if ((sweep_row && !field.in_sweep_cell) || !old_summary.contains(key)) continue;
      const json& old_value = old_summary.at(key);
      const json new_value = new_summary.value(key, json());
      switch (field.kind) {
        case SummaryKind::number:
        case SummaryKind::word:
          compare(key, "summary", old_value, new_value);
          break;
        case SummaryKind::extremum:
          compare(key, fmt::format("summary (sublayer {})", old_value.value("sublayer", json()).dump()),
                  old_value.value("value", json()),
                  new_value.is_object() ? new_value.value("value", json()) : json());
          break;
        case SummaryKind::event:      // the figures it stops are compared
        case SummaryKind::structure:  // another field's figures gate it
          break;
      }
    }
  }

  void compare_columns(const json& old_columns, const json& new_columns, const std::set<std::string>& skip,
                       const std::string& prefix, const std::function<std::string(std::size_t)>& layer_name) {
    for (const auto& [name, values] : old_columns.items()) {
      if (skip.count(name) || !values.is_array()) continue;
      if (!new_columns.contains(name)) {
        comparison.regressions.push_back({placement, run, prefix + name, "-", json("present"), json("absent"),
                                          std::nan(""), 0.0, "figure missing from the result"});
        continue;
      }
      compare_arrays(prefix + name, values, new_columns.at(name), layer_name);
    }
  }
};

// Records a mismatch and returns false when the two runs measure different configurations.
bool same_config(const json& result_config, const json& baseline_config, const std::string& arch,
                 Comparison& comparison) {
  // A placement file's definition travels in the config (its text and hash): runs of two different
  // definitions under one id are not comparable at all (docs/placement-files.md).
  const json a_file = baseline_config.value("placement_file", json()),
             b_file = result_config.value("placement_file", json());
  const json a_hash = a_file.is_object() ? a_file.value("hash", json()) : json();
  const json b_hash = b_file.is_object() ? b_file.value("hash", json()) : json();
  if (a_hash != b_hash) {
    throw InputError(
        fmt::format("placement '{}': the two runs were made with different placement definitions ({} "
                    "and {}); compare runs of the same definition",
                    arch, a_hash.is_null() ? "built-in" : a_hash.get<std::string>(),
                    b_hash.is_null() ? "built-in" : b_hash.get<std::string>()));
  }
  for (const std::string& field : compared_config_keys()) {
    const json a = recorded_config_value(baseline_config, field),
               b = recorded_config_value(result_config, field);
    if (a != b) {
      comparison.mismatches.push_back({arch, field, b, a});
      return false;
    }
  }
  return true;
}

// analyze documents: each baseline run (arch, seed) against the result's, column by column: the
// per-state figures, each stream's when there are several, the per-sublayer figures and the
// summary; result runs absent from the baseline are noted, not compared.
void compare_analyze(const json& result, const json& baseline, const Tolerances& tolerances,
                     const std::vector<SummaryField>& fields, Comparison& comparison) {
  std::set<std::string> matched;
  for (const json& old_run : baseline.at("runs")) {
    const std::string arch = old_run.at("arch").get<std::string>();
    const json* new_run = nullptr;
    for (const json& candidate : result.at("runs")) {
      if (candidate.at("arch") == arch) new_run = &candidate;
    }
    if (new_run && !same_config(new_run->at("config"), old_run.at("config"), arch, comparison)) {
      matched.insert(arch);  // reported as a mismatch, not as runs missing or extra
      continue;
    }
    for (const json& old_seed : old_run.at("seeds")) {
      const std::string run = fmt::format("seed {}", old_seed.at("seed").dump());
      FigureComparer comparer{tolerances, fields, comparison, arch, run};
      const json* new_seed = nullptr;
      if (new_run) {
        for (const json& candidate : new_run->at("seeds")) {
          if (candidate.at("seed") == old_seed.at("seed")) new_seed = &candidate;
        }
      }
      if (!new_seed) {
        comparison.regressions.push_back({arch, run, "(run)", "-", json("present"), json("absent"),
                                          std::nan(""), 0.0, "run missing from the result"});
        continue;
      }
      matched.insert(arch + " " + run);
      ++comparison.runs_compared;
      const json& kinds = old_seed.at("sublayers").at("kind");
      const json& blocks = old_seed.at("sublayers").at("block");
      const auto state_name = [](std::size_t l) { return fmt::format("state {}", l); };
      const auto sublayer_name = [&](std::size_t l) {
        return fmt::format("sublayer {} ({}, block {})", l, kinds.at(l).get<std::string>(),
                           blocks.at(l).dump());
      };
      comparer.compare_columns(old_seed.at("states"), new_seed->at("states"), {"index", "streams"}, "",
                               state_name);
      const json& old_streams = old_seed.at("states").value("streams", json::object());
      if (old_streams.size() > 1) {
        for (const auto& [stream, columns] : old_streams.items()) {
          const json new_columns =
              new_seed->at("states").value("streams", json::object()).value(stream, json::object());
          comparer.compare_columns(columns, new_columns, {}, "streams." + stream + ".", state_name);
        }
      }
      comparer.compare_columns(old_seed.at("sublayers"), new_seed->at("sublayers"),
                               {"index", "kind", "block"}, "", sublayer_name);
      comparer.compare_summary(old_seed.at("summary"), new_seed->at("summary"), false);
    }
  }
  for (const json& new_run : result.at("runs")) {
    if (matched.count(new_run.at("arch").get<std::string>())) continue;
    for (const json& seed : new_run.at("seeds")) {
      const std::string key =
          fmt::format("{} seed {}", new_run.at("arch").get<std::string>(), seed.at("seed").dump());
      if (!matched.count(key)) comparison.notes.push_back(key + ": not in the baseline, not compared");
    }
  }
}

// sweep documents: the shared model first (any difference is a mismatch), then each cell's
// summary figures, then each (arch, width) cross-depth fit.
void compare_sweep(const json& result, const json& baseline, const Tolerances& tolerances,
                   const std::vector<SummaryField>& fields, Comparison& comparison) {
  for (const auto& [field, value] : baseline.at("model").items()) {
    if (result.at("model").value(field, json()) != value) {
      comparison.mismatches.push_back({"(all)", field, result.at("model").value(field, json()), value});
      return;
    }
  }
  for (const json& old_cell : baseline.at("cells")) {
    const std::string arch = old_cell.at("arch").get<std::string>();
    const std::string run = fmt::format("B{} d{} seed {}", old_cell.at("blocks").dump(),
                                        old_cell.at("width").dump(), old_cell.at("seed").dump());
    FigureComparer comparer{tolerances, fields, comparison, arch, run};
    const json* new_cell = nullptr;
    for (const json& candidate : result.at("cells")) {
      if (candidate.at("arch") == old_cell.at("arch") && candidate.at("blocks") == old_cell.at("blocks") &&
          candidate.at("width") == old_cell.at("width") && candidate.at("seed") == old_cell.at("seed")) {
        new_cell = &candidate;
      }
    }
    if (!new_cell) {
      comparison.regressions.push_back({arch, run, "(cell)", "-", json("present"), json("absent"),
                                        std::nan(""), 0.0, "cell missing from the result"});
      continue;
    }
    ++comparison.runs_compared;
    comparer.compare("rms_final", "summary", old_cell.value("rms_final", json()),
                     new_cell->value("rms_final", json()));
    comparer.compare_summary(old_cell, *new_cell, true);
  }
  for (const json& old_fit : baseline.at("summary").at("fits")) {
    const std::string arch = old_fit.at("arch").get<std::string>();
    FigureComparer comparer{tolerances, fields, comparison, arch,
                            fmt::format("fit d{}", old_fit.at("width").dump())};
    for (const json& new_fit : result.at("summary").at("fits")) {
      if (new_fit.at("arch") != old_fit.at("arch") || new_fit.at("width") != old_fit.at("width")) continue;
      comparer.compare("growth_exponent", "across depths", old_fit.at("growth_exponent").at("value"),
                       new_fit.at("growth_exponent").at("value"));
      comparer.compare("growth_class", "across depths", old_fit.at("growth_class"),
                       new_fit.at("growth_class"));
    }
  }
}
}  // namespace

FigureScale figure_scale(std::string_view figure, const std::vector<SummaryField>& fields) {
  if (const SummaryField* field = find_summary_field(figure, fields)) return field->scale;
  const auto last_dot = figure.rfind('.');
  const std::string_view name = last_dot == std::string_view::npos ? figure : figure.substr(last_dot + 1);
  if (name.starts_with("log10_")) return FigureScale::log_space;
  if (name.find("exponent") != std::string_view::npos) return FigureScale::exponent;
  return FigureScale::linear;
}

double Tolerances::for_figure(const std::string& figure, const std::vector<SummaryField>& fields) const {
  if (const auto found = per_figure.find(figure); found != per_figure.end()) return found->second;
  if (const SummaryField* field = find_summary_field(figure, fields); field && field->tolerance)
    return *field->tolerance;
  switch (figure_scale(figure, fields)) {
    case FigureScale::log_space:
      return log_space;
    case FigureScale::exponent:
      return exponent;
    case FigureScale::linear:
      break;
  }
  return linear;
}

Tolerances tolerances_from_json(const json& doc, const std::string& origin) {
  Tolerances tolerances;
  if (!doc.is_object()) throw InputError(fmt::format("{}: tolerances must be a JSON object", origin));
  const auto positive = [&](const json& value, const std::string& key) {
    if (!value.is_number() || value.get<double>() < 0) {
      throw InputError(
          fmt::format("{}: tolerance {:?} must be a non-negative number, not {}", origin, key, value.dump()));
    }
    return value.get<double>();
  };
  for (const auto& [key, value] : doc.items()) {
    if (key == "log_space") {
      tolerances.log_space = positive(value, key);
    } else if (key == "linear") {
      tolerances.linear = positive(value, key);
    } else if (key == "exponent") {
      tolerances.exponent = positive(value, key);
    } else if (key == "figures" && value.is_object()) {
      for (const auto& [figure, tolerance] : value.items())
        tolerances.per_figure[figure] = positive(tolerance, figure);
    } else {
      throw InputError(
          fmt::format("{}: unknown key {:?}; use log_space, linear, exponent or figures", origin, key));
    }
  }
  return tolerances;
}

Comparison compare_documents(const json& result, const json& baseline, const Tolerances& tolerances,
                             const std::vector<SummaryField>& fields) {
  require_document(result, "result");
  require_document(baseline, "baseline");
  if (is_sweep(result) != is_sweep(baseline)) {
    throw InputError(
        "one document is a sweep and the other is not; compare a sweep with a sweep, an analysis with an "
        "analysis");
  }
  Comparison comparison;
  try {
    if (is_sweep(baseline)) {
      compare_sweep(result, baseline, tolerances, fields, comparison);
    } else {
      compare_analyze(result, baseline, tolerances, fields, comparison);
    }
  } catch (const json::exception& error) {
    throw InputError(
        fmt::format("a document lacks a field gradflow writes ({}); is it a gradflow {} document?",
                    error.what(), is_sweep(baseline) ? "sweep" : "analyze"));
  }
  return comparison;
}

}  // namespace gradflow
