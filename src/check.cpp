// Regression checks between gradflow documents, and --expect expressions.
#include "gradflow/check.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <set>

#include "gradflow/errors.hpp"
#include "gradflow/report.hpp"
#include "gradflow/statistics.hpp"

namespace gradflow {

using json = nlohmann::ordered_json;

namespace {

bool is_sweep(const json& doc) {
  const auto command = doc.find("command");
  return doc.is_object() && command != doc.end() && command->is_string() && *command == "sweep" &&
         doc.contains("cells");
}

// ---- the document schema, checked whole before anything is compared or evaluated
std::string type_name(const json& value) {
  return value.is_null() ? "null" : value.type_name();
}

struct SchemaCheck {
  const std::string& which;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw InputError(fmt::format("the {} is not a gradflow document of schema_version {}: {} {}", which,
                                 kSchemaVersion, where, what));
  }
  const json& field(const json& object, const std::string& where, const char* key, json::value_t type) const {
    if (!object.is_object()) fail(where, fmt::format("is {}, not an object", type_name(object)));
    const auto found = object.find(key);
    if (found == object.end()) fail(where, fmt::format("lacks {:?}", key));
    const bool ok = type == json::value_t::number_integer
                        ? found->is_number_integer()
                        : (type == json::value_t::number_float ? found->is_number() : found->type() == type);
    if (!ok) {
      const char* wanted = type == json::value_t::number_integer ? "an integer"
                           : type == json::value_t::number_float ? "a number"
                           : type == json::value_t::string       ? "a string"
                           : type == json::value_t::array        ? "an array"
                                                                 : "an object";
      fail(where + "." + key, fmt::format("is {} ({}), not {}", type_name(*found), found->dump(), wanted));
    }
    return *found;
  }
  // A figure column: an array of numbers, nulls (non-finite) or, for some columns, strings.
  void figures(const json& columns, const std::string& where) const {
    for (const auto& [name, values] : columns.items()) {
      if (!values.is_array()) continue;  // nested objects (streams) are checked by their own call
      for (const json& value : values) {
        if (!(value.is_number() || value.is_null() || value.is_string()))
          fail(where + "." + name, fmt::format("holds {}, not numbers", type_name(value)));
      }
    }
  }
};

void validate_document(const json& doc, const std::string& which) {
  const SchemaCheck check{which};
  if (!doc.is_object()) check.fail("the document", fmt::format("is {}, not an object", type_name(doc)));
  const json& version = check.field(doc, "the document", "schema_version", json::value_t::number_integer);
  if (version != kSchemaVersion) {
    throw InputError(
        fmt::format("the {} has schema_version {} but this gradflow reads {}; regenerate it with "
                    "this version",
                    which, version.dump(), kSchemaVersion));
  }
  if (doc.contains("command") && !doc.at("command").is_string())
    check.fail("command", fmt::format("is {}, not a string", type_name(doc.at("command"))));
  if (is_sweep(doc)) {
    check.field(doc, "the document", "model", json::value_t::object);
    for (const json& cell : check.field(doc, "the document", "cells", json::value_t::array)) {
      check.field(cell, "a cell", "arch", json::value_t::string);
      for (const char* key : {"blocks", "width", "seed"})
        check.field(cell, "a cell", key, json::value_t::number_integer);
      for (const char* key : {"gain_min", "gain_max"})
        check.field(cell, "a cell", key, json::value_t::object);
    }
    const json& summary = check.field(doc, "the document", "summary", json::value_t::object);
    for (const json& fit : check.field(summary, "summary", "fits", json::value_t::array)) {
      check.field(fit, "a fit", "arch", json::value_t::string);
      check.field(fit, "a fit", "width", json::value_t::number_integer);
      if (!check.field(fit, "a fit", "growth_exponent", json::value_t::object).contains("value"))
        check.fail("a fit's growth_exponent", "lacks \"value\"");
    }
    return;
  }
  const json& runs = check.field(doc, "the document", "runs", json::value_t::array);
  for (const json& run : runs) {
    const std::string arch = check.field(run, "a run", "arch", json::value_t::string).get<std::string>();
    const std::string where = "run " + arch;
    check.field(run, where, "config", json::value_t::object);
    const json& seeds = check.field(run, where, "seeds", json::value_t::array);
    if (seeds.empty()) check.fail(where + ".seeds", "is empty");
    for (const json& seed : seeds) {
      const std::string at =
          where + " seed " + check.field(seed, where + " seed", "seed", json::value_t::number_integer).dump();
      check.figures(check.field(seed, at, "states", json::value_t::object), at + ".states");
      const json& sublayers = check.field(seed, at, "sublayers", json::value_t::object);
      check.figures(sublayers, at + ".sublayers");
      const auto kinds = check.field(sublayers, at + ".sublayers", "kind", json::value_t::array).size();
      if (check.field(sublayers, at + ".sublayers", "block", json::value_t::array).size() != kinds)
        check.fail(at + ".sublayers", "has kind and block columns of different lengths");
      const json& summary = check.field(seed, at, "summary", json::value_t::object);
      for (const char* key : {"gain_min", "gain_max"})
        check.field(summary, at + ".summary", key, json::value_t::object);
    }
  }
}

void require_document(const json& doc, const std::string& which) {
  validate_document(doc, which);
}

// Compares one figure value pair and records a regression when it exceeds its tolerance.
struct FigureComparer {
  const Tolerances& tolerances;
  Comparison& comparison;
  std::string placement, run;

