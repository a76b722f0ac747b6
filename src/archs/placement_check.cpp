// Static checks of a placement file's definition (docs/placement-files.md): every name known,
// tensors and constants where each belongs, F exactly once per rule, each stream assigned at most
// once, every binding used, no cycle among constants; then the update/sum each rule marks.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "gradflow/suggest.hpp"
#include "placement_rules.hpp"

namespace gradflow::placement {

namespace {
constexpr std::array kSizes = {"S", "B", "l", "b", "d", "T", "heads"};

bool is_size(std::string_view name) {
  return std::find(kSizes.begin(), kSizes.end(), name) != kSizes.end();
}

int arity(std::string_view function) {
  if (function == "if") return 3;
  if (function == "min" || function == "max" || function == "mod") return 2;
  return 1;
}

// True when e holds attend(stream, ...), history_sum(stream) or history_mean(stream): a read of
// that stream's history.
bool reads_history_of(const Expr& e, const std::string& stream) {
  if (e.kind == ExprKind::call && is_history_read(e.text) && !e.args.empty() && e.args[0].text == stream)
    return true;
  return std::any_of(e.args.begin(), e.args.end(),
                     [&](const Expr& a) { return reads_history_of(a, stream); });
}

bool is_condition(const Expr& e) {
  return e.kind == ExprKind::compare || e.kind == ExprKind::logical_and || e.kind == ExprKind::logical_or ||
         e.kind == ExprKind::logical_not;
}

// What an expression may mention where it is checked.
struct Scope {
  const PlacementDefinition* def = nullptr;
  bool tensors = false;  // streams, bindings, N, U (rules and the output head)
  bool branch = false;   // F (rules only)
  std::map<std::string, Expr*>* bindings = nullptr;
  std::set<std::string>* used = nullptr;
  int branches = 0;        // F's seen
  bool fractions = false;  // fraction_out and fraction_in (mix_fractions's weight only)
};

bool is_fraction_index(std::string_view name) {
  return name == "fraction_out" || name == "fraction_in";
}

class Checker {
 public:
  explicit Checker(Scope& scope) : s_(scope) {}

  void check(Expr& e) {
    visit(e);
    deepen(e);
  }

  void visit(Expr& e) {
    switch (e.kind) {
      case ExprKind::number:
        return;
      case ExprKind::name:
        return name(e);
      case ExprKind::call:
        return call(e);
      case ExprKind::negate:
        check(e.args[0]);
        return inherit(e);
      case ExprKind::binary:
        return binary(e);
      case ExprKind::compare:
        return compare(e);
      default:
        for (Expr& a : e.args) condition(a);
    }
  }

  void condition(Expr& e) {
    check(e);
    if (!is_condition(e)) fail(e, "expected a condition such as 'l == 0' or 'kind == attn'");
  }
  void constant(Expr& e) {
    check(e);
    if (is_condition(e)) fail(e, "expected a constant expression, not a condition");
    if (e.tensor) fail(e, "expected a constant expression; streams, bindings, N, U and F belong in rules");
  }
  void tensor(Expr& e) {
    check(e);
    if (!e.tensor) fail(e, "expected a tensor expression (a stream, N(...), F(...) ...), not a constant");
  }

  [[noreturn]] static void fail(const Expr& e, const std::string& what) {
    throw ExprError(e.origin, e.offset, what);
  }

 private:
  // e's depth with what its names stand for: a constant is evaluated and a binding built where the
  // name is used, so their depth adds to the recursion there (kMaxDepth bounds it).
  void deepen(Expr& e) {
    if (e.kind == ExprKind::name) e.depth = 1 + named_depth(e.text);
    for (const Expr& a : e.args) e.depth = std::max(e.depth, a.depth + 1);
    if (e.depth > kMaxDepth) fail(e, depth_message());
  }

