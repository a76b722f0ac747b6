// The expression language of placement files (docs/placement-files.md): constant expressions,
// conditions and update rules, parsed into one tree type. Evaluation and graph building live in
// placement_rules.cpp; TOML reading in placement_file.cpp.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gradflow::placement {

// Limits that keep a hostile or generated file from exhausting the stack or the time
// (docs/placement-files.md, "Limits"); real placements stay far below them.
inline constexpr int kMaxNesting =
    200;  // parentheses, unary '-' and 'not', '^', calls: the parser's recursion
inline constexpr int kMaxDepth =
    1000;  // operations from a value down to a leaf, constants and bindings included
inline constexpr int kMaxTerms = 10000;  // numbers, names, operators and calls in one string

// Where a string of the file starts, to turn an offset inside it into file:line:column.
struct Origin {
  std::string file;
  int line = 0;
  int column = 0;                       // the first character of the string's contents
  bool exact = false;                   // a one-line string without escapes: offsets map to columns
  std::string where(int offset) const;  // "file:line:column"
};

// A syntax or meaning error at a character offset of a string with a known origin.
class ExprError : public std::runtime_error {
 public:
  ExprError(const Origin* origin, int offset, const std::string& what)
      : std::runtime_error(what), origin(origin), offset(offset) {}
  const Origin* origin;
  int offset;
};

enum class ExprKind { number, name, call, negate, binary, compare, logical_and, logical_or, logical_not };

struct Expr {
  ExprKind kind = ExprKind::number;
  double number = 0.0;
  std::string text;  // the name, the function, or the operator: + - * / ^ == != < <= > >=
  std::vector<Expr> args;
  const Origin* origin = nullptr;
  int offset = 0;  // where it starts in its string
  // Levels from here down to a leaf: the parser counts its own string, the checker adds the
  // constants and bindings that names stand for. Every recursive pass goes at most this deep.
  int depth = 1;
  bool tensor = false;        // mentions a stream, a binding, N, U or F (set by the checker)
  bool holds_branch = false;  // depends on F, bindings looked through (set by the checker)
  bool marked_sum = false;    // the sum of docs/placement-files.md's update/sum rule
};

// One statement of a rule: a binding `name = e` or an assignment `a, b <- e1, e2`.
struct Statement {
  bool is_binding = false;
  std::vector<std::string> targets;
  std::vector<int> target_offsets;
  std::vector<Expr> values;
  int offset = 0;
};

// A whole string holding one expression or condition.
Expr parse_expression(std::string_view text, const Origin* origin);
// A whole rule: statements separated by ';' or newlines.
std::vector<Statement> parse_rule(std::string_view text, const Origin* origin);

// The error for an expression deeper than kMaxDepth (the parser's and the checker's).
std::string depth_message();

bool is_function(std::string_view name);  // sqrt exp log floor min max mod if
bool is_reserved(std::string_view name);  // every name a file may not define

}  // namespace gradflow::placement
