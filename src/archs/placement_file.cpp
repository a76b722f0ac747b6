// Reading a placement file with toml++ (header-only; it keeps every value's line and column), the
// keys of docs/placement-files.md, and the Architecture built from the checked definition.
#include "gradflow/placement_file.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "gradflow/errors.hpp"
#include "gradflow/suggest.hpp"
#include "placement_rules.hpp"

namespace gradflow {

namespace {
using placement::Expr;
using placement::ExprError;
using placement::Origin;
using placement::PlacementDefinition;
using placement::SublayerEntry;

constexpr std::array kTopKeys = {
    "id",      "citation",    "expected_growth",   "streams",   "output",    "update_rule",
    "aliases", "provisional", "unit_norm_weights", "constants", "init_gain", "sublayer"};
constexpr std::array kEntryKeys = {"when",      "rule",   "qkv_norm", "score_scale", "ffn_hidden_scale",
                                   "skip_gain", "update", "sum"};
constexpr std::array kMatrices = {"q", "k", "v", "o", "up", "down"};  // WeightMatrix order
constexpr std::array kGrowth = {"vanishing", "bounded", "sqrt", "linear", "other"};

class FileReader {
 public:
  explicit FileReader(PlacementDefinition& def) : def_(def) {}

  [[noreturn]] void fail(const toml::source_region& at, const std::string& what) const {
    throw InputError(fmt::format("{}:{}:{}: {}", def_.path, at.begin.line, at.begin.column, what));
  }

  // The origin of a string value's contents (docs: exact for one-line strings without escapes).
  const Origin* origin(const toml::node& node) {
    const toml::source_region& at = node.source();
    Origin o{def_.path, static_cast<int>(at.begin.line), static_cast<int>(at.begin.column), false};
    std::istringstream lines(def_.text);
    std::string line;
    for (unsigned i = 0; i < at.begin.line && std::getline(lines, line);) ++i;
    const std::size_t col = at.begin.column - 1;
    if (col < line.size() && (line[col] == '"' || line[col] == '\'') && line.compare(col, 3, "\"\"\"") != 0 &&
        line.compare(col, 3, "'''") != 0) {
      const std::size_t close = line.find(line[col], col + 1);
      o.exact = line[col] == '\'' || line.substr(col, close - col).find('\\') == std::string::npos;
      o.column = static_cast<int>(at.begin.column) + 1;
    }
    def_.origins.push_back(o);
    return &def_.origins.back();
  }

  std::string string(const toml::node& node, const char* what) {
    if (!node.is_string()) fail(node.source(), fmt::format("expected {} as a string", what));
    return node.as_string()->get();
  }

  Expr expression(const toml::node& node, const char* what) {
    if (node.is_integer()) return number(node, static_cast<double>(node.as_integer()->get()));
    if (node.is_floating_point()) return number(node, node.as_floating_point()->get());
    return placement::parse_expression(string(node, what), origin(node));
  }

  Expr number(const toml::node& node, double value) {
    Expr e;
    e.number = value;
    e.origin = origin(node);
    return e;
  }

  void known_keys(const toml::table& table, const auto& keys, const char* where) {
    for (auto&& [key, node] : table) {
      if (std::find(keys.begin(), keys.end(), key.str()) != keys.end()) continue;
      const std::string nearest = nearest_name(key.str(), std::vector<std::string>(keys.begin(), keys.end()));
      fail(key.source(), fmt::format("unknown key '{}' in {}{}", key.str(), where,
                                     nearest.empty() ? "" : fmt::format("; did you mean '{}'?", nearest)));
    }
  }

  void read_top(const toml::table& top);
  void read_constants(const toml::table& top);
  void read_entry(const toml::table& table);

