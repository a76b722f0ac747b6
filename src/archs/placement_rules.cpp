// Evaluation of a placement file's constants and conditions, and the sublayer graphs its rules
// build, node for node as docs/placement-files.md ("Meaning of each construct") states.
#include "placement_rules.hpp"

#include <fmt/format.h>

#include <cmath>

namespace gradflow::placement {

Position position_of(const ModelConfig& config, int sublayer) {
  const int at = std::min(sublayer, config.sublayers() - 1);  // the output head: the last sublayer's
  return {&config, at, config.block_of(at), config.sublayer_kind(at)};
}

double ConstantEvaluator::value(const Expr& e) {
  const double v = evaluate(e);
  if (!std::isfinite(v)) {
    throw ExprError(e.origin, e.offset,
                    fmt::format("evaluates to {} (at S = {}, B = {}, l = {}); expected a finite value",
                                std::isnan(v) ? "NaN" : (v > 0 ? "infinity" : "-infinity"),
                                at_.config->sublayers(), at_.config->blocks, at_.sublayer));
  }
  return v;
}

double ConstantEvaluator::evaluate(const Expr& e) {
  switch (e.kind) {
    case ExprKind::number:
      return e.number;
    case ExprKind::name:
      return named(e);
    case ExprKind::call:
      return call(e);
    case ExprKind::negate:
      return -evaluate(e.args[0]);
    case ExprKind::binary:
      break;
    default:
      throw ExprError(e.origin, e.offset, "expected a constant expression");
  }
  const double a = evaluate(e.args[0]), b = evaluate(e.args[1]);
  if (e.text == "+") return a + b;
  if (e.text == "-") return a - b;
  if (e.text == "*") return a * b;
  if (e.text == "/") return a / b;
  return std::pow(a, b);
}

double ConstantEvaluator::named(const Expr& e) {
  const ModelConfig& c = *at_.config;
  if (e.text == "S") return c.sublayers();
  if (e.text == "B") return c.blocks;
  if (e.text == "l") return at_.sublayer;
  if (e.text == "b") return at_.block;
  if (e.text == "d") return c.width;
  if (e.text == "T") return c.seq;
  if (e.text == "heads") return c.heads;
  if (e.text == "fraction_out") return fraction_out_;  // only inside mix_fractions's weight (checked)
  if (e.text == "fraction_in") return fraction_in_;
  // A constant bound to an option, or a number option used by its key: the value given with its
  // flag first (docs/placement-files.md, "[constants]" and "[options.KEY]").
  const auto record = def_.constant_records.find(e.text);
  const std::string& option = record != def_.constant_records.end() ? record->second.option : e.text;
  if (const auto given = c.number_option(option); given && find_option(def_, option)) return *given;
  if (!def_.constants.count(e.text)) return std::get<double>(*find_option(def_, e.text)->default_value);
  if (const auto cached = cache_.find(e.text); cached != cache_.end()) return cached->second;
  const double v = value(def_.constants.at(e.text));  // its own position on NaN
  cache_[e.text] = v;
  return v;
}

double ConstantEvaluator::call(const Expr& e) {
  if (e.text == "if") return holds(e.args[0]) ? evaluate(e.args[1]) : evaluate(e.args[2]);
  const double a = evaluate(e.args[0]);
  if (e.text == "sqrt") return std::sqrt(a);
  if (e.text == "exp") return std::exp(a);
  if (e.text == "log") return std::log(a);
  if (e.text == "floor") return std::floor(a);
  const double b = evaluate(e.args[1]);
  if (e.text == "min") return std::min(a, b);
  if (e.text == "max") return std::max(a, b);
  return std::fmod(a, b);
}

bool ConstantEvaluator::holds(const Expr& e) {
  if (e.kind == ExprKind::logical_and) return holds(e.args[0]) && holds(e.args[1]);
  if (e.kind == ExprKind::logical_or) return holds(e.args[0]) || holds(e.args[1]);
  if (e.kind == ExprKind::logical_not) return !holds(e.args[0]);
  const Expr &left = e.args[0], &right = e.args[1];
  const auto is_word = [&](const Expr& a) {
    return a.kind == ExprKind::name &&
           (a.text == "kind" || a.text == "block_kind" || is_word_option_name(def_, a.text));
  };
  if (is_word(left) || is_word(right)) {
    const Expr& subject = is_word(left) ? left : right;
    const std::string& word = is_word(left) ? right.text : left.text;
    return (word_value(subject.text) == word) == (e.text == "==");
  }
  const double a = value(left), b = value(right);
  if (e.text == "==") return a == b;
  if (e.text == "!=") return a != b;
  if (e.text == "<") return a < b;
  if (e.text == "<=") return a <= b;
  if (e.text == ">") return a > b;
  return a >= b;
}

std::string ConstantEvaluator::word_value(const std::string& subject) const {
  if (subject == "kind") return at_.kind == SublayerKind::attn ? "attn" : "ffn";
  if (subject == "block_kind") {
    const BlockKind block = at_.config->block;
    return block == BlockKind::attn_ffn ? "attn_ffn" : (block == BlockKind::ffn ? "ffn" : "attn");
  }
  const OptionDeclaration& option = *find_option(def_, subject);  // a word option (checked)
  return at_.config->word_option(subject).value_or(std::get<std::string>(*option.default_value));
}

const SublayerEntry& select_entry(const PlacementDefinition& def, ConstantEvaluator& values,
                                  const Position& at) {
  for (const SublayerEntry& entry : def.sublayers) {
    if (!entry.when || values.holds(*entry.when)) return entry;
  }
  const SublayerEntry& last = def.sublayers.back();
  throw ExprError(
      last.table, 0,
      fmt::format("no [[sublayer]] entry's 'when' holds for sublayer l = {} (b = {}, kind {}) at S = {}; "
                  "add a last entry without 'when'",
                  at.sublayer, at.block, at.kind == SublayerKind::attn ? "attn" : "ffn",
                  at.config->sublayers()));
}

namespace {
// Builds the nodes of one rule or output head; records the marked update and sum.
class GraphBuilder {
 public:
  GraphBuilder(SublayerGraph& g, ConstantEvaluator& values, const PlacementDefinition& def,
               const SublayerEntry* entry)
      : g_(g), values_(values), def_(def), entry_(entry) {}

