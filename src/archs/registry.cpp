// The one table of placements, lookup by name with a suggestion, and recipe pieces they share.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <tuple>

#include "archs.hpp"
#include "built_in_placements.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/placement_file.hpp"
#include "gradflow/suggest.hpp"

namespace gradflow {

namespace {
// The registry's order of the built-ins (`archs`, `--arch all`, the flags' order in --help). Each is
// the file data/placements/builtins/ID.toml, compiled in (docs/placement-files.md), unless it has
// a C++ recipe: the two placements the file format cannot express.
struct BuiltIn {
  std::string_view id;
  Architecture (*recipe)() = nullptr;
};
constexpr BuiltIn kBuiltIns[] = {
    {"post-ln"},
    {"pre-ln"},
    {"deepnorm"},
    {"keel"},
    {"mix-ln"},
    {"hybridnorm"},
    {"hybridnorm-star"},
    {"resi-dual"},
    {"siamese-norm"},
    {"span-norm", archs::span_norm},
    {"peri-ln"},
    {"olmo2"},
    {"admin", archs::admin},
    {"rezero"},
    {"layerscale"},
    {"depth-mup"},
    {"deepscalelm"},
    {"ngpt"},
    {"lns"},
    {"deepnorm-glm"},
    {"plain"},
};

std::string_view built_in_file_text(std::string_view id) {
  for (const auto& [name, text] : kBuiltInPlacementFiles) {
    if (name == id) return text;
  }
  throw std::logic_error(
      fmt::format("built-in placement {} has neither a recipe nor a compiled-in file", id));
}

std::vector<Architecture> built_in_architectures() {
  // Adding a placement: a file in data/placements/ (docs/placement-files.md); a built-in: a file in
  // data/placements/builtins/ and one row above; a recipe the file format cannot express: one file in
  // src/archs/ and one row above.
  std::vector<Architecture> out;
  for (const BuiltIn& built_in : kBuiltIns) {
    out.push_back(built_in.recipe ? built_in.recipe()
                                  : load_built_in_placement(built_in.id, built_in_file_text(built_in.id)));
    if (out.back().id != built_in.id)
      throw std::logic_error(
          fmt::format("data/placements/builtins/{}.toml defines id '{}'; a built-in's file "
                      "carries its row's id",
                      built_in.id, std::string(out.back().id)));
  }
  for (const auto& [name, text] : kBuiltInPlacementFiles) {
    const bool listed = std::any_of(std::begin(kBuiltIns), std::end(kBuiltIns),
                                    [&](const BuiltIn& b) { return b.id == name; });
    if (!listed)
      throw std::logic_error(fmt::format("data/placements/builtins/{}.toml has no row in kBuiltIns", name));
  }
  return out;
}

// One option key is one flag: a second declaration must be the first's, field for field (the
// first is the one the flag, its check, --help and the documents use).
bool same_declaration(const PlacementOption& a, const PlacementOption& b) {
  const auto range = [](const NumberRange& r) {
    return std::tuple(r.low, r.high, r.low_closed, r.high_closed);
  };
  return a.flag == b.flag && a.help == b.help && a.default_value == b.default_value &&
         a.default_text == b.default_text && a.choices == b.choices && range(a.range) == range(b.range) &&
         a.fix == b.fix && a.when_unused == b.when_unused && a.sets == b.sets &&
         a.in_run_config == b.in_run_config && a.in_sweep_model == b.in_sweep_model;
}

void check_same_option(const std::vector<const Architecture*>& table, const PlacementOption& option) {
  for (const Architecture* other : table) {
    for (const PlacementOption& first : other->options) {
      if (first.key != option.key) continue;
      if (!same_declaration(first, option))
        throw InputError(fmt::format(
            "{}: option '{}' is declared differently by '{}' ({}); one key is one flag: copy that table",
            option.defined_at, std::string(option.key), std::string(other->id), first.defined_at));
      return;
    }
  }
}

// Refuses a second definition of an id (or alias) among `table`, naming both sources, and an
// option declared differently.
void check_unique(const std::vector<const Architecture*>& table, const Architecture& arch) {
  for (const Architecture* other : table) {
    std::vector<std::string_view> names = other->aliases;
    names.push_back(other->id);
    for (const std::string_view name : names) {
      if (name == arch.id ||
          std::find(arch.aliases.begin(), arch.aliases.end(), name) != arch.aliases.end()) {
        throw InputError(fmt::format("{}: placement '{}' is already defined by {}; give it another id",
                                     arch.defined_at, std::string(name), other->source));
      }
    }
  }
  for (const PlacementOption& option : arch.options) check_same_option(table, option);
}

void add_unique(std::deque<Architecture>& table, Architecture arch) {
  std::vector<const Architecture*> others;
  for (const Architecture& other : table) others.push_back(&other);
  check_unique(others, arch);
  table.push_back(std::move(arch));
}

[[noreturn]] void refuse_directory(const std::string& directory, const std::error_code& error) {
  const std::string why = error == std::errc::too_many_symbolic_link_levels
                              ? "a symbolic link loop (too many levels of symbolic links)"
                              : error.message();
  throw InputError(
      fmt::format("{}: cannot list this placement directory ({}); fix it or remove it from "
                  "GRADFLOW_PLACEMENTS",
                  directory, why));
}

// The *.toml entries of one directory, in name order; a missing directory has none. Subdirectories
// are not entered, so a link loop among them cannot trap the walk. Entries are not filtered by
// type: a *.toml that is a link loop, a dangling link, a FIFO or a directory is then refused by
// name when read (read_placement_text), not skipped, since it was put there to be loaded. Only
// error codes here: a filesystem_error (an entry's status on a link loop) ended in terminate.
std::vector<std::string> placement_files(const std::string& directory) {
  std::vector<std::string> files;
  std::error_code error;
  std::filesystem::directory_iterator entries(directory, error);
  if (error == std::errc::no_such_file_or_directory) return files;
  for (; !error && entries != std::filesystem::directory_iterator(); entries.increment(error)) {
    if (entries->path().extension() == ".toml") files.push_back(entries->path().string());
  }
  if (error) refuse_directory(directory, error);
  std::sort(files.begin(), files.end());
  return files;
}

// Built-ins, then the files of placement_directories(), then files named by path (--arch
// PATH.toml) as they are loaded: a deque, so that earlier references stay valid.
std::deque<Architecture>& registry() {
  static std::deque<Architecture> table = [] {
    std::deque<Architecture> out;
    for (Architecture& arch : built_in_architectures()) add_unique(out, std::move(arch));
    for (const std::string& directory : placement_directories()) {
      for (const std::string& file : placement_files(directory)) add_unique(out, load_placement_file(file));
    }
    return out;
  }();
  return table;
}

// Placement files named by path: every one ever loaded (never shrinks, so that results keep their
// pointers), and those of the current command line, by path as typed.
std::deque<Architecture>& loaded_files() {
  static std::deque<Architecture> all;
  return all;
}
// The text each file had when it was loaded, and its Architecture, by canonical path.
std::map<std::string, std::pair<std::string, const Architecture*>>& loaded_unchanged() {
  static std::map<std::string, std::pair<std::string, const Architecture*>> files;
  return files;
}
struct FileSession {
  std::map<std::string, const Architecture*, std::less<>> by_path;
  std::vector<const Architecture*> current;
};
FileSession& file_session() {
  static FileSession session;
  return session;
}

// A placement file named by path, loaded once per path and command line.
const Architecture& architecture_from_path(std::string_view path) {
  FileSession& session = file_session();
  if (const auto known = session.by_path.find(path); known != session.by_path.end()) return *known->second;
  // Read first: a FIFO, device, directory, link loop or oversized file is refused here by name.
  const std::string text = read_placement_text(std::string(path));
  std::error_code error;
  const std::string absolute = std::filesystem::weakly_canonical(std::string(path), error).string();
  for (const Architecture& arch : registry()) {
    std::error_code ignored;
    if (arch.source != "built-in" && !absolute.empty() &&
        std::filesystem::weakly_canonical(std::string(arch.source), ignored) == absolute)
      return *(session.by_path[std::string(path)] = &arch);
  }
  // A file loaded by an earlier command line and unchanged since is reused: a process that names
  // the same file in every call (a notebook's loop) does not grow.
  const Architecture* arch = nullptr;
  if (const auto cached = loaded_unchanged().find(absolute);
      cached != loaded_unchanged().end() && cached->second.first == text) {
    arch = cached->second.second;
    check_unique(architectures(), *arch);
  } else {
    Architecture loaded = load_placement_text(std::string(path), text);
    check_unique(architectures(), loaded);
    loaded_files().push_back(std::move(loaded));
    arch = &loaded_files().back();
    loaded_unchanged()[absolute] = {text, arch};
  }
  session.current.push_back(arch);
  return *(session.by_path[std::string(path)] = arch);
}
}  // namespace

std::vector<const Architecture*> architectures() {
  std::vector<const Architecture*> all;
  for (const Architecture& arch : registry()) all.push_back(&arch);
  const std::vector<const Architecture*>& current = file_session().current;
  all.insert(all.end(), current.begin(), current.end());
  return all;
}

void forget_placement_files() {
  file_session() = FileSession{};
}

namespace {
// How people spell placements: case, separators and "norm" for "ln" vary ("PreNorm", "post_ln"),
// so names are compared in one spelling: lower case, no separators, "layernorm"/"norm" as "ln".
std::string canonical_spelling(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (c == '-' || c == '_' || c == ' ') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (const std::string_view long_form : {"layernorm", "norm"}) {
    for (auto at = out.find(long_form); at != std::string::npos; at = out.find(long_form))
      out.replace(at, long_form.size(), "ln");
  }
  return out;
}
}  // namespace

const Architecture& find_architecture(std::string_view id) {
  if (is_placement_path(id)) return architecture_from_path(id);
  std::vector<std::string> spellings;
  std::vector<const Architecture*> owners;
  for (const Architecture* arch : architectures()) {
    if (arch->id == id || std::find(arch->aliases.begin(), arch->aliases.end(), id) != arch->aliases.end())
      return *arch;
    spellings.push_back(canonical_spelling(arch->id));
    owners.push_back(arch);
    for (const auto alias : arch->aliases)
      spellings.push_back(canonical_spelling(alias)), owners.push_back(arch);
  }
  const std::string typed = canonical_spelling(id);
  const std::string nearest = nearest_name(typed, spellings);
  const auto at = std::find(spellings.begin(), spellings.end(), nearest);
  if (nearest.empty() || at == spellings.end()) {
    throw InputError(fmt::format("--arch {:?} is not a known placement; 'gradflow archs' lists all of them",
                                 std::string(id)));
  }
  throw InputError(fmt::format(
      "--arch {:?} is not a known placement; did you mean {:?}? ('gradflow archs' lists all)",
      std::string(id), std::string(owners[static_cast<std::size_t>(at - spellings.begin())]->id)));
}

std::vector<const Architecture*> parse_architecture_list(std::string_view list) {
  std::vector<const Architecture*> result;
  if (list == "all") {
    return architectures();
  }
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view name = list.substr(start, comma - start);
    if (name.empty())
      throw InputError(
          fmt::format("--arch {:?} has an empty name; separate names by single commas", std::string(list)));
    if (name == "all") {
      throw InputError(fmt::format(
          "--arch {:?}: 'all' already names every placement; give --arch all alone, or list placements",
          std::string(list)));
    }
    const Architecture* arch = &find_architecture(name);
    if (std::find(result.begin(), result.end(), arch) == result.end()) result.push_back(arch);
    start = comma + 1;
  }
  return result;
}

double constant_value(const Constants& constants, std::string_view name) {
  for (const Constant& c : constants) {
    if (c.name == name) return c.value;
  }
  throw std::logic_error(fmt::format("recipe constant {} missing", name));
}

namespace recipes {

void post_norm(SublayerGraph& g, double skip_weight) {
  const Value x = g.input(0);
  const Value update = g.branch(x);
  const Value skip = skip_weight == 1.0 ? x : g.scale(x, skip_weight);
  const Value sum = g.add(skip, update);
  g.set_outputs({g.norm(sum)});
  g.mark_update(update, sum);
}

void identity_output(SublayerGraph& g) {
  g.set_outputs({g.input(0)});
}

double post_norm_skip_theory(double skip_weight) {
  return skip_weight / std::sqrt(skip_weight * skip_weight + 1.0);
}

}  // namespace recipes
}  // namespace gradflow
