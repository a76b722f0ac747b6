// The check's first step: is each document gradflow's own, of this schema_version, whole?
// Checked before anything is compared or evaluated, so that a damaged or foreign document is
// named with the field that is wrong, not met halfway through a comparison.
#include "check_documents.hpp"

#include <fmt/format.h>

#include "gradflow/errors.hpp"
#include "gradflow/report.hpp"

namespace gradflow::check_detail {

namespace {
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
