// Recursive-descent parser of placement-file expressions and rules (grammar in
// docs/placement-files.md, "Rule grammar" and "Conditions").
#include "placement_expr.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

namespace gradflow::placement {

std::string Origin::where(int offset) const {
  return fmt::format("{}:{}:{}", file, line, exact ? column + offset : column);
}

namespace {
constexpr std::array kFunctions = {"sqrt", "exp", "log", "floor", "min", "max", "mod", "if"};
// clang-format off
constexpr std::array kReserved = {
    "S", "B", "l", "b", "d", "T", "heads", "kind", "block_kind", "attn", "ffn", "attn_ffn",
    "N", "U", "F", "attend", "history_sum", "history_mean", "mix_fractions", "fraction_out", "fraction_in",
    "and", "or", "not"};
// clang-format on

class Parser {
 public:
  Parser(std::string_view text, const Origin* origin) : text_(text), origin_(origin) {}

  Expr condition() { return logical_or(); }

  std::vector<Statement> rule() {
    std::vector<Statement> statements;
    skip_separators();
    while (!at_end()) {
      statements.push_back(statement());
      skip_blanks();
      if (!at_end() && !separator()) fail("expected ';' or a new line between statements");
      skip_separators();
    }
    if (statements.empty()) fail("expected a rule such as 'x <- x + F(N(x))'");
    return statements;
  }

  void expect_end() {
    skip_blanks();
    if (!at_end()) fail(fmt::format("unexpected '{}'", text_[pos_]));
  }

  [[noreturn]] void fail(const std::string& what) const { throw ExprError(origin_, pos_, what); }

 private:
  Statement statement() {
    Statement st;
    skip_blanks();
    st.offset = pos_;
    do {
      skip_blanks();
      st.target_offsets.push_back(pos_);
      st.targets.push_back(identifier("a stream or binding name"));
      skip_blanks();
    } while (accept(","));
    if (accept("<-")) {
      do st.values.push_back(arithmetic());
      while (accept(","));
      if (st.values.size() != st.targets.size()) {
        pos_ = st.offset;
        fail(fmt::format("{} stream(s) assigned but {} expression(s) given", st.targets.size(),
                         st.values.size()));
      }
      return st;
    }
    if (st.targets.size() == 1 && accept("=")) {
      st.is_binding = true;
      st.values.push_back(arithmetic());
      return st;
    }
    fail(st.targets.size() == 1 ? "expected '<-' (assignment) or '=' (binding)" : "expected '<-'");
  }

  // One level of the parser's recursion ('(', a call, unary '-' or 'not', the right side of '^'):
  // every recursive descent takes one, so the nesting limit is counted here only.
  class Nested {
   public:
    explicit Nested(Parser& parser) : parser_(parser) {
      if (++parser_.nesting_ > kMaxNesting)
        parser_.fail(
            fmt::format("more than {} levels of nesting (parentheses, unary '-' or 'not', '^', "
                        "calls); write it with fewer levels, or name parts of it as constants "
                        "or bindings",
                        kMaxNesting));
    }
    ~Nested() { --parser_.nesting_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& parser_;
  };

  Expr logical_or() {
    Expr left = logical_and();
    while (accept_word("or")) left = make(ExprKind::logical_or, "or", std::move(left), logical_and());
    return left;
  }
  Expr logical_and() {
    Expr left = logical_not();
    while (accept_word("and")) left = make(ExprKind::logical_and, "and", std::move(left), logical_not());
    return left;
  }
  Expr logical_not() {
    skip_blanks();
    const int start = pos_;
    if (accept_word("not")) {
      const Nested level(*this);
      Expr e = make(ExprKind::logical_not, "not", logical_not());
      e.offset = start;
      return e;
    }
    return comparison();
  }
  Expr comparison() {
    Expr left = arithmetic();
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (accept(op)) return make(ExprKind::compare, op, std::move(left), arithmetic());
    }
    return left;
  }
  Expr arithmetic() {
    Expr left = term();
    while (true) {
      if (peek_arrow()) return left;
      if (accept("+"))
        left = make(ExprKind::binary, "+", std::move(left), term());
      else if (accept("-"))
        left = make(ExprKind::binary, "-", std::move(left), term());
      else
        return left;
    }
  }
  Expr term() {
    Expr left = unary();
    while (true) {
      if (accept("*"))
        left = make(ExprKind::binary, "*", std::move(left), unary());
      else if (accept("/"))
        left = make(ExprKind::binary, "/", std::move(left), unary());
      else
        return left;
    }
  }
  Expr unary() {
    skip_blanks();
    const int start = pos_;
    if (!peek_arrow() && accept("-")) {
      const Nested level(*this);
      Expr e = make(ExprKind::negate, "-", unary());
      e.offset = start;
      return e;
    }
    Expr base = atom();
    if (!accept("^")) return base;
    const Nested level(*this);
    return make(ExprKind::binary, "^", std::move(base), unary());
  }
  Expr atom();
  Expr number();

