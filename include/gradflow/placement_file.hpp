// Placement files (docs/placement-files.md): a placement defined in TOML, its text turned into the
// same Architecture (recipe graph) a built-in recipe is.
#pragma once
#include <string>
#include <vector>

#include "gradflow/architecture.hpp"

namespace gradflow {

// Checks and defines the placement whose file `path` holds `text` (the app layer reads the file:
// load_placement_file, gradflow/app/placements.hpp). Throws InputError with one line
// "file:line:column: what was expected" for any problem in the text. The definition lives as long
// as the Architecture's last copy (Architecture::definition; its views point into it).
Architecture load_placement_text(const std::string& path, std::string text);

// A built-in defined by the compiled-in text of data/placements/builtins/NAME.toml: the same
// reading and checks, with source "built-in" (its text is not recorded in a run's config).
Architecture load_built_in_placement(std::string_view name, std::string_view text);

// True for an --arch value that names a file rather than an id (it ends in ".toml").
bool is_placement_path(std::string_view name);

// FNV-1a 64-bit hash of the bytes, as "fnv1a64:" and 16 lower-case hex digits.
std::string placement_hash(std::string_view text);

}  // namespace gradflow
