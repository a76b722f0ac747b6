// Did-you-mean: the nearest of a set of names to a mistyped one, for error messages.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace gradflow {

// Levenshtein distance (insertions, deletions, substitutions).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `typed`, or "" when none is near enough to be a plausible typo: a
// candidate is plausible when `typed` is a prefix of it, or it lies within a third of its length
// (at least 2) in edit distance. Ties go to the first candidate.
std::string nearest_name(std::string_view typed, const std::vector<std::string>& candidates);

}  // namespace gradflow
