// Placement options (PlacementOption, architecture.hpp): the registry-wide view of the options the
// placement files declare ([options.KEY], docs/placement-files.md), and their validation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "gradflow/architecture.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/placement_registry.hpp"

namespace gradflow {

std::vector<const PlacementOption*> PlacementRegistry::options() const {
  std::vector<const PlacementOption*> options;
  for (const Architecture* arch : all()) {
    for (const PlacementOption& option : arch->options) {
      const bool seen = std::any_of(options.begin(), options.end(),
                                    [&](const PlacementOption* other) { return other->key == option.key; });
      if (!seen) options.push_back(&option);
    }
  }
  return options;
}

bool NumberRange::contains(double value) const {
  // Written as !(outside) comparisons that NaN fails, so that NaN is never inside.
  const bool above = low_closed ? value >= low : value > low;
  const bool below = high_closed ? value <= high : value < high;
  return above && below && std::isfinite(value);
}

std::string NumberRange::requirement() const {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (low == -inf && high == inf) return "be finite";
  if (low == 0.0 && !low_closed && high == inf) return "be positive and finite";
  const auto bound = [](double v) {
    return std::isinf(v) ? std::string(v > 0 ? "inf" : "-inf") : fmt::format("{}", v);
  };
  return fmt::format("lie in {}{}, {}{}", low_closed ? '[' : '(', bound(low), bound(high),
                     high_closed ? ']' : ')');
}

std::string PlacementOption::shown_default() const {
  if (!default_value) return std::string(default_text);
  return std::visit([](const auto& value) { return fmt::format("{}", value); }, *default_value);
}

bool declares_option(const Architecture& arch, std::string_view key) {
  return std::any_of(arch.options.begin(), arch.options.end(),
                     [&](const PlacementOption& option) { return option.key == key; });
}

std::vector<std::string_view> PlacementRegistry::declaring(std::string_view key) const {
  std::vector<std::string_view> ids;
  for (const Architecture* arch : all()) {
    if (declares_option(*arch, key)) ids.push_back(arch->id);
  }
  return ids;
}

namespace {
const PlacementOption& declaration(const PlacementRegistry& placements, std::string_view key) {
  for (const PlacementOption* option : placements.options()) {
    if (option->key == key) return *option;
  }
  throw std::logic_error(fmt::format("no placement declares the option {:?}", key));
}

std::string quoted_choices(const PlacementOption& option) {
  const auto& choices = option.choices;
  if (choices.size() == 1) return std::string(choices.front());
  return fmt::format("{} or {}", fmt::join(choices.begin(), choices.end() - 1, ", "), choices.back());
}
}  // namespace

void check_option_value(const PlacementOption& option, const OptionValue& value) {
  if (option.is_word() != std::holds_alternative<std::string>(value))
    throw std::logic_error(fmt::format("option {:?} given as the wrong type", option.key));
  if (const auto* number = std::get_if<double>(&value)) {
    if (!option.range.contains(*number))
      throw InputError(fmt::format("{} {} must {}{}", option.flag, *number, option.range.requirement(),
                                   option.fix.empty() ? "" : fmt::format("; {}", option.fix)));
    return;
  }
  const std::string& word = std::get<std::string>(value);
  if (std::find(option.choices.begin(), option.choices.end(), word) == option.choices.end()) {
    throw InputError(fmt::format("{} {:?} is not {}{}", option.flag, word, quoted_choices(option),
                                 option.fix.empty() ? "" : fmt::format("; {}", option.fix)));
  }
}

void PlacementRegistry::validate_options(const ModelConfig& config) const {
  for (const auto& [key, value] : config.options) check_option_value(declaration(*this, key), value);
}

}  // namespace gradflow
