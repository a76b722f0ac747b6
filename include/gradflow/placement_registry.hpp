// The placements a run can name: an object built from the built-in table plus the definitions
// handed to it (the app layer reads placement files and GRADFLOW_PLACEMENTS; the core reads nothing).
#pragma once
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/architecture.hpp"

namespace gradflow {

class PlacementRegistry {
 public:
  // The built-ins (data/placements/builtins, compiled in, and the C++ recipes), in table order.
  PlacementRegistry();
  // The built-ins, then `defined` in order (e.g. a directory's files); refused as by add().
  explicit PlacementRegistry(std::vector<Architecture> defined);

  // Adds a placement after the others. Throws InputError naming both sources when its id or an
  // alias is taken, or when it declares an option differently from an earlier placement. The
  // reference stays valid for the registry's life.
  const Architecture& add(Architecture arch);
  // Adds a placement owned by the caller (a file named by path, --arch PATH.toml), after the same
  // checks (none for one of its own placements: a directory's file named by its path), and found
  // by `path` as typed as well as by id; the caller keeps it alive.
  void add_named_file(std::string path, const Architecture& arch);
  // Forgets the placements added by add_named_file (a new command line names its own files).
  void forget_named_files();
  // The placement add_named_file added under `path`, or nullptr.
  const Architecture* named_file(std::string_view path) const;
  // Throws as add() would for `arch`, without adding it.
  void check_unique(const Architecture& arch) const;

  // Built-ins, added placements, then named files, in that order.
  std::vector<const Architecture*> all() const;
  // By id or alias, or a named file by its path; throws InputError naming the nearest valid id.
  const Architecture& find(std::string_view id) const;
  // "all" or a comma-separated list, each resolved by `find_one` (find() when empty), duplicates
  // removed.
  using FindOne = std::function<const Architecture&(std::string_view)>;
  std::vector<const Architecture*> parse_list(std::string_view list, const FindOne& find_one = {}) const;

  // Every placement option once (by key), in registry order: the flags analyze and sweep accept.
  std::vector<const PlacementOption*> options() const;
  // The placements that declare the option `key`, in registry order.
  std::vector<std::string_view> declaring(std::string_view key) const;
  // Throws InputError naming the flag and the value when a given option breaks its rule
  // (a number's check, a word's choices), or std::logic_error for a key no placement declares.
  void validate_options(const ModelConfig& config) const;

 private:
  std::deque<Architecture> owned_;  // a deque, so that references stay valid as it grows
  std::vector<std::pair<std::string, const Architecture*>> named_files_;
};

}  // namespace gradflow
