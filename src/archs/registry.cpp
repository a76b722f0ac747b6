// The one table of placements (PlacementRegistry: the built-ins plus definitions handed in), lookup
// by name with a suggestion, and recipe pieces they share. Reads no files: src/app/placements.cpp
// reads the placement directories and the files named by path.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include "archs.hpp"
#include "built_in_placements.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/placement_file.hpp"
#include "gradflow/placement_registry.hpp"
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

}  // namespace

PlacementRegistry::PlacementRegistry() : PlacementRegistry(std::vector<Architecture>{}) {}

PlacementRegistry::PlacementRegistry(std::vector<Architecture> defined) {
  for (Architecture& arch : built_in_architectures()) add(std::move(arch));
  for (Architecture& arch : defined) add(std::move(arch));
}

void PlacementRegistry::check_unique(const Architecture& arch) const {
  gradflow::check_unique(all(), arch);
}

const Architecture& PlacementRegistry::add(Architecture arch) {
  check_unique(arch);
  owned_.push_back(std::move(arch));
  return owned_.back();
}

void PlacementRegistry::add_named_file(std::string path, const Architecture& arch) {
  // A file of the table (a directory's) named by its path is that placement, not a second one.
  const bool own =
      std::any_of(owned_.begin(), owned_.end(), [&](const Architecture& a) { return &a == &arch; });
  if (!own) check_unique(arch);
  named_files_.emplace_back(std::move(path), &arch);
}

void PlacementRegistry::forget_named_files() {
  named_files_.clear();
}

const Architecture* PlacementRegistry::named_file(std::string_view path) const {
  for (const auto& [named, arch] : named_files_) {
    if (named == path) return arch;
  }
  return nullptr;
}

std::vector<const Architecture*> PlacementRegistry::all() const {
  std::vector<const Architecture*> all;
  for (const Architecture& arch : owned_) all.push_back(&arch);
  for (const auto& [path, arch] : named_files_) {
    if (std::find(all.begin(), all.end(), arch) == all.end()) all.push_back(arch);
  }
  return all;
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

const Architecture& PlacementRegistry::find(std::string_view id) const {
  if (const Architecture* file = named_file(id)) return *file;
  std::vector<std::string> spellings;
  std::vector<const Architecture*> owners;
  for (const Architecture* arch : all()) {
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

std::vector<const Architecture*> PlacementRegistry::parse_list(std::string_view list,
                                                               const FindOne& find_one) const {
  std::vector<const Architecture*> result;
  if (list == "all") {
    return all();
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
    const Architecture* arch = find_one ? &find_one(name) : &find(name);
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
