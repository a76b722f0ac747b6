// The check's first step: is each document gradflow's own, of this schema_version, whole?
// Checked before anything is compared or evaluated, so that a damaged or foreign document is
// named with the field that is wrong, not met halfway through a comparison: every field the
// comparison reads has its type, every figure column the length its run's depth says, and no run,
// seed or cell appears twice (the comparison would silently match only one of them).
#include "check_documents.hpp"

#include <fmt/format.h>

#include <set>
#include <tuple>

#include "gradflow/app/report.hpp"
#include "gradflow/config.hpp"
#include "gradflow/errors.hpp"

namespace gradflow::check_detail {

namespace {
std::string type_name(const json& value) {
  return value.is_null() ? "null" : value.type_name();
}

// What a figure column's entries must be.
enum class Entries { figures, integers, strings };

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
  // A figure the comparison reads, when present: a number, or null (non-finite); or, for
  // `text`, a string or null.
  void optional_value(const json& object, const std::string& where, const char* key,
                      bool text = false) const {
    const auto found = object.find(key);
    if (found == object.end() || found->is_null()) return;
    if (text ? found->is_string() : found->is_number()) return;
    fail(where + "." + key, fmt::format("is {} ({}), not {} or null", type_name(*found), found->dump(),
                                        text ? "a string" : "a number"));
  }
  // One column: `length` entries (one per state or per sublayer), each of the kind `entries`.
  void column(const json& values, const std::string& where, std::size_t length, Entries entries,
              const std::string& length_note) const {
    if (!values.is_array()) fail(where, fmt::format("is {}, not an array", type_name(values)));
    if (values.size() != length)
      fail(where, fmt::format("has {} entries, but {}", values.size(), length_note));
    for (const json& value : values) {
      const bool ok = entries == Entries::integers  ? value.is_number_integer()
                      : entries == Entries::strings ? value.is_string()
                                                    : (value.is_number() || value.is_null());
      if (!ok) {
        const char* wanted = entries == Entries::integers  ? "integers"
                             : entries == Entries::strings ? "strings"
                                                           : "numbers (or null)";
        fail(where, fmt::format("holds {} ({}), not {}", type_name(value), value.dump(), wanted));
      }
    }
  }
};

// The per-state columns (S + 1 entries each, `index` integers) and each stream's.
void check_states(const SchemaCheck& check, const json& states, const std::string& at,
                  std::size_t sublayers) {
  const std::string note = fmt::format("config.sublayers is {} ({} states)", sublayers, sublayers + 1);
  for (const auto& [name, values] : states.items()) {
    if (name != "streams") {
      check.column(values, at + ".states." + name, sublayers + 1,
                   name == "index" ? Entries::integers : Entries::figures, note);
      continue;
    }
    if (!values.is_object())
      check.fail(at + ".states.streams", fmt::format("is {}, not an object", type_name(values)));
    for (const auto& [stream, columns] : values.items()) {
      const std::string where = at + ".states.streams." + stream;
      if (!columns.is_object()) check.fail(where, fmt::format("is {}, not an object", type_name(columns)));
      for (const auto& [figure, column] : columns.items())
        check.column(column, where + "." + figure, sublayers + 1, Entries::figures, note);
    }
  }
}

// The per-sublayer columns (S entries each): `index` and `block` integers, `kind` strings.
void check_sublayers(const SchemaCheck& check, const json& columns, const std::string& at,
                     std::size_t sublayers) {
  const std::string note = fmt::format("config.sublayers is {}", sublayers);
  check.field(columns, at + ".sublayers", "kind", json::value_t::array);
  check.field(columns, at + ".sublayers", "block", json::value_t::array);
  for (const auto& [name, values] : columns.items()) {
    const Entries entries = name == "kind"                         ? Entries::strings
                            : (name == "index" || name == "block") ? Entries::integers
                                                                   : Entries::figures;
    check.column(values, at + ".sublayers." + name, sublayers, entries, note);
  }
}

// A seed's or a sweep cell's summary figures that the comparison reads: rms_final (cells) and
// every number, word and extremum of summary_fields() (a number or word may be null or, in a
// document from before the field, absent; an extremum is an object).
void check_summary(const SchemaCheck& check, const json& summary, const std::string& where) {
  check.optional_value(summary, where, "rms_final");
  for (const SummaryField& field : summary_fields()) {
    const std::string key(field.key);
    if (field.kind == SummaryKind::number || field.kind == SummaryKind::word) {
      check.optional_value(summary, where, key.c_str(), field.kind == SummaryKind::word);
    } else if (field.kind == SummaryKind::extremum) {
      const json& extremum = check.field(summary, where, key.c_str(), json::value_t::object);
      check.optional_value(extremum, where + "." + key, "value");
      const auto sublayer = extremum.find("sublayer");
      if (sublayer != extremum.end() && !sublayer->is_null() && !sublayer->is_number_integer())
        check.fail(where + "." + key + ".sublayer", fmt::format("is {}, not an integer", sublayer->dump()));
    }
  }
}

void check_seed(const SchemaCheck& check, const json& seed, const std::string& at, std::size_t sublayers) {
  check_states(check, check.field(seed, at, "states", json::value_t::object), at, sublayers);
  check_sublayers(check, check.field(seed, at, "sublayers", json::value_t::object), at, sublayers);
  check_summary(check, check.field(seed, at, "summary", json::value_t::object), at + ".summary");
}

// One run: its config's depth, then every seed, each seed number once.
void check_run(const SchemaCheck& check, const json& run, const std::string& where) {
  const json& config = check.field(run, where, "config", json::value_t::object);
  const json& sublayers = check.field(config, where + ".config", "sublayers", json::value_t::number_integer);
  if (sublayers.get<long long>() < 1 || sublayers.get<long long>() > 2LL * kMaxBlocks)
    check.fail(where + ".config.sublayers",
               fmt::format("is {}, not a depth gradflow runs", sublayers.dump()));
  const json& seeds = check.field(run, where, "seeds", json::value_t::array);
  if (seeds.empty()) check.fail(where + ".seeds", "is empty");
  std::set<std::string> seen;
  for (const json& seed : seeds) {
    const std::string number =
        check.field(seed, where + " seed", "seed", json::value_t::number_integer).dump();
    const std::string at = where + " seed " + number;
    if (!seen.insert(number).second)
      check.fail(at, "appears twice (a run holds each seed once; was the document concatenated or edited?)");
    check_seed(check, seed, at, static_cast<std::size_t>(sublayers.get<long long>()));
  }
}

// A sweep document: each cell once (by arch, depth, width and seed), each fit once (by arch and width).
void check_sweep(const SchemaCheck& check, const json& doc) {
  check.field(doc, "the document", "model", json::value_t::object);
  std::set<std::tuple<std::string, std::string, std::string, std::string>> cells;
  for (const json& cell : check.field(doc, "the document", "cells", json::value_t::array)) {
    check.field(cell, "a cell", "arch", json::value_t::string);
    for (const char* key : {"blocks", "width", "seed"})
      check.field(cell, "a cell", key, json::value_t::number_integer);
    const std::string where =
        fmt::format("cell {} B{} d{} seed {}", cell.at("arch").get<std::string>(), cell.at("blocks").dump(),
                    cell.at("width").dump(), cell.at("seed").dump());
    if (!cells
             .insert({cell.at("arch").get<std::string>(), cell.at("blocks").dump(), cell.at("width").dump(),
                      cell.at("seed").dump()})
             .second)
      check.fail(where,
                 "appears twice (a sweep holds each cell once; was the document concatenated or edited?)");
    check_summary(check, cell, where);
  }
  const json& summary = check.field(doc, "the document", "summary", json::value_t::object);
  std::set<std::pair<std::string, std::string>> fits;
  for (const json& fit : check.field(summary, "summary", "fits", json::value_t::array)) {
    check.field(fit, "a fit", "arch", json::value_t::string);
    check.field(fit, "a fit", "width", json::value_t::number_integer);
    const std::string where =
        fmt::format("fit {} d{}", fit.at("arch").get<std::string>(), fit.at("width").dump());
    if (!fits.insert({fit.at("arch").get<std::string>(), fit.at("width").dump()}).second)
      check.fail(where, "appears twice");
    const json& exponent = check.field(fit, where, "growth_exponent", json::value_t::object);
    if (!exponent.contains("value")) check.fail(where + ".growth_exponent", "lacks \"value\"");
    check.optional_value(exponent, where + ".growth_exponent", "value");
    check.optional_value(fit, where, "growth_class", true);
  }
}

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
  if (is_sweep(doc)) return check_sweep(check, doc);
  std::set<std::string> archs;
  for (const json& run : check.field(doc, "the document", "runs", json::value_t::array)) {
    const std::string arch = check.field(run, "a run", "arch", json::value_t::string).get<std::string>();
    if (!archs.insert(arch).second)
      check.fail("run " + arch,
                 "appears twice (a document holds one run per placement; was it concatenated "
                 "or edited?)");
    check_run(check, run, "run " + arch);
  }
}
}  // namespace

bool is_sweep(const json& doc) {
  const auto command = doc.find("command");
  return doc.is_object() && command != doc.end() && command->is_string() && *command == "sweep" &&
         doc.contains("cells");
}

void require_document(const json& doc, const std::string& which) {
  validate_document(doc, which);
}

}  // namespace gradflow::check_detail