 private:
  PlacementDefinition& def_;
};

const toml::node& required(const toml::table& table, const char* key, FileReader& reader) {
  const toml::node* node = table.get(key);
  if (!node) reader.fail(table.source(), fmt::format("missing required key '{}'", key));
  return *node;
}

std::vector<std::string> string_array(const toml::node& node, FileReader& reader, const char* what) {
  std::vector<std::string> out;
  const toml::array* array = node.as_array();
  if (!array) reader.fail(node.source(), fmt::format("expected {} as an array of strings", what));
  for (const toml::node& item : *array) out.push_back(reader.string(item, what));
  return out;
}

void FileReader::read_top(const toml::table& top) {
  known_keys(top, kTopKeys, "the placement file");
  def_.id = string(required(top, "id", *this), "id");
  const toml::source_region& id_at = top.get("id")->source();
  def_.id_at = fmt::format("{}:{}:{}", def_.path, id_at.begin.line, id_at.begin.column);
  const bool id_ok = !def_.id.empty() && std::islower(static_cast<unsigned char>(def_.id[0])) &&
                     std::all_of(def_.id.begin(), def_.id.end(), [](char c) {
                       return std::islower(static_cast<unsigned char>(c)) ||
                              std::isdigit(static_cast<unsigned char>(c)) || c == '-';
                     });
  if (!id_ok)
    fail(top.get("id")->source(),
         "expected an id of lower-case letters, digits and '-', starting with a letter");
  def_.citation = string(required(top, "citation", *this), "citation");
  const toml::node& growth = required(top, "expected_growth", *this);
  def_.expected_growth = string(growth, "expected_growth");
  if (std::find(kGrowth.begin(), kGrowth.end(), def_.expected_growth) == kGrowth.end())
    fail(growth.source(), fmt::format("expected_growth is one of {}", fmt::join(kGrowth, ", ")));
  def_.streams = top.get("streams") ? string_array(*top.get("streams"), *this, "streams")
                                    : std::vector<std::string>{"x"};
  for (const std::string& name : def_.streams) {
    const bool size = name == "S" || name == "B" || name == "l" || name == "b" || name == "d" ||
                      name == "T" || name == "heads";
    if (name.empty() || (placement::is_reserved(name) && !size) ||
        std::isdigit(static_cast<unsigned char>(name[0])))
      fail(top.get("streams")->source(),
           fmt::format("'{}' cannot be a stream name (reserved or not a name)", name));
  }
  if (top.get("aliases")) def_.aliases = string_array(*top.get("aliases"), *this, "aliases");
  if (top.get("provisional")) def_.provisional_note = string(*top.get("provisional"), "provisional");
  if (const toml::node* unit = top.get("unit_norm_weights")) {
    if (!unit->is_boolean()) fail(unit->source(), "expected unit_norm_weights as true or false");
    def_.unit_norm_weights = unit->as_boolean()->get();
  }
  const toml::node& output = required(top, "output", *this);
  def_.output_text = string(output, "output");
  def_.output = placement::parse_expression(def_.output_text, origin(output));
}

void FileReader::read_constants(const toml::table& top) {
  if (const toml::node* node = top.get("constants")) {
    if (!node->is_table()) fail(node->source(), "expected [constants] as a table of name = \"expression\"");
    for (auto&& [key, value] : *node->as_table()) {
      const std::string name(key.str());
      const bool taken = placement::is_reserved(name) ||
                         std::find(def_.streams.begin(), def_.streams.end(), name) != def_.streams.end();
      if (taken)
        fail(key.source(),
             fmt::format("'{}' is a reserved name or a stream; choose another constant name", name));
      def_.constants[name] = expression(value, "a constant expression");
      def_.constant_texts[name] =
          value.is_string() ? value.as_string()->get() : fmt::format("{}", def_.constants[name].number);
    }
  }
  if (const toml::node* node = top.get("init_gain")) {
    if (!node->is_table()) fail(node->source(), "expected [init_gain] as a table of matrix = \"expression\"");
    known_keys(*node->as_table(), kMatrices, "[init_gain] (the matrices q k v o up down)");
    for (std::size_t m = 0; m < kMatrices.size(); ++m) {
      if (const toml::node* gain = node->as_table()->get(kMatrices[m]))
        def_.init_gains[m] = expression(*gain, "a gain");
    }
  }
}

void FileReader::read_entry(const toml::table& table) {
  known_keys(table, kEntryKeys, "a [[sublayer]] entry");
  SublayerEntry entry;
  const toml::node& rule = required(table, "rule", *this);
  entry.table = origin(rule);
  entry.rule_text = string(rule, "rule");
  entry.rule = placement::parse_rule(entry.rule_text, entry.table);
  if (const toml::node* when = table.get("when")) entry.when = expression(*when, "a condition");
  for (auto [key, slot] :
       {std::pair{"score_scale", &entry.score_scale}, std::pair{"ffn_hidden_scale", &entry.ffn_hidden_scale},
        std::pair{"skip_gain", &entry.skip_gain}}) {
    if (const toml::node* node = table.get(key)) *slot = expression(*node, key);
  }
  if (const toml::node* node = table.get("qkv_norm")) {
    const std::string name = string(*node, "qkv_norm");
    const std::vector<std::string> names = {"none", "per_head_qkv", "full_qk", "per_head_qk_unit"};
    const auto at = std::find(names.begin(), names.end(), name);
    if (at == names.end()) {
      const std::string nearest = nearest_name(name, names);
      fail(node->source(), fmt::format("qkv_norm is one of {}{}", fmt::join(names, ", "),
                                       nearest.empty() ? "" : fmt::format("; did you mean '{}'?", nearest)));
    }
    entry.qkv_norm = static_cast<QkvNorm>(at - names.begin());
  }
  if (table.get("update")) entry.update_name = string(*table.get("update"), "update");
  if (table.get("sum")) entry.sum_name = string(*table.get("sum"), "sum");
  if (entry.update_name.empty() != entry.sum_name.empty())
    fail(table.source(), "update and sum are named together (both or neither)");
  def_.sublayers.push_back(std::move(entry));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot read the placement file; check the path", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void read_definition(PlacementDefinition& def) {
  FileReader reader(def);
  toml::table top;
  try {
    top = toml::parse(def.text, def.path);
  } catch (const toml::parse_error& error) {
    reader.fail(error.source(), fmt::format("not valid TOML: {}", error.description()));
  }
  reader.read_top(top);
  reader.read_constants(top);
  const toml::node* entries = top.get("sublayer");
  if (!entries) reader.fail(top.source(), "missing the [[sublayer]] entries (at least one, with a rule)");
  if (!entries->is_array_of_tables())
    reader.fail(entries->source(), "expected [[sublayer]] as an array of tables");
  for (const toml::node& entry : *entries->as_array()) reader.read_entry(*entry.as_table());
  def.update_rule = top.get("update_rule") ? reader.string(*top.get("update_rule"), "update_rule") : "";
  if (def.update_rule.empty()) {
    std::vector<std::string> rules;
    for (const SublayerEntry& entry : def.sublayers) rules.push_back(entry.rule_text);
    def.update_rule = fmt::format("{}", fmt::join(rules, " ; "));
  }
}
}  // namespace

std::string placement_hash(std::string_view text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64 (Fowler, Noll, Vo)
  for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return fmt::format("fnv1a64:{:016x}", hash);
}

bool is_placement_path(std::string_view name) {
  return name.size() > 5 && name.substr(name.size() - 5) == ".toml";
}

Architecture load_placement_file(const std::string& path) {
  static std::deque<std::unique_ptr<PlacementDefinition>> loaded;  // for the program's life
  auto def = std::make_unique<PlacementDefinition>();
  def->path = path;
  def->text = read_text(path);
  def->hash = placement_hash(def->text);
  try {
    read_definition(*def);
    placement::check_definition(*def);
  } catch (const ExprError& error) {
    throw InputError(
        fmt::format("{}: {}", error.origin ? error.origin->where(error.offset) : path, error.what()));
  }
  loaded.push_back(std::move(def));
  return placement_architecture(*loaded.back());
}

std::vector<std::string> placement_directories() {
  std::vector<std::string> dirs = {GRADFLOW_PLACEMENTS_DIR};
  if (const char* extra = std::getenv("GRADFLOW_PLACEMENTS")) {
    std::string_view list(extra);
    while (!list.empty()) {
      const std::size_t colon = std::min(list.find(':'), list.size());
      if (colon > 0) dirs.emplace_back(list.substr(0, colon));
      list.remove_prefix(std::min(colon + 1, list.size()));
    }
  }
  return dirs;
}

}  // namespace gradflow
