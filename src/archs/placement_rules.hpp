// A placement file's parsed definition, its static checks, the evaluation of its constants and
// conditions, and the sublayer graphs it builds (docs/placement-files.md).
#pragma once
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gradflow/architecture.hpp"
#include "placement_expr.hpp"

namespace gradflow::placement {

// One [[sublayer]] entry: a condition, a rule and its branch options.
struct SublayerEntry {
  const Origin* table = nullptr;  // the entry's first key, for errors about the whole entry
  std::optional<Expr> when;
  std::string rule_text;
  std::vector<Statement> rule;
  QkvNorm qkv_norm = QkvNorm::none;
  std::optional<Expr> score_scale, ffn_hidden_scale, skip_gain;
  std::string update_name, sum_name;  // named update and sum (both or neither)
  // The assignment statement and target whose value is the marked stream (see the format's
  // "update and sum"), filled by check_definition.
  int marked_statement = -1, marked_target = -1;
};

// One [options.KEY] table; the PlacementOption built from it points into these strings.
struct OptionDeclaration {
  std::string key, flag, help, default_text, fix, sets, at;  // at: "path:line:column" of the table
  std::optional<OptionValue> default_value;
  std::vector<std::string> choices;  // a word option's values
  NumberRange range;
  UnusedOption when_unused = UnusedOption::warn;
  bool in_run_config = false, in_sweep_model = false;
  bool is_word() const { return !choices.empty(); }
};

// What config.constants records for a named constant besides its value (docs: "[constants]").
struct ConstantRecord {
  std::string option;   // a number option whose given value replaces the constant, or empty
  std::string formula;  // the recorded formula when the option is not given
  std::string unit;     // stated, or inferred from the names the expression uses
};

// One [[requires]] entry: a condition the run's sizes must meet, and what to say when they do not.
struct Requirement {
  Expr condition;
  std::string message;
};

struct PlacementDefinition {
  std::string path, text, hash, id_at;  // id_at: "path:line:column" of the id
  std::string id, citation, expected_growth, update_rule, final_norm, output_text, provisional_note;
  std::vector<std::string> aliases, streams;
  std::map<std::string, Expr> constants;
  std::map<std::string, ConstantRecord> constant_records;
  std::vector<OptionDeclaration> options;
  bool built_in = false;  // compiled into the binary (data/placements/builtins): source "built-in"
  std::array<std::optional<Expr>, 6> init_gains;  // by WeightMatrix
  // [learning_rate_scale]: --update's multiplier on --lr per sublayer, for sgd and adam (kUpdateRules)
  std::array<std::optional<Expr>, 2> learning_rate_scales;
  std::vector<SublayerEntry> sublayers;
  // [history]: per stream read with attend, the condition (at sublayer l's position) under which
  // state l's value is one of the history's sources; a stream not named here keeps every state.
  std::map<std::string, Expr> history_members;
  std::vector<Requirement> requirements;
  Expr output;
  bool unit_norm_weights = false;
  bool additive = false;  // inferred by check_definition
  // Each constant's depth with the constants it uses written out (check_definition; kMaxDepth).
  std::map<std::string, int> constant_depths;
  std::deque<Origin> origins;  // stable storage for every Expr's origin
};

// attend, history_sum and history_mean: the calls that read the history of the stream named first.
inline bool is_history_read(std::string_view function) {
  return function == "attend" || function == "history_sum" || function == "history_mean";
}

// The static checks (names, types, F once, targets, bindings, constant cycles); fills the marked
// update/sum, `additive` and the inferred units of the constants. Throws ExprError.
void check_definition(PlacementDefinition& def);

// The declared option `key`, or nullptr.
const OptionDeclaration* find_option(const PlacementDefinition& def, std::string_view key);
// A number option with a default, usable by its key in expressions; a word option, in conditions.
bool is_number_option_name(const PlacementDefinition& def, std::string_view name);
bool is_word_option_name(const PlacementDefinition& def, std::string_view name);

// Everything the evaluation of one sublayer depends on.
struct Position {
  const ModelConfig* config = nullptr;
  int sublayer = 0, block = 0;
  SublayerKind kind = SublayerKind::attn;
};
Position position_of(const ModelConfig& config, int sublayer);  // sublayer = S: the output head's

// Values of constant expressions and conditions at one position; named constants are cached.
class ConstantEvaluator {
 public:
  ConstantEvaluator(const PlacementDefinition& def, const Position& at) : def_(def), at_(at) {}
  // Throws ExprError when the value is NaN or infinite.
  double value(const Expr& e);
  bool holds(const Expr& e);
  // mix_fractions's weight: the values of fraction_out and fraction_in while it is evaluated.
  void set_fraction_pair(int out, int in) { fraction_out_ = out, fraction_in_ = in; }
  int width() const { return at_.config->width; }

 private:
  double evaluate(const Expr& e);
  double call(const Expr& e);
  double named(const Expr& e);
  std::string word_value(const std::string& subject) const;  // kind, block_kind or a word option
  const PlacementDefinition& def_;
  Position at_;
  std::map<std::string, double> cache_;
  int fraction_out_ = -1, fraction_in_ = -1;
};

// The first entry whose `when` holds; throws ExprError naming the sublayer when none does.
const SublayerEntry& select_entry(const PlacementDefinition& def, ConstantEvaluator& values,
                                  const Position& at);
void build_sublayer_graph(const PlacementDefinition& def, SublayerGraph& g, const Position& at);
void build_output_graph(const PlacementDefinition& def, SublayerGraph& g, const Position& at);

}  // namespace gradflow::placement

namespace gradflow {
// The Architecture of a checked definition (placement_architecture.cpp); `def` must outlive it.
Architecture placement_architecture(const placement::PlacementDefinition& def);
}  // namespace gradflow