  int named_depth(const std::string& name) const {
    const PlacementDefinition& def = *s_.def;
    if (s_.tensors && std::find(def.streams.begin(), def.streams.end(), name) != def.streams.end()) return 0;
    if (const auto constant = def.constant_depths.find(name); constant != def.constant_depths.end())
      return constant->second;
    if (s_.tensors && s_.bindings && s_.bindings->count(name)) return s_.bindings->at(name)->depth;
    return 0;
  }

  void inherit(Expr& e) {
    for (const Expr& a : e.args) e.tensor |= a.tensor, e.holds_branch |= a.holds_branch;
  }

  void name(Expr& e) {
    const PlacementDefinition& def = *s_.def;
    const bool stream = std::find(def.streams.begin(), def.streams.end(), e.text) != def.streams.end();
    if (s_.tensors && stream) return void(e.tensor = true);  // a stream may take a size's name (ResiDual's d)
    if (is_fraction_index(e.text)) {
      if (s_.fractions) return;
      fail(e, fmt::format("'{}' can only be used in the weight of mix_fractions(e, m, weight), its third "
                          "argument",
                          e.text));
    }
    if (is_size(e.text) || def.constants.count(e.text) || is_number_option_name(def, e.text)) return;
    if (const OptionDeclaration* option = find_option(def, e.text); option && !option->is_word())
      fail(e, fmt::format("option '{}' has no default to use here; bind it to a constant ({{ value = ..., "
                          "option = \"{}\" }})",
                          e.text, e.text));
    if (is_word_option_name(def, e.text))
      fail(e, fmt::format("word option '{}' can only be compared in a condition ('{} == {}')", e.text, e.text,
                          find_option(def, e.text)->choices.front()));
    if (s_.tensors && s_.bindings && s_.bindings->count(e.text)) {
      e.tensor = true;
      e.holds_branch = s_.bindings->at(e.text)->holds_branch;
      s_.used->insert(e.text);
      return;
    }
    if (stream) fail(e, fmt::format("stream '{}' can only be used in a rule or the output head", e.text));
    unknown(e, "name");
  }

  void unknown(const Expr& e, const char* what) {
    std::vector<std::string> known(kSizes.begin(), kSizes.end());
    for (const auto& [name, value] : s_.def->constants) known.push_back(name);
    for (const OptionDeclaration& option : s_.def->options) known.push_back(option.key);
    if (s_.tensors) {
      known.insert(known.end(), s_.def->streams.begin(), s_.def->streams.end());
      if (s_.bindings)
        for (const auto& [name, value] : *s_.bindings) known.push_back(name);
      known.insert(known.end(), {"N", "U", "F", "attend", "history_sum", "history_mean", "mix_fractions"});
    }
    known.insert(known.end(), {"sqrt", "exp", "log", "floor", "min", "max", "mod", "if"});
    const std::string nearest = nearest_name(e.text, known);
    fail(e, fmt::format("unknown {} '{}'{}", what, e.text,
                        nearest.empty() ? "" : fmt::format("; did you mean '{}'?", nearest)));
  }

  void call(Expr& e) {
    if (e.text == "N" || e.text == "U" || e.text == "F") return tensor_call(e);
    if (e.text == "attend") return attend_call(e);
    if (e.text == "history_sum" || e.text == "history_mean") return history_call(e);
    if (e.text == "mix_fractions") return mix_call(e);
    if (!is_function(e.text)) unknown(e, "function");
    if (static_cast<int>(e.args.size()) != arity(e.text))
      fail(e, fmt::format("{}() takes {} argument(s), not {}", e.text, arity(e.text), e.args.size()));
    for (std::size_t i = 0; i < e.args.size(); ++i) {
      if (e.text == "if" && i == 0)
        condition(e.args[i]);
      else
        constant(e.args[i]);
    }
  }

  void tensor_call(Expr& e) {
    if (e.args.size() != 1) fail(e, fmt::format("{}(...) takes one tensor, not {}", e.text, e.args.size()));
    if (e.text == "F" && !s_.branch)
      fail(e, "F (the branch) can only be used in a [[sublayer]] rule, not in the output head");
    if (!s_.tensors) fail(e, fmt::format("{}(...) is a tensor; expected a constant expression here", e.text));
    tensor(e.args[0]);
    inherit(e);
    if (e.text == "F") {
      if (++s_.branches > 1) fail(e, "F is used a second time; a rule uses the branch F exactly once");
      e.holds_branch = true;
    }
  }

