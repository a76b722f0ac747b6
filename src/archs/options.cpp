// Placement options (PlacementOption, architecture.hpp): the registry-wide view of the options the
// recipe files declare, and their validation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "gradflow/architecture.hpp"
#include "gradflow/errors.hpp"

namespace gradflow {

std::vector<const PlacementOption*> placement_options() {
  std::vector<const PlacementOption*> options;
  for (const Architecture& arch : architectures()) {
    for (const PlacementOption& option : arch.options) {
      const bool seen = std::any_of(options.begin(), options.end(),
                                    [&](const PlacementOption* other) { return other->key == option.key; });
      if (!seen) options.push_back(&option);
    }
  }
  return options;
}

std::string PlacementOption::shown_default() const {
  if (!default_value) return std::string(default_text);
  return std::visit([](const auto& value) { return fmt::format("{}", value); }, *default_value);
}

bool declares_option(const Architecture& arch, std::string_view key) {
  return std::any_of(arch.options.begin(), arch.options.end(),
                     [&](const PlacementOption& option) { return option.key == key; });
}

std::vector<std::string_view> placements_declaring(std::string_view key) {
  std::vector<std::string_view> ids;
  for (const Architecture& arch : architectures()) {
    if (declares_option(arch, key)) ids.push_back(arch.id);
  }
  return ids;
}

namespace {
const PlacementOption& declaration(std::string_view key) {
  for (const PlacementOption* option : placement_options()) {
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

void validate_options(const ModelConfig& config) {
  for (const auto& [key, value] : config.options) {
    const PlacementOption& option = declaration(key);
    if (option.is_word() != std::holds_alternative<std::string>(value))
      throw std::logic_error(fmt::format("option {:?} given as the wrong type", key));
    if (const auto* number = std::get_if<double>(&value)) {
      if (option.check_number) option.check_number(*number);
      continue;
    }
    const std::string& word = std::get<std::string>(value);
    if (std::find(option.choices.begin(), option.choices.end(), word) == option.choices.end()) {
      throw InputError(fmt::format("{} {:?} is not {}; try {} {}", option.flag, word, quoted_choices(option),
                                   option.flag, std::get<std::string>(*option.default_value)));
    }
  }
}

namespace recipes {
PlacementOption skip_weight_option() {
  PlacementOption option;
  option.key = "alpha";
  option.flag = "--alpha";
  option.help =
      "Override the skip weight a of deepnorm, deepnorm-glm or keel (default: the paper's constant)";
  option.default_text = "paper's constant";
  // Written as !(inside) so that NaN, which compares false with everything, is refused too.
  option.check_number = [](double alpha) {
    if (!(alpha > 0.0 && std::isfinite(alpha))) {
      throw InputError(fmt::format(
          "--alpha {} must be positive and finite; omit it to use the placement's own constant", alpha));
    }
  };
  option.when_unused = UnusedOption::refuse;
  option.sets = "the skip weight";
  option.in_sweep_model = true;
  return option;
}
}  // namespace recipes

}  // namespace gradflow
