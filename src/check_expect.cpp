// The check's expectations: `ARCH.FIELD[.SUBFIELD] OP VALUE` parsed, and evaluated on a seed
// summary of an analyze document (averaged over seeds) or on every cross-depth fit of a sweep.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>

#include "check_documents.hpp"
#include "gradflow/app/check.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/statistics.hpp"

namespace gradflow {

using check_detail::is_sweep;
using check_detail::require_document;
using json = nlohmann::ordered_json;

namespace {
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

// Whether a value satisfies the expectation: numerically when VALUE is a number, else as text.
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
