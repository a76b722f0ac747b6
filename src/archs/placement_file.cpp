// Reading a placement file with toml++ (header-only; it keeps every value's line and column), the
// keys of docs/placement-files.md, and the Architecture built from the checked definition. The file
// itself is read by the app layer (src/app/placements.cpp).
#include "gradflow/placement_file.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <memory>
#include <set>
#include <system_error>

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

constexpr std::array kTopKeys = {"id",          "citation",          "expected_growth", "streams",
                                 "output",      "update_rule",       "final_norm",      "aliases",
                                 "provisional", "unit_norm_weights", "options",         "constants",
                                 "init_gain",   "sublayer",          "requires",        "learning_rate_scale",
                                 "history"};
constexpr std::array kOptionKeys = {"help", "default",     "default_text", "choices",       "range",
                                    "fix",  "when_unused", "sets",         "in_run_config", "in_sweep_model"};
constexpr std::array kConstantKeys = {"value", "option", "formula", "unit"};
constexpr std::array kEntryKeys = {"when",      "rule",   "qkv_norm", "score_scale", "ffn_hidden_scale",
                                   "skip_gain", "update", "sum"};
constexpr std::array kMatrices = {"q", "k", "v", "o", "up", "down"};  // WeightMatrix order
constexpr std::array kUpdateRules = {"sgd", "adam"};                  // [learning_rate_scale] keys
constexpr std::array kGrowth = {"vanishing", "bounded", "sqrt", "linear", "other"};
// Counts a real placement stays far below (hyper-connections: 4 streams; keel: 2 options, 1 entry).
// Each stream is a T x d matrix in every state; each option a flag of every command line; each
// entry's condition is tried for every sublayer.
constexpr std::size_t kMaxStreams = 64;
constexpr std::size_t kMaxOptions = 64;
constexpr std::size_t kMaxEntries = 1000;

class FileReader {
 public:
  explicit FileReader(PlacementDefinition& def) : def_(def) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < def_.text.size(); ++i)
      if (def_.text[i] == '\n') line_starts_.push_back(i + 1);
  }

  [[noreturn]] void fail(const toml::source_region& at, const std::string& what) const {
    throw InputError(fmt::format("{}:{}:{}: {}", def_.path, at.begin.line, at.begin.column, what));
  }

  // The origin of a string value's contents (docs: exact for one-line strings without escapes).
  const Origin* origin(const toml::node& node) {
    const toml::source_region& at = node.source();
    Origin o{def_.path, static_cast<int>(at.begin.line), static_cast<int>(at.begin.column), false};
    const std::string_view line = line_text(at.begin.line);
    const std::size_t col = at.begin.column - 1;
    if (col < line.size() && (line[col] == '"' || line[col] == '\'') && line.substr(col, 3) != "\"\"\"" &&
        line.substr(col, 3) != "'''") {
      const std::size_t close = line.find(line[col], col + 1);
      o.exact = line[col] == '\'' || line.substr(col, close - col).find('\\') == std::string::npos;
      o.column = static_cast<int>(at.begin.column) + 1;
    }
    def_.origins.push_back(o);
    return &def_.origins.back();
  }

  // Line `number` (1-based) of the file, from an index made once: one scan of the text per string
  // value would make a file of many strings quadratic.
  std::string_view line_text(std::size_t number) const {
    if (number == 0 || number > line_starts_.size()) return {};
    const std::size_t start = line_starts_[number - 1];
    const std::size_t end = std::min(def_.text.find('\n', start), def_.text.size());
    return std::string_view(def_.text).substr(start, end - start);
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

  std::string formula_text(const toml::node& node, const Expr& e) {
    return node.is_string() ? node.as_string()->get() : fmt::format("{}", e.number);
  }
  bool boolean(const toml::node& node, const char* what) {
    if (!node.is_boolean()) fail(node.source(), fmt::format("expected {} as true or false", what));
    return node.as_boolean()->get();
  }

  void read_top(const toml::table& top);
  void read_options(const toml::table& top);
  void read_option(const std::string& key, const toml::table& table);
  void read_option_values(placement::OptionDeclaration& option, const toml::table& table);
  void read_constant_table(const std::string& name, const toml::table& table);
  NumberRange parse_range(const toml::node& node);
  void check_choices(const placement::OptionDeclaration& option, const toml::node& node);
  void read_requirement(const toml::table& table) {
    known_keys(table, std::array{"condition", "message"}, "a [[requires]] entry");
    def_.requirements.push_back({expression(required_key(table, "condition"), "a condition"),
                                 string(required_key(table, "message"), "message")});
  }
  const toml::node& required_key(const toml::table& table, const char* key) {
    const toml::node* node = table.get(key);
    if (!node) fail(table.source(), fmt::format("missing required key '{}'", key));
    return *node;
  }
  void read_constants(const toml::table& top);
  void read_entry(const toml::table& table);

 private:
  void check_placement_name(const toml::node& node, const std::string& name, const char* what);
  void read_aliases(const toml::node& node);
  void check_stream_names(const toml::node& node);

  PlacementDefinition& def_;
  std::vector<std::size_t> line_starts_;  // where each line of the text starts
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
  check_placement_name(*top.get("id"), def_.id, "id");
  def_.citation = string(required(top, "citation", *this), "citation");
  const toml::node& growth = required(top, "expected_growth", *this);
  def_.expected_growth = string(growth, "expected_growth");
  if (std::find(kGrowth.begin(), kGrowth.end(), def_.expected_growth) == kGrowth.end())
    fail(growth.source(), fmt::format("expected_growth is one of {}", fmt::join(kGrowth, ", ")));
  def_.streams = top.get("streams") ? string_array(*top.get("streams"), *this, "streams")
                                    : std::vector<std::string>{"x"};
  if (top.get("streams")) check_stream_names(*top.get("streams"));
  if (top.get("aliases")) read_aliases(*top.get("aliases"));
  if (top.get("provisional")) def_.provisional_note = string(*top.get("provisional"), "provisional");
  if (const toml::node* unit = top.get("unit_norm_weights")) {
    if (!unit->is_boolean()) fail(unit->source(), "expected unit_norm_weights as true or false");
    def_.unit_norm_weights = unit->as_boolean()->get();
  }
  if (top.get("final_norm")) def_.final_norm = string(*top.get("final_norm"), "final_norm");
  const toml::node& output = required(top, "output", *this);
  def_.output_text = string(output, "output");
  def_.output = placement::parse_expression(def_.output_text, origin(output));
}

