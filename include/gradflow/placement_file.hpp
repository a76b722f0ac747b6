// Placement files (docs/placement-files.md): a placement defined in TOML, read at run time and
// turned into the same Architecture (recipe graph) a built-in recipe is.
#pragma once
#include <string>
#include <vector>

#include "gradflow/architecture.hpp"

namespace gradflow {

// Reads, checks and defines the placement in `path`. Throws InputError with one line
// "file:line:column: what was expected" for any problem in the file. The definition lives as long
// as the program (the Architecture's views point into it).
Architecture load_placement_file(const std::string& path);

// The same for a file's text read by read_placement_text (the registry compares it with the text
// of an earlier load first).
Architecture load_placement_text(const std::string& path, std::string text);

// A placement file's bytes. Throws InputError naming the path unless it is a regular file (after
// symbolic links; a FIFO, device, directory or link loop is refused without blocking) of at most
// 1 MiB.
std::string read_placement_text(const std::string& path);

// A built-in defined by the compiled-in text of data/placements/builtins/NAME.toml: the same
// reading and checks, with source "built-in" (its text is not recorded in a run's config).
Architecture load_built_in_placement(std::string_view name, std::string_view text);

// True for an --arch value that names a file rather than an id (it ends in ".toml").
bool is_placement_path(std::string_view name);

// The directories whose *.toml files are placements found by id: the shipped data/placements,
// then each entry of GRADFLOW_PLACEMENTS (separated by ':').
std::vector<std::string> placement_directories();

// FNV-1a 64-bit hash of the bytes, as "fnv1a64:" and 16 lower-case hex digits.
std::string placement_hash(std::string_view text);

}  // namespace gradflow