  // attend(STREAM, e) or attend(STREAM, e, q): attention over depth, reading the stream's values at
  // every earlier state and this sublayer's input, then the tensor e; q, a constant, is every entry
  // of the pseudo-query at init (default 0).
  void attend_call(Expr& e) {
    if (!s_.tensors) fail(e, "attend(...) is a tensor; expected a constant expression here");
    if (!s_.branch)
      fail(e,
           "attend(...) can only be used in a [[sublayer]] rule, not in the output head; keep the "
           "final read in a stream and name that stream in the output");
    if (e.args.size() != 2 && e.args.size() != 3)
      fail(e, fmt::format("attend(...) takes a stream, a tensor and an optional constant query, not {} "
                          "argument(s)",
                          e.args.size()));
    const PlacementDefinition& def = *s_.def;
    const Expr& stream = e.args[0];
    if (stream.kind != ExprKind::name ||
        std::find(def.streams.begin(), def.streams.end(), stream.text) == def.streams.end())
      fail(stream,
           "attend's first argument is a stream name: the history it reads is that stream's values "
           "at every earlier state");
    check(e.args[0]);
    tensor(e.args[1]);
    if (e.args.size() == 3) constant(e.args[2]);
    inherit(e);
  }

  // history_sum(STREAM), history_mean(STREAM): the fixed-weight reads of the stream's member states
  // among 0 .. l (docs/placement-files.md, "Reading a history").
  void history_call(Expr& e) {
    if (!s_.tensors) fail(e, fmt::format("{}(...) is a tensor; expected a constant expression here", e.text));
    if (!s_.branch)
      fail(e, fmt::format("{}(...) can only be used in a [[sublayer]] rule, not in the output head; keep the "
                          "final read in a stream and name that stream in the output",
                          e.text));
    const PlacementDefinition& def = *s_.def;
    if (e.args.size() != 1 || e.args[0].kind != ExprKind::name ||
        std::find(def.streams.begin(), def.streams.end(), e.args[0].text) == def.streams.end())
      fail(e, fmt::format("{}(...) takes one stream name: the history it reads is that stream's values at "
                          "its member states",
                          e.text));
    check(e.args[0]);
    inherit(e);
  }

  // mix_fractions(e, m, weight): a fixed linear map of the m width fractions of tensor e; weight, a
  // constant expression in fraction_out and fraction_in, is evaluated per pair (docs/placement-files.md,
  // "Slicing the width").
  void mix_call(Expr& e) {
    if (!s_.tensors) fail(e, "mix_fractions(...) is a tensor; expected a constant expression here");
    if (e.args.size() != 3)
      fail(e,
           fmt::format("mix_fractions(...) takes a tensor, a fraction count m and a weight in fraction_out "
                       "and fraction_in, not {} argument(s)",
                       e.args.size()));
    tensor(e.args[0]);
    constant(e.args[1]);
    const bool outer = s_.fractions;
    s_.fractions = true;
    constant(e.args[2]);
    s_.fractions = outer;
    inherit(e);
  }

  void binary(Expr& e) {
    for (Expr& a : e.args) check(a);
    const bool left = e.args[0].tensor, right = e.args[1].tensor;
    if (is_condition(e.args[0]) || is_condition(e.args[1]))
      fail(e, fmt::format("a condition cannot be an operand of '{}'", e.text));
    if ((e.text == "+" || e.text == "-") && left != right)
      fail(e,
           fmt::format("'{}' between a tensor and a constant; scale the tensor instead ('c * x')", e.text));
    if (e.text == "*" && left && right)
      fail(e, "a product of two tensors; one side of '*' must be a constant");
    if (e.text == "/" && right) fail(e, "division by a tensor; the right side of '/' must be a constant");
    if (e.text == "^" && (left || right)) fail(e, "'^' takes constants only");
    inherit(e);
  }