  Value build(const Expr& e) {
    switch (e.kind) {
      case ExprKind::name:
        return name(e);
      case ExprKind::call:
        return call(e);
      case ExprKind::negate:
        return g_.scale(build(e.args[0]), -1.0);
      default:
        return binary(e);
    }
  }

  std::map<std::string, const Expr*> binding_exprs;  // the rule's bindings, built when first used
  std::map<std::string, Value> bindings;
  std::optional<Value> update, sum;

 private:
  Value name(const Expr& e) {
    if (const auto bound = bindings.find(e.text); bound != bindings.end()) return bound->second;
    if (const auto pending = binding_exprs.find(e.text); pending != binding_exprs.end())
      return bindings[e.text] = build(*pending->second);  // a binding is built at its first use
    const auto stream = std::find(def_.streams.begin(), def_.streams.end(), e.text);
    return g_.input(static_cast<int>(stream - def_.streams.begin()));
  }

  Value call(const Expr& e) {
    const Value arg = build(e.args[0]);
    if (e.text == "N") return g_.norm(arg);
    if (e.text == "U") return g_.unit(arg);
    if (e.text == "history_sum" || e.text == "history_mean")  // arg: the input stream whose history is read
      return g_.history_sum(arg, e.text == "history_mean");
    if (e.text == "attend") {  // arg: the input stream whose history is read
      const Value extra = build(e.args[1]);
      return g_.attend(arg, extra, e.args.size() == 3 ? values_.value(e.args[2]) : 0.0);
    }
    if (e.text == "mix_fractions") return mix_fractions(arg, e);
    std::optional<double> score_scale;
    if (entry_->score_scale) score_scale = values_.value(*entry_->score_scale);
    const double hidden_scale = entry_->ffn_hidden_scale ? values_.value(*entry_->ffn_hidden_scale) : 1.0;
    return g_.branch(arg, entry_->qkv_norm, score_scale, hidden_scale);
  }

  Value scaled(Value v, double factor) { return factor == 1.0 ? v : g_.scale(v, factor); }