// An id or alias is what --arch takes: lower-case letters, digits and '-', starting with a letter,
// so never a path ('/', '.', '.toml'), a flag ('-x') or a list (','); and not "all", which --arch
// reads as every placement.
void FileReader::check_placement_name(const toml::node& node, const std::string& name, const char* what) {
  const bool name_ok = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                       });
  if (!name_ok)
    fail(node.source(), fmt::format("expected an {} of lower-case letters, digits and '-', starting with a "
                                    "letter, not {:?} (e.g. \"my-pre-ln\")",
                                    what, name));
  if (name == "all")
    fail(node.source(), fmt::format("the {} \"all\" is reserved (--arch all means every placement); choose "
                                    "another",
                                    what));
}

void FileReader::read_aliases(const toml::node& node) {
  def_.aliases = string_array(node, *this, "aliases");
  std::set<std::string> seen = {def_.id};
  for (std::size_t i = 0; i < def_.aliases.size(); ++i) {
    const toml::node& item = *node.as_array()->get(i);
    check_placement_name(item, def_.aliases[i], "alias");
    if (!seen.insert(def_.aliases[i]).second)
      fail(item.source(),
           fmt::format("alias \"{}\" repeats the id or another alias; remove it", def_.aliases[i]));
  }
}

// Stream names are identifiers (rules name them), distinct, and not reserved; a size's name is
// allowed (ResiDual's stream d: inside rules the name means the stream).
void FileReader::check_stream_names(const toml::node& node) {
  std::set<std::string> seen;
  for (std::size_t i = 0; i < def_.streams.size(); ++i) {
    const std::string& name = def_.streams[i];
    const toml::source_region& at = node.as_array()->get(i)->source();
    if (i == kMaxStreams)
      fail(at,
           fmt::format("more than {} streams; a placement has a few (hyper-connections: 4)", kMaxStreams));
    const bool size = name == "S" || name == "B" || name == "l" || name == "b" || name == "d" ||
                      name == "T" || name == "heads";
    const bool identifier =
        !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
        std::all_of(name.begin(), name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!identifier || (placement::is_reserved(name) && !size))
      fail(at, fmt::format("{:?} cannot be a stream name (reserved or not a name: letters, digits and '_', "
                           "starting with a letter); rename it",
                           name));
    if (!seen.insert(name).second)
      fail(at, fmt::format("stream '{}' is named twice in streams; give each stream its own name", name));
  }
}

