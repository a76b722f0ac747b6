// The placements of this process: the app layer reads the placement files (the shipped
// data/placements, GRADFLOW_PLACEMENTS, --arch PATH.toml) and hands them to a PlacementRegistry.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/architecture.hpp"
#include "gradflow/config.hpp"
#include "gradflow/placement_registry.hpp"

namespace gradflow {

// A placement file's bytes. Throws InputError naming the path unless it is a regular file (after
// symbolic links; a FIFO, device, directory or link loop is refused without blocking) of at most
// 1 MiB.
std::string read_placement_text(const std::string& path);
// Reads, checks and defines the placement in `path` (load_placement_text on its bytes).
Architecture load_placement_file(const std::string& path);
// The directories whose *.toml files are placements found by id: the shipped data/placements,
// then each entry of GRADFLOW_PLACEMENTS (separated by ':').
std::vector<std::string> placement_directories();
// The built-ins, then the files of `directories` (each directory's *.toml in name order).
PlacementRegistry read_placement_registry(const std::vector<std::string>& directories);

// The process's registry: read_placement_registry(placement_directories()) at first use, plus the
// files named by path since the last forget_placement_files(). Every pointer it hands out stays
// valid for the life of the process.
PlacementRegistry& placements();

// The process's registry, as the subcommands, the Python module and the tests use it.
std::vector<const Architecture*> architectures();  // placements().all()
// Forgets the placement files named by path: the next --arch PATH.toml reads its file again, and
// another file may reuse its id. A process running several command lines (the Python module)
// calls it before each; results keep their (still valid) pointers.
void forget_placement_files();
// By id or alias, or a placement file by path (ending in .toml), read once per command line;
// throws InputError naming the nearest valid id.
const Architecture& find_architecture(std::string_view id);
// "all" or a comma-separated list, each resolved by find_architecture, duplicates removed.
std::vector<const Architecture*> parse_architecture_list(std::string_view list);
std::vector<const PlacementOption*> placement_options();                   // placements().options()
std::vector<std::string_view> placements_declaring(std::string_view key);  // placements().declaring()
// validate(config, placements()).
void validate(const ModelConfig& config);

}  // namespace gradflow