  // mix_fractions(e, m, weight): m whole, dividing d; weight evaluated per (fraction_out, fraction_in),
  // row-major by output fraction. The identity builds no node, as a scale by 1 does not.
  Value mix_fractions(Value arg, const Expr& e) {
    const double m = values_.value(e.args[1]);
    const int width = values_.width();
    if (!(m >= 1 && m == std::floor(m) && m <= width && width % static_cast<int>(m) == 0))
      throw ExprError(e.args[1].origin, e.args[1].offset,
                      fmt::format("mix_fractions's fraction count m = {} must be a whole number that divides "
                                  "the width d = {}; try a divisor of --width {}",
                                  m, width, width));
    const int fractions = static_cast<int>(m);
    std::vector<double> weights(static_cast<std::size_t>(fractions) * fractions);
    bool identity = true;
    for (int out = 0; out < fractions; ++out) {
      for (int in = 0; in < fractions; ++in) {
        values_.set_fraction_pair(out, in);
        const double w = values_.value(e.args[2]);
        weights[static_cast<std::size_t>(out) * fractions + in] = w;
        identity = identity && w == (out == in ? 1.0 : 0.0);
      }
    }
    values_.set_fraction_pair(-1, -1);
    return identity ? arg : g_.mix_fractions(arg, fractions, std::move(weights));
  }

  Value binary(const Expr& e) {
    const Expr &left = e.args[0], &right = e.args[1];
    if (e.text == "*")
      return left.tensor ? scaled(build(left), values_.value(right))
                         : scaled(build(right), values_.value(left));
    if (e.text == "/") return scaled(build(left), 1.0 / values_.value(right));
    // The operand holding F first, as the built-in recipes build their graphs (the format's
    // "order of construction"): the values are the same either way, the gradients' last bits not.
    const auto right_value = [&] { return e.text == "-" ? g_.scale(build(right), -1.0) : build(right); };
    Value a, b;
    if (right.holds_branch && !left.holds_branch) {
      b = right_value();
      a = build(left);
    } else {
      a = build(left);
      b = right_value();
    }
    const Value total = g_.add(a, b);
    if (e.marked_sum) update = left.holds_branch ? a : b, sum = total;
    return total;
  }

  SublayerGraph& g_;
  ConstantEvaluator& values_;
  const PlacementDefinition& def_;
  const SublayerEntry* entry_;
};
}  // namespace

void build_sublayer_graph(const PlacementDefinition& def, SublayerGraph& g, const Position& at) {
  ConstantEvaluator values(def, at);
  const SublayerEntry& entry = select_entry(def, values, at);
  GraphBuilder builder(g, values, def, &entry);
  std::vector<Value> outputs;
  for (std::size_t s = 0; s < def.streams.size(); ++s) outputs.push_back(g.input(static_cast<int>(s)));
  std::optional<Value> marked;
  for (std::size_t i = 0; i < entry.rule.size(); ++i) {
    const Statement& st = entry.rule[i];
    if (st.is_binding) {
      builder.binding_exprs[st.targets[0]] = &st.values[0];
      continue;
    }
    for (std::size_t t = 0; t < st.targets.size(); ++t) {
      const Value v = builder.build(st.values[t]);
      const auto stream = std::find(def.streams.begin(), def.streams.end(), st.targets[t]);
      outputs[static_cast<std::size_t>(stream - def.streams.begin())] = v;
      if (static_cast<int>(i) == entry.marked_statement && static_cast<int>(t) == entry.marked_target)
        marked = v;
    }
  }
  g.set_outputs(outputs);
  for (const auto& [name, member] : def.history_members) {  // [history]: is state l a source?
    const auto stream = std::find(def.streams.begin(), def.streams.end(), name);
    g.set_history_member(static_cast<int>(stream - def.streams.begin()), values.holds(member));
  }
  if (!entry.update_name.empty()) {
    g.mark_update(builder.bindings.at(entry.update_name), builder.bindings.at(entry.sum_name));
  } else if (builder.update) {
    g.mark_update(*builder.update, *builder.sum);
  } else {
    g.mark_update(*marked, *marked);  // no skip on the path to F: the update is the whole new value
  }
}

void build_output_graph(const PlacementDefinition& def, SublayerGraph& g, const Position& at) {
  ConstantEvaluator values(def, at);
  GraphBuilder builder(g, values, def, nullptr);
  g.set_outputs({builder.build(def.output)});
}

}  // namespace gradflow::placement