void FileReader::read_options(const toml::table& top) {
  const toml::node* node = top.get("options");
  if (!node) return;
  if (!node->is_table()) fail(node->source(), "expected [options.KEY] tables");
  if (node->as_table()->size() > kMaxOptions)
    fail(node->source(), fmt::format("more than {} options; a placement has a few", kMaxOptions));
  for (auto&& [key, value] : *node->as_table()) {
    const std::string name(key.str());
    const bool name_ok = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                         std::all_of(name.begin(), name.end(), [](char c) {
                           return std::islower(static_cast<unsigned char>(c)) ||
                                  std::isdigit(static_cast<unsigned char>(c)) || c == '_';
                         });
    if (!name_ok || placement::is_reserved(name) ||
        std::find(def_.streams.begin(), def_.streams.end(), name) != def_.streams.end())
      fail(key.source(), fmt::format("option '{}': expected a key of lower-case letters, digits and '_' that "
                                     "is not a reserved name or a stream",
                                     name));
    if (!value.is_table()) fail(value.source(), fmt::format("expected [options.{}] as a table", name));
    read_option(name, *value.as_table());
  }
}

void FileReader::read_option(const std::string& key, const toml::table& table) {
  known_keys(table, kOptionKeys, fmt::format("[options.{}]", key).c_str());
  placement::OptionDeclaration& option = def_.options.emplace_back();
  option.key = key;
  option.flag = "--" + key;
  std::replace(option.flag.begin(), option.flag.end(), '_', '-');
  option.at = fmt::format("{}:{}:{}", def_.path, table.source().begin.line, table.source().begin.column);
  option.help = string(required(table, "help", *this), "help");
  if (const toml::node* fix = table.get("fix")) option.fix = string(*fix, "fix");
  if (const toml::node* in = table.get("in_run_config")) option.in_run_config = boolean(*in, "in_run_config");
  if (const toml::node* in = table.get("in_sweep_model"))
    option.in_sweep_model = boolean(*in, "in_sweep_model");
  if (const toml::node* unused = table.get("when_unused")) {
    const std::string word = string(*unused, "when_unused");
    const std::vector<std::string> words = {"ignore", "warn", "refuse"};
    const auto at = std::find(words.begin(), words.end(), word);
    if (at == words.end()) fail(unused->source(), "when_unused is one of ignore, warn, refuse");
    option.when_unused = static_cast<UnusedOption>(at - words.begin());
  }
  if (const toml::node* sets = table.get("sets")) {
    if (option.when_unused != UnusedOption::refuse)
      fail(sets->source(), "'sets' belongs to an option with when_unused = \"refuse\"");
    option.sets = string(*sets, "sets");
  }
  if (option.when_unused == UnusedOption::refuse && option.sets.empty())
    fail(table.source(),
         fmt::format("option '{}' refuses runs without it: say what it sets (sets = \"the skip weight\")",
                     key));
  read_option_values(option, table);
}

// default, default_text, choices and range: a word option has choices and a default among them; a
// number option a range and a default inside it, or a default_text instead of the default.
void FileReader::read_option_values(placement::OptionDeclaration& option, const toml::table& table) {
  const toml::node* fallback = table.get("default");
  if (const toml::node* choices = table.get("choices")) {
    option.choices = string_array(*choices, *this, "choices");
    if (option.choices.empty()) fail(choices->source(), "expected at least one choice");
    if (table.get("range")) fail(table.get("range")->source(), "a word option (with choices) has no range");
    if (!fallback || !fallback->is_string())
      fail(fallback ? fallback->source() : table.source(),
           fmt::format("option '{}' has choices: expected a default among them as a string", option.key));
    const std::string word = fallback->as_string()->get();
    if (std::find(option.choices.begin(), option.choices.end(), word) == option.choices.end())
      fail(fallback->source(),
           fmt::format("default \"{}\" is not one of the choices {}", word, fmt::join(option.choices, ", ")));
    check_choices(option, *table.get("choices"));
    if (table.get("default_text"))
      fail(table.get("default_text")->source(), "a word option has a default, not a default_text");
    option.default_value = word;
    if (option.fix.empty()) option.fix = fmt::format("try {} {}", option.flag, word);
    return;
  }
  if (const toml::node* range = table.get("range")) option.range = parse_range(*range);
  if (fallback) {
    if (!fallback->is_number())
      fail(fallback->source(), "expected a number as the default (a word option needs choices)");
    const double value = fallback->value<double>().value();
    if (!option.range.contains(value))
      fail(fallback->source(), fmt::format("default {} is outside the option's range", value));
    option.default_value = value;
  }
  if (const toml::node* text = table.get("default_text")) {
    if (fallback) fail(text->source(), "give default or default_text, not both");
    option.default_text = string(*text, "default_text");
  }
  if (!fallback && option.default_text.empty())
    fail(table.source(), fmt::format("option '{}': expected a default (or a default_text)", option.key));
}

