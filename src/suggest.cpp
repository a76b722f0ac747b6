// Did-you-mean suggestions for mistyped names (subcommands, options, placements).
#include "gradflow/suggest.hpp"

#include <algorithm>

namespace gradflow {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string nearest_name(std::string_view typed, const std::vector<std::string>& candidates) {
  if (typed.empty()) return {};
  std::string best;
  std::size_t best_distance = SIZE_MAX;
  for (const auto& candidate : candidates) {
    const std::size_t distance =
        candidate.starts_with(typed) && typed.size() >= 3 ? 0 : edit_distance(typed, candidate);
    if (distance < best_distance) best_distance = distance, best = candidate;
  }
  const std::size_t allowed = std::max<std::size_t>(2, typed.size() / 3);
  return best_distance <= allowed ? best : std::string();
}

}  // namespace gradflow