  // The operands are moved in, never copied: a braced list would copy the left operand, which in
  // a chain 'a + b + c ...' is everything parsed so far (quadratic in the number of terms).
  Expr make(ExprKind kind, std::string text, Expr first) {
    Expr e = node(kind, std::move(text), first.offset);
    e.args.push_back(std::move(first));
    return finished(std::move(e));
  }
  Expr make(ExprKind kind, std::string text, Expr first, Expr second) {
    Expr e = node(kind, std::move(text), first.offset);
    e.args.reserve(2);
    e.args.push_back(std::move(first));
    e.args.push_back(std::move(second));
    return finished(std::move(e));
  }
  Expr node(ExprKind kind, std::string text, int offset) {
    if (++terms_ > kMaxTerms)
      fail(fmt::format("more than {} numbers, names and operators in one string; shorten it", kMaxTerms));
    Expr e;
    e.kind = kind;
    e.text = std::move(text);
    e.offset = offset;
    e.origin = origin_;
    return e;
  }
  // Sets the node's depth from its operands' and refuses one deeper than kMaxDepth (a chain of
  // operators adds a level per operator without any recursion of the parser).
  Expr finished(Expr e) {
    for (const Expr& a : e.args) e.depth = std::max(e.depth, a.depth + 1);
    if (e.depth > kMaxDepth) fail(depth_message());
    return e;
  }

  std::string identifier(const char* what) {
    skip_blanks();
    const int start = pos_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (pos_ == start || std::isdigit(static_cast<unsigned char>(text_[start]))) {
      pos_ = start;
      fail(fmt::format("expected {}", what));
    }
    return std::string(text_.substr(start, pos_ - start));
  }
  bool accept(std::string_view token) {
    skip_blanks();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += static_cast<int>(token.size());
    return true;
  }
  bool accept_word(std::string_view word) {
    skip_blanks();
    if (text_.substr(pos_, word.size()) != word) return false;
    const std::size_t after = pos_ + word.size();
    if (after < text_.size() &&
        (std::isalnum(static_cast<unsigned char>(text_[after])) || text_[after] == '_'))
      return false;
    pos_ = static_cast<int>(after);
    return true;
  }
  bool peek_arrow() {
    skip_blanks();
    return text_.substr(pos_, 2) == "<-";
  }
  bool separator() { return text_[pos_] == ';' || text_[pos_] == '\n'; }
  void skip_blanks() {
    while (!at_end() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  void skip_separators() {
    skip_blanks();
    while (!at_end() && separator()) ++pos_, skip_blanks();
  }
  bool at_end() const { return pos_ >= static_cast<int>(text_.size()); }

  std::string_view text_;
  const Origin* origin_;
  int pos_ = 0;
  int nesting_ = 0;  // Nested levels open now
  int terms_ = 0;    // nodes made so far
};

Expr Parser::number() {
  const int start = pos_;
  while (!at_end() && (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.')) ++pos_;
  if (!at_end() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (!at_end() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  Expr e = node(ExprKind::number, "", start);
  const char* first = text_.data() + start;
  const char* last = text_.data() + pos_;
  const auto [end, error] = std::from_chars(first, last, e.number);
  if (error != std::errc() || end != last) {
    pos_ = start;
    fail(fmt::format("'{}' is not a number", std::string(first, last)));
  }
  return e;
}

Expr Parser::atom() {
  skip_blanks();
  if (at_end()) fail("expected a value, a name or '(' but the text ends");
  const int start = pos_;
  if (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.') return number();
  if (accept("(")) {
    const Nested level(*this);
    Expr inner = logical_or();
    if (!accept(")")) fail(fmt::format("expected ')' to close the '(' at column offset {}", start + 1));
    return inner;
  }
  Expr e = node(ExprKind::name, identifier("a number, a name or '('"), start);
  if (!accept("(")) return e;
  const Nested level(*this);
  e.kind = ExprKind::call;
  do e.args.push_back(logical_or());
  while (accept(","));
  if (!accept(")")) fail(fmt::format("expected ')' to close {}(", e.text));
  return finished(std::move(e));
}
}  // namespace

Expr parse_expression(std::string_view text, const Origin* origin) {
  Parser parser(text, origin);
  Expr e = parser.condition();
  parser.expect_end();
  return e;
}

std::vector<Statement> parse_rule(std::string_view text, const Origin* origin) {
  return Parser(text, origin).rule();
}

std::string depth_message() {
  return fmt::format(
      "more than {} operations deep (a sum of over {} terms, or constants or bindings that "
      "use each other that deeply); shorten it",
      kMaxDepth, kMaxDepth);
}

bool is_function(std::string_view name) {
  return std::find(kFunctions.begin(), kFunctions.end(), name) != kFunctions.end();
}

bool is_reserved(std::string_view name) {
  return is_function(name) || std::find(kReserved.begin(), kReserved.end(), name) != kReserved.end();
}

}  // namespace gradflow::placement