// A condition compares a word option with a choice written as a name: each is one, and distinct.
void FileReader::check_choices(const placement::OptionDeclaration& option, const toml::node& node) {
  for (const std::string& choice : option.choices) {
    const bool name =
        !choice.empty() && (std::isalpha(static_cast<unsigned char>(choice[0])) || choice[0] == '_') &&
        std::all_of(choice.begin(), choice.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!name || std::count(option.choices.begin(), option.choices.end(), choice) > 1)
      fail(node.source(), fmt::format("choice \"{}\": expected distinct names (letters, digits, '_'), which "
                                      "a condition can compare with",
                                      choice));
  }
}

// "[a, b]", "(a, b)", "[a, b)", "(a, b]" with numbers, inf or -inf.
NumberRange FileReader::parse_range(const toml::node& node) {
  const std::string text = string(node, "range");
  NumberRange range;
  const std::size_t comma = text.find(',');
  const bool shape = text.size() >= 5 && (text.front() == '[' || text.front() == '(') &&
                     (text.back() == ']' || text.back() == ')') && comma != std::string::npos;
  const auto bound = [&](std::string part, double& out) {
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    char* end = nullptr;
    out = std::strtod(part.c_str(), &end);
    return !part.empty() && end == part.c_str() + part.size() && !std::isnan(out);
  };
  if (!shape || !bound(text.substr(1, comma - 1), range.low) ||
      !bound(text.substr(comma + 1, text.size() - comma - 2), range.high) || !(range.low < range.high))
    fail(node.source(),
         fmt::format("range \"{}\": expected an interval such as \"[0, 1]\" or \"(0, inf)\"", text));
  range.low_closed = text.front() == '[';
  range.high_closed = text.back() == ']';
  return range;
}