  void compare(const std::string& figure, const std::string& layer, const json& old_value,
               const json& new_value) {
    ++comparison.figures_compared;
    const double tolerance = tolerances.for_figure(figure);
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
    if (figure_scale(figure) == FigureScale::linear) {
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
  for (const std::string& field : compared_config_keys()) {
    const json a = baseline_config.value(field, json()), b = result_config.value(field, json());
    if (a != b) {
      comparison.mismatches.push_back({arch, field, b, a});
      return false;
    }
  }
  return true;
}

void compare_analyze(const json& result, const json& baseline, const Tolerances& tolerances,
                     Comparison& comparison) {
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
      FigureComparer comparer{tolerances, comparison, arch, run};
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
      const json& old_summary = old_seed.at("summary");
      const json& new_summary = new_seed->at("summary");
      for (const char* figure : {"log10_grad_ratio", "growth_exponent", "growth_class"}) {
        comparer.compare(figure, "summary", old_summary.value(figure, json()),
                         new_summary.value(figure, json()));
      }
      for (const char* figure : {"gain_min", "gain_max"}) {
        comparer.compare(
            figure,
            fmt::format("summary (sublayer {})", old_summary.at(figure).value("sublayer", json()).dump()),
            old_summary.at(figure).value("value", json()), new_summary.at(figure).value("value", json()));
      }
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

void compare_sweep(const json& result, const json& baseline, const Tolerances& tolerances,
                   Comparison& comparison) {
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
    FigureComparer comparer{tolerances, comparison, arch, run};
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
    for (const char* figure : {"rms_final", "log10_grad_ratio", "growth_exponent", "growth_class"}) {
      comparer.compare(figure, "summary", old_cell.value(figure, json()), new_cell->value(figure, json()));
    }
    for (const char* figure : {"gain_min", "gain_max"}) {
      comparer.compare(figure, "summary", old_cell.at(figure).value("value", json()),
                       new_cell->at(figure).value("value", json()));
    }
  }
  for (const json& old_fit : baseline.at("summary").at("fits")) {
    const std::string arch = old_fit.at("arch").get<std::string>();
    FigureComparer comparer{tolerances, comparison, arch, fmt::format("fit d{}", old_fit.at("width").dump())};
    for (const json& new_fit : result.at("summary").at("fits")) {
      if (new_fit.at("arch") != old_fit.at("arch") || new_fit.at("width") != old_fit.at("width")) continue;
      comparer.compare("growth_exponent", "across depths", old_fit.at("growth_exponent").at("value"),
                       new_fit.at("growth_exponent").at("value"));
      comparer.compare("growth_class", "across depths", old_fit.at("growth_class"),
                       new_fit.at("growth_class"));
    }
  }
}

bool parse_number(std::string_view text, double& value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return std::string(text.substr(first, text.find_last_not_of(" \t") - first + 1));
}

// The value at `path` of `object`; an object with "value" stands for that value. Null when absent.
json lookup(const json& object, const std::vector<std::string>& path) {
  const json* node = &object;
  for (const auto& key : path) {
    if (!node->is_object() || !node->contains(key)) return json();
    node = &node->at(key);
  }
  if (node->is_object() && node->contains("value")) return node->at("value");
  return *node;
}

bool holds(const json& actual, const Expectation& e) {
  double wanted = 0;
  if (parse_number(e.value, wanted)) {
    if (!actual.is_number()) return false;
    const double v = actual.get<double>();
    if (e.op == "<") return v < wanted;
    if (e.op == "<=") return v <= wanted;
    if (e.op == ">") return v > wanted;
    if (e.op == ">=") return v >= wanted;
    if (e.op == "==") return v == wanted;
    return v != wanted;
  }
  const std::string text = actual.is_string() ? actual.get<std::string>() : actual.dump();
  return (e.op == "==") == (text == e.value);
}

std::string field_list(const json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return fmt::format("{}", fmt::join(keys, ", "));
}
}  // namespace

FigureScale figure_scale(std::string_view figure) {
  const auto last_dot = figure.rfind('.');
  const std::string_view name = last_dot == std::string_view::npos ? figure : figure.substr(last_dot + 1);
  if (name.starts_with("log10_")) return FigureScale::log_space;
  if (name.find("exponent") != std::string_view::npos) return FigureScale::exponent;
  return FigureScale::linear;
}

double Tolerances::for_figure(const std::string& figure) const {
  if (const auto found = per_figure.find(figure); found != per_figure.end()) return found->second;
  switch (figure_scale(figure)) {
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

Comparison compare_documents(const json& result, const json& baseline, const Tolerances& tolerances) {
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
      compare_sweep(result, baseline, tolerances, comparison);
    } else {
      compare_analyze(result, baseline, tolerances, comparison);
    }
  } catch (const json::exception& error) {
    throw InputError(
        fmt::format("a document lacks a field gradflow writes ({}); is it a gradflow {} document?",
                    error.what(), is_sweep(baseline) ? "sweep" : "analyze"));
  }
  return comparison;
}

Expectation parse_expectation(const std::string& text) {
  static const char* kOperators[] = {"<=", ">=", "==", "!=", "<", ">"};
  const auto at = text.find_first_of("<>=!");
  const auto bad = [&](const std::string& why) {
    return InputError(
        fmt::format("--expect {:?}: {}; write ARCH.FIELD[.SUBFIELD] OP VALUE with OP one of < <= > >= == != "
                    "(e.g. 'keel.log10_grad_ratio < 0.1')",
                    text, why));
  };
  if (at == std::string::npos) throw bad("no comparison operator");
  Expectation e;
  e.text = text;
  for (const char* op : kOperators) {
    if (text.compare(at, std::string_view(op).size(), op) == 0) {
      e.op = op;
      break;
    }
  }
  if (e.op.empty()) throw bad(fmt::format("{:?} is not an operator", text.substr(at, 2)));
  const std::string left = trim(std::string_view(text).substr(0, at));
  e.value = trim(std::string_view(text).substr(at + e.op.size()));
  if (e.value.empty() || e.value.find_first_of("<>=! \t") != std::string::npos)
    throw bad("the value must be one number or word");
  std::size_t start = 0;
  std::vector<std::string> parts;
  while (start <= left.size()) {
    const auto dot = std::min(left.find('.', start), left.size());
    parts.push_back(left.substr(start, dot - start));
    start = dot + 1;
  }
  if (parts.size() < 2 || parts.size() > 3)
    throw bad("the left side must be ARCH.FIELD or ARCH.FIELD.SUBFIELD");
  for (const auto& part : parts) {
    if (part.empty() || part.find_first_of(" \t") != std::string::npos)
      throw bad(fmt::format("{:?} is not a name", left));
  }
  e.arch = parts[0];
  e.path.assign(parts.begin() + 1, parts.end());
  double number = 0;
  const bool numeric = parse_number(e.value, number);
  if (numeric &&
      !std::isfinite(number)) {  // from_chars reads nan and inf; every comparison with NaN is false
    throw bad(
        fmt::format("{:?} is not a finite number (non-finite figures are null in the document)", e.value));
  }
  if (!numeric && e.op != "==" && e.op != "!=") {
    throw bad(fmt::format("{} needs a number, not {:?}", e.op, e.value));
  }
  return e;
}

ExpectationOutcome evaluate_expectation(const Expectation& e, const json& result) {
  require_document(result, "result");
  const std::string field = fmt::format("{}", fmt::join(e.path, "."));
  std::vector<json> values;  // one per width (sweep) or the seed average (analyze)
  std::vector<std::string> archs;
  if (is_sweep(result)) {
    for (const json& fit : result.at("summary").at("fits")) {
      archs.push_back(fit.at("arch").get<std::string>());
      if (fit.at("arch") != e.arch) continue;
      const json value = lookup(fit, e.path);
      if (value.is_null() && !(fit.contains(e.path[0]))) {
        throw InputError(fmt::format("--expect {:?}: unknown field {:?} of a sweep fit; fields: {}", e.text,
                                     field, field_list(fit)));
      }
      values.push_back(value);
    }
  } else {
    for (const json& run : result.at("runs")) {
      archs.push_back(run.at("arch").get<std::string>());
      if (run.at("arch") != e.arch) continue;
      const json& seeds = run.at("seeds");
      const json& first_summary = seeds.at(0).at("summary");
      if (!first_summary.contains(e.path[0]) ||
          (e.path.size() > 1 && !first_summary.at(e.path[0]).is_object())) {
        throw InputError(fmt::format("--expect {:?}: unknown field {:?}; fields: {}", e.text, field,
                                     field_list(first_summary)));
      }
      if (e.path.size() > 1 && !first_summary.at(e.path[0]).contains(e.path[1])) {
        throw InputError(fmt::format("--expect {:?}: unknown field {:?}; fields of {}: {}", e.text, field,
                                     e.path[0], field_list(first_summary.at(e.path[0]))));
      }
      if (e.path.size() == 1 &&
          e.path[0] == "growth_class") {  // the class of the mean exponent, as in aggregate
        std::vector<double> exponents;
        bool agree = true;  // the seeds' class when they agree (as in aggregate)
        for (const json& seed : seeds) {
          exponents.push_back(lookup(seed.at("summary"), {"growth_exponent"}).is_number()
                                  ? lookup(seed.at("summary"), {"growth_exponent"}).get<double>()
                                  : std::nan(""));
          agree = agree && seed.at("summary").value("growth_class", json()) ==
                               first_summary.value("growth_class", json());
        }
        if (agree && first_summary.value("growth_class", json()).is_string()) {
          values.push_back(first_summary.at("growth_class"));
        } else {
          values.push_back(std::string(growth_class(spread(exponents).mean)));
        }
        continue;
      }
      double sum = 0;
      bool numeric = true;
      json first = lookup(first_summary, e.path);
      for (const json& seed : seeds) {
        const json value = lookup(seed.at("summary"), e.path);
        if (!value.is_number())
          numeric = false;
        else
          sum += value.get<double>();
        if (value != first) first = first.is_string() ? json("(varies across seeds)") : first;
      }
      values.push_back(numeric ? json(sum / static_cast<double>(seeds.size())) : first);
    }
  }
  if (values.empty()) {
    throw InputError(fmt::format("--expect {:?}: unknown placement {:?}; the result has {}", e.text, e.arch,
                                 fmt::join(archs, ", ")));
  }
  ExpectationOutcome outcome{e.text, true, ""};
  for (const json& value : values) {
    outcome.passed = outcome.passed && holds(value, e);
    if (!outcome.actual.empty()) outcome.actual += ", ";
    outcome.actual += value.is_string()   ? value.get<std::string>()
                      : value.is_number() ? fmt::format("{:.6g}", value.get<double>())
                                          : value.dump();
  }
  return outcome;
}

}  // namespace gradflow