  void compare(Expr& e) {
    const PlacementDefinition& def = *s_.def;
    const auto word_side = [&](const Expr& a) {
      return a.kind == ExprKind::name &&
             (a.text == "kind" || a.text == "block_kind" || is_word_option_name(def, a.text));
    };
    if (!word_side(e.args[0]) && !word_side(e.args[1])) {
      for (Expr& a : e.args) constant(a);
      return;
    }
    const Expr& subject = word_side(e.args[0]) ? e.args[0] : e.args[1];
    const Expr& word = word_side(e.args[0]) ? e.args[1] : e.args[0];
    std::vector<std::string> words = subject.text == "kind" ? std::vector<std::string>{"attn", "ffn"}
                                     : subject.text == "block_kind"
                                         ? std::vector<std::string>{"attn_ffn", "ffn", "attn"}
                                         : find_option(def, subject.text)->choices;
    if (word.kind != ExprKind::name || std::find(words.begin(), words.end(), word.text) == words.end()) {
      const std::string nearest = word.kind == ExprKind::name ? nearest_name(word.text, words) : "";
      fail(word, fmt::format("{} is compared with one of {}{}", subject.text, fmt::join(words, ", "),
                             nearest.empty() ? "" : fmt::format("; did you mean '{}'?", nearest)));
    }
    if (e.text != "==" && e.text != "!=")
      fail(e, fmt::format("{} is compared with == or != only", subject.text));
  }

  Scope& s_;
};

// Each constant's depth with the constants it uses written out, into def.constant_depths, and the
// check for cycles. Each constant is walked once (constants may share others: a walk per use would
// be exponential), and a walk stops at kMaxDepth levels, so its own recursion is bounded too.
class ConstantDepths {
 public:
  explicit ConstantDepths(PlacementDefinition& def) : def_(def) {}

  int of(const std::string& name, int above) {
    if (const auto known = def_.constant_depths.find(name); known != def_.constant_depths.end())
      return known->second;
    path_.push_back(name);
    const int depth = walk(def_.constants.at(name), above);
    path_.pop_back();
    return def_.constant_depths[name] = depth;
  }

 private:
  int walk(const Expr& e, int above) {
    if (above >= kMaxDepth) throw ExprError(e.origin, e.offset, depth_message());
    int depth = 1;
    if (e.kind == ExprKind::name && def_.constants.count(e.text)) {
      if (std::find(path_.begin(), path_.end(), e.text) != path_.end())
        throw ExprError(e.origin, e.offset,
                        fmt::format("constant '{}' depends on itself ({} -> {})", e.text,
                                    fmt::join(path_, " -> "), e.text));
      depth = 1 + of(e.text, above + 1);
    }
    for (const Expr& a : e.args) depth = std::max(depth, 1 + walk(a, above + 1));
    return depth;
  }