void FileReader::read_constant_table(const std::string& name, const toml::table& table) {
  known_keys(table, kConstantKeys, fmt::format("constant '{}'", name).c_str());
  placement::ConstantRecord& record = def_.constant_records[name];
  if (const toml::node* option = table.get("option")) {
    record.option = string(*option, "option");
    const placement::OptionDeclaration* declared = placement::find_option(def_, record.option);
    if (!declared || declared->is_word())
      fail(option->source(), fmt::format("'{}' is not a number option of this file (declare [options.{}])",
                                         record.option, record.option));
  }
  if (const toml::node* value = table.get("value")) {
    def_.constants[name] = expression(*value, "a constant expression");
    record.formula = formula_text(*value, def_.constants[name]);
  } else {
    const placement::OptionDeclaration* declared = placement::find_option(def_, record.option);
    if (!declared || !declared->default_value)
      fail(table.source(),
           fmt::format("constant '{}': expected a value (or an option with a default)", name));
    Expr e;
    e.number = std::get<double>(*declared->default_value);
    e.origin = origin(table);
    def_.constants[name] = e;
    record.formula = fmt::format("{}", e.number);
  }
  if (const toml::node* formula = table.get("formula")) record.formula = string(*formula, "formula");
  if (const toml::node* unit = table.get("unit")) record.unit = string(*unit, "unit");
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
      if (value.is_table()) {
        read_constant_table(name, *value.as_table());
      } else {
        def_.constants[name] = expression(value, "a constant expression");
        def_.constant_records[name].formula = formula_text(value, def_.constants[name]);
      }
      if (placement::find_option(def_, name) && def_.constant_records[name].option != name)
        fail(key.source(), fmt::format("constant '{}' has the name of option '{}' without being bound to it; "
                                       "add option = \"{}\" or choose another name",
                                       name, name, name));
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
  if (const toml::node* node = top.get("learning_rate_scale")) {
    if (!node->is_table())
      fail(node->source(),
           "expected [learning_rate_scale] as a table of rule = \"expression\" (rules sgd adam)");
    known_keys(*node->as_table(), kUpdateRules, "[learning_rate_scale] (the update rules sgd adam)");
    for (std::size_t r = 0; r < kUpdateRules.size(); ++r) {
      if (const toml::node* scale = node->as_table()->get(kUpdateRules[r]))
        def_.learning_rate_scales[r] = expression(*scale, "a learning-rate multiplier");
    }
  }
  if (const toml::node* node = top.get("history")) {
    if (!node->is_table())
      fail(node->source(),
           "expected [history] as a table of stream = \"condition\" (when state l is a source)");
    for (auto&& [key, member] : *node->as_table()) {
      const std::string name(key.str());
      if (std::find(def_.streams.begin(), def_.streams.end(), name) == def_.streams.end())
        fail(key.source(), fmt::format("[history] names '{}', which is not a stream (streams = [{}]); name a "
                                       "stream whose history a rule reads with attend",
                                       name, fmt::join(def_.streams, ", ")));
      def_.history_members[name] = expression(member, "a condition");
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
}  // namespace

namespace {

// toml++ bounds nested arrays and inline tables (256) but not dotted keys: 'a.a.a... = 1' with
// 500,000 parts overflows its stack. A key, or a [table] header, may have at most kMaxKeyParts
// parts, counted before toml++ sees the text. A line counts as a key while it holds only what a key
// may (bare-key characters, blanks, dots, quoted parts), so values and rules are not counted.
constexpr int kMaxKeyParts = 64;

int key_parts(std::string_view line, std::size_t& at) {
  std::size_t i = line.find_first_not_of(" \t[");
  int parts = 1;
  for (; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"' || c == '\'') {  // a quoted part: skip to its end
      for (++i; i < line.size() && line[i] != c; ++i) i += c == '"' && line[i] == '\\';
    } else if (c == '.') {
      if (++parts > kMaxKeyParts) {
        at = i;
        return parts;
      }
    } else if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != ' ' &&
               c != '\t') {
      break;  // '=' or ']' ends the key; anything else means this line is no key
    }
  }
  return parts;
}

void check_key_parts(const PlacementDefinition& def) {
  std::size_t start = 0;
  for (int line = 1; start < def.text.size(); ++line) {
    const std::size_t end = std::min(def.text.find('\n', start), def.text.size());
    std::size_t at = 0;
    if (key_parts(std::string_view(def.text).substr(start, end - start), at) > kMaxKeyParts)
      throw InputError(
          fmt::format("{}:{}:{}: a key of more than {} dotted parts; a placement file's keys have "
                      "one or two (options.KEY)",
                      def.path, line, at + 1, kMaxKeyParts));
    start = end + 1;
  }
}

void read_definition(PlacementDefinition& def) {
  check_key_parts(def);
  FileReader reader(def);
  toml::table top;
  try {
    top = toml::parse(def.text, def.path);
  } catch (const toml::parse_error& error) {
    reader.fail(error.source(), fmt::format("not valid TOML: {}", error.description()));
  }
  reader.read_top(top);
  reader.read_options(top);
  reader.read_constants(top);
  if (const toml::node* requires_node = top.get("requires")) {
    if (!requires_node->is_array_of_tables())
      reader.fail(requires_node->source(), "expected [[requires]] entries with condition and message");
    for (const toml::node& entry : *requires_node->as_array()) reader.read_requirement(*entry.as_table());
  }
  const toml::node* entries = top.get("sublayer");
  if (!entries) reader.fail(top.source(), "missing the [[sublayer]] entries (at least one, with a rule)");
  if (!entries->is_array_of_tables())
    reader.fail(entries->source(), "expected [[sublayer]] as an array of tables");
  if (entries->as_array()->size() > kMaxEntries)
    reader.fail(entries->as_array()->get(kMaxEntries)->source(),
                fmt::format("more than {} [[sublayer]] entries; a placement has a few", kMaxEntries));
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

namespace {
Architecture define_placement(const std::string& path, std::string text, bool built_in) {
  auto def = std::make_shared<PlacementDefinition>();
  def->path = path;
  def->text = std::move(text);
  def->hash = placement_hash(def->text);
  def->built_in = built_in;
  try {
    read_definition(*def);
    placement::check_definition(*def);
  } catch (const ExprError& error) {
    throw InputError(
        fmt::format("{}: {}", error.origin ? error.origin->where(error.offset) : path, error.what()));
  }
  Architecture arch = placement_architecture(*def);
  arch.definition = std::move(def);
  return arch;
}
}  // namespace

Architecture load_placement_text(const std::string& path, std::string text) {
  return define_placement(path, std::move(text), false);
}

Architecture load_built_in_placement(std::string_view name, std::string_view text) {
  return define_placement(fmt::format("data/placements/builtins/{}.toml", name), std::string(text), true);
}

}  // namespace gradflow
