// An option declaration: a setting with its flag, help, default and allowed values, from which
// the CLI flag, the validation and the documents' fields are derived. Placements declare theirs in
// their files (PlacementOption, architecture.hpp); branch ops in their table row (branch_op.hpp).
#pragma once
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradflow/config.hpp"

namespace gradflow {

// What gradflow does when an option is given but no selected placement declares it.
enum class UnusedOption {
  ignore,  // say nothing
  warn,    // warn that it is ignored, and run
  refuse,  // refuse the run; when some selected placement declares it, warn for each one that does not
};

// The interval a number option's value must lie in, as a placement file writes it ("[0, 1]",
// "(0, inf)"); NaN is never inside.
struct NumberRange {
  double low = -std::numeric_limits<double>::infinity();
  double high = std::numeric_limits<double>::infinity();
  bool low_closed = false, high_closed = false;
  bool contains(double value) const;
  // What the error says a value must do: "be finite", "be positive and finite", "lie in [0, 1]".
  std::string requirement() const;
};

// A setting of a placement (--alpha, --keel-variant, ...), declared in its placement file
// ([options.KEY], docs/placement-files.md) next to the constants it feeds. The CLI flags,
// validate_options(), the JSON documents, `archs` and `check` are derived from these declarations;
// a value given by the user sits in ModelConfig::options under `key`. Several placements may
// declare the same option (the same key and flag); it is one flag.
struct PlacementOption {
  std::string_view key;   // ModelConfig::options key and JSON key, e.g. "mix_ratio"
  std::string_view flag;  // e.g. "--mix-ratio"
  std::string_view help;  // the flag's --help text
  // The value the placement uses when the flag is not given, or nullopt when that depends on the
  // placement (a paper's constant); then `default_text` says so, in --help and in a sweep's model.
  std::optional<OptionValue> default_value;
  std::string_view default_text;
  std::vector<std::string_view> choices;  // the values of a word option; empty: a number option
  NumberRange range;                      // a number option's allowed values
  std::string_view fix;                   // the advice ending the error for a value outside range or choices
  std::string_view defined_at;            // its [options.KEY] table's "path:line:column", for errors
  UnusedOption when_unused = UnusedOption::warn;
  std::string_view sets;  // what it sets, for the refusal: "the skip weight" (refuse only)
  bool in_run_config =
      false;  // also in each run's "config" (and compared by `check`); else in constants only
  bool in_sweep_model = false;  // in a sweep manifest's "model" (so a resumed sweep must agree on it)
  // Every value a run accepts is a whole number (--experts; a placement file's [[requires]]
  // floor(KEY) == KEY). The flag still reads a number: its rule refuses a fraction, with its own
  // message; this tells the Python module's type check (cli::option_table) to want an int.
  bool whole = false;
  bool is_word() const { return !choices.empty(); }
  std::string shown_default() const;  // default_value as text, else default_text ("0.25", "paper's constant")
};

// Throws InputError naming the flag and the value when `value` breaks the option's rule (a
// number's range, a word's choices), or std::logic_error when it is of the other type.
void check_option_value(const PlacementOption& option, const OptionValue& value);

}  // namespace gradflow