  PlacementDefinition& def_;
  std::vector<std::string> path_;
};

// The outermost + or - on the path from e down to F, bindings looked through (the format's rule 2).
Expr* find_sum(Expr& e, const std::map<std::string, Expr*>& bindings) {
  if (!e.holds_branch) return nullptr;
  if (e.kind == ExprKind::binary && (e.text == "+" || e.text == "-")) return &e;
  if (e.kind == ExprKind::name)
    return bindings.count(e.text) ? find_sum(*bindings.at(e.text), bindings) : nullptr;
  for (Expr& a : e.args) {
    if (a.holds_branch) return find_sum(a, bindings);
  }
  return nullptr;
}

void check_rule(PlacementDefinition& def, SublayerEntry& entry);

// x <- x + update as the whole rule, for every entry: the exact stream decomposition applies.
bool is_additive(const PlacementDefinition& def) {
  if (def.streams.size() != 1) return false;
  return std::all_of(def.sublayers.begin(), def.sublayers.end(), [&](const SublayerEntry& entry) {
    if (entry.rule.size() != 1 || entry.rule[0].is_binding || !entry.update_name.empty()) return false;
    const Expr& root = entry.rule[0].values[0];
    return root.kind == ExprKind::binary && root.text == "+" && root.marked_sum &&
           root.args[0].kind == ExprKind::name && root.args[0].text == def.streams[0];
  });
}

// The sizes an expression uses, directly or through other constants: the depth unit of a constant's
// formula (docs/placement-files.md, "[constants]"). Remembered per constant, as constants share others.
struct SizesUsed {
  bool blocks = false, sublayers = false;
};

SizesUsed sizes_used(const PlacementDefinition& def, const Expr& e, std::map<std::string, SizesUsed>& known) {
  SizesUsed used;
  if (e.kind == ExprKind::name) {
    used.blocks = e.text == "B" || e.text == "b";
    used.sublayers = e.text == "S" || e.text == "l";
    if (const auto named = def.constants.find(e.text); named != def.constants.end()) {
      auto at = known.find(e.text);
      if (at == known.end()) at = known.emplace(e.text, sizes_used(def, named->second, known)).first;
      used.blocks |= at->second.blocks, used.sublayers |= at->second.sublayers;
    }
  }
  for (const Expr& a : e.args) {
    const SizesUsed inner = sizes_used(def, a, known);
    used.blocks |= inner.blocks, used.sublayers |= inner.sublayers;
  }
  return used;
}

std::string inferred_unit(const PlacementDefinition& def, const Expr& e,
                          std::map<std::string, SizesUsed>& known) {
  const SizesUsed used = sizes_used(def, e, known);
  if (used.blocks && used.sublayers) return "blocks and sublayers";
  return used.blocks ? "blocks" : (used.sublayers ? "sublayers" : "-");
}
}  // namespace

const OptionDeclaration* find_option(const PlacementDefinition& def, std::string_view key) {
  for (const OptionDeclaration& option : def.options) {
    if (option.key == key) return &option;
  }
  return nullptr;
}

bool is_number_option_name(const PlacementDefinition& def, std::string_view name) {
  const OptionDeclaration* option = find_option(def, name);
  return option && !option->is_word() && option->default_value;
}

bool is_word_option_name(const PlacementDefinition& def, std::string_view name) {
  const OptionDeclaration* option = find_option(def, name);
  return option && option->is_word();
}

void check_definition(PlacementDefinition& def) {
  Scope constants{&def};
  Checker checker(constants);
  ConstantDepths depths(def);
  for (auto& [name, e] : def.constants) {
    depths.of(name, 0);
    checker.constant(e);
  }
  std::map<std::string, SizesUsed> sizes;
  for (auto& [name, e] : def.constants) {
    ConstantRecord& record = def.constant_records[name];
    if (record.unit.empty()) record.unit = inferred_unit(def, e, sizes);
  }
  for (auto& gain : def.init_gains)
    if (gain) checker.constant(*gain);
  for (auto& scale : def.learning_rate_scales)
    if (scale) checker.constant(*scale);
  for (Requirement& requirement : def.requirements) checker.condition(requirement.condition);
  for (auto& [stream, member] : def.history_members) {
    checker.condition(member);
    const bool attended =
        std::any_of(def.sublayers.begin(), def.sublayers.end(), [&](const SublayerEntry& entry) {
          return std::any_of(entry.rule.begin(), entry.rule.end(), [&](const Statement& st) {
            return std::any_of(st.values.begin(), st.values.end(),
                               [&](const Expr& e) { return reads_history_of(e, stream); });
          });
        });
    if (!attended)
      throw ExprError(
          member.origin, member.offset,
          fmt::format("[history] {}: no rule reads {}'s history; write attend({}, ...), history_sum({}) or "
                      "history_mean({}) in a rule, or remove the entry",
                      stream, stream, stream, stream, stream));
  }
  for (SublayerEntry& entry : def.sublayers) {
    if (entry.when) checker.condition(*entry.when);
    for (auto* e : {&entry.score_scale, &entry.ffn_hidden_scale, &entry.skip_gain})
      if (*e) checker.constant(**e);
    check_rule(def, entry);
  }
  Scope head{&def, true, false};
  Checker(head).tensor(def.output);
  def.additive = is_additive(def);
}

namespace {
void check_targets(const PlacementDefinition& def, const Statement& st, std::set<std::string>& assigned) {
  for (std::size_t t = 0; t < st.targets.size(); ++t) {
    const std::string& name = st.targets[t];
    if (std::find(def.streams.begin(), def.streams.end(), name) == def.streams.end()) {
      const std::string nearest = nearest_name(name, def.streams);
      throw ExprError(st.values[0].origin, st.target_offsets[t],
                      fmt::format("'{}' is not a stream (streams: {}){}", name, fmt::join(def.streams, ", "),
                                  nearest.empty() ? "" : fmt::format("; did you mean '{}'?", nearest)));
    }
    if (!assigned.insert(name).second)
      throw ExprError(st.values[0].origin, st.target_offsets[t],
                      fmt::format("stream '{}' is assigned twice in one rule", name));
  }
}

void check_binding_name(const PlacementDefinition& def, const Statement& st,
                        const std::map<std::string, Expr*>& bindings) {
  const std::string& name = st.targets[0];
  const bool taken = is_reserved(name) || def.constants.count(name) || bindings.count(name) ||
                     std::find(def.streams.begin(), def.streams.end(), name) != def.streams.end();
  if (taken)
    throw ExprError(
        st.values[0].origin, st.offset,
        fmt::format("'{}' is already a stream, constant, binding or reserved name; choose another", name));
}

void mark_update(SublayerEntry& entry, const std::map<std::string, Expr*>& bindings, const Origin* origin) {
  if (!entry.update_name.empty() || !entry.sum_name.empty()) {
    for (const std::string* name : {&entry.update_name, &entry.sum_name}) {
      if (!bindings.count(*name))
        throw ExprError(origin, 0,
                        fmt::format("update and sum name two bindings of the rule; '{}' is not one", *name));
    }
    if (!bindings.at(entry.update_name)->holds_branch)
      throw ExprError(origin, 0, fmt::format("the update '{}' does not depend on F", entry.update_name));
    return;
  }
  for (std::size_t s = 0; s < entry.rule.size(); ++s) {
    Statement& st = entry.rule[s];
    if (st.is_binding) continue;
    for (std::size_t t = 0; t < st.values.size(); ++t) {
      if (!st.values[t].holds_branch) continue;
      entry.marked_statement = static_cast<int>(s), entry.marked_target = static_cast<int>(t);
      if (Expr* sum = find_sum(st.values[t], bindings)) sum->marked_sum = true;
      return;
    }
  }
  throw ExprError(origin, 0, "no stream is assigned a value that depends on F: F's output would be lost");
}

void check_rule(PlacementDefinition& def, SublayerEntry& entry) {
  std::map<std::string, Expr*> bindings;
  std::set<std::string> used, assigned;
  Scope scope{&def, true, true, &bindings, &used};
  Checker checker(scope);
  const Origin* origin = entry.rule.front().values.front().origin;
  bool assigns = false;
  for (Statement& st : entry.rule) {
    for (Expr& value : st.values) checker.tensor(value);
    if (st.is_binding) {
      check_binding_name(def, st, bindings);
      bindings[st.targets[0]] = &st.values[0];
    } else {
      check_targets(def, st, assigned);
      assigns = true;
    }
  }
  if (!assigns) throw ExprError(origin, 0, "the rule assigns no stream; write 'x <- ...'");
  if (scope.branches == 0)
    throw ExprError(origin, 0, "F (the branch) is never used; a rule uses F exactly once");
  for (const auto& [name, value] : bindings) {
    if (!used.count(name))
      throw ExprError(value->origin, value->offset, fmt::format("binding '{}' is never used", name));
  }
  mark_update(entry, bindings, origin);
}
}  // namespace

}  // namespace gradflow::placement
