#!/usr/bin/python3
"""Independent interpreter of gradflow's placement files, in float64 torch.

Written from docs/placement-files.md alone (never from the C++ loader); [P] cites that page. A file is
parsed with tomllib, its constant expressions, conditions and rules with the small recursive-descent
parser below (the grammar of [P] "Rule grammar"), and `FileStack` builds the placement's stack on an
export's weights with the reference's own ops (gradflow_reference.py: norms, attention, FFN, and issue 19's
gated FFNs, shared key/value heads, rotary embeddings, biases and norm epsilon, read from the export's config
as for a built-in), so gradflow_reference.analyze() computes the same figures as for a built-in.

  /usr/bin/python3 placement_file.py FILE.toml EXPORT.safetensors [-o OUT.json]
"""
import argparse
import json
import math
import re
import sys
import tomllib

import numpy as np
import torch

import gradflow_reference as R

# [P] "Top-level keys" and the reserved names of "Names"
TOP_KEYS = {"id", "citation", "expected_growth", "streams", "output", "update_rule", "final_norm", "aliases",
            "provisional", "unit_norm_weights", "constants", "options", "init_gain", "sublayer", "requires",
            "learning_rate_scale", "history"}
# [P] "[options.KEY]" and the inline-table form of a constant ("[constants]")
OPTION_KEYS = {"help", "default", "default_text", "choices", "range", "fix", "when_unused", "sets", "in_run_config",
               "in_sweep_model"}
CONSTANT_KEYS = {"value", "option", "formula", "unit"}
WHEN_UNUSED = ("warn", "ignore", "refuse")
REQUIRES_KEYS = {"condition", "message"}  # [P] "`[[requires]]`"
SUBLAYER_KEYS = {"when", "rule", "qkv_norm", "score_scale", "ffn_hidden_scale", "skip_gain", "update", "sum"}
RESERVED = set("S B l b d T heads kind block_kind attn ffn attn_ffn N U F attend history_sum history_mean "
               "mix_fractions fraction_out fraction_in sqrt exp log "
               "min max floor "
               "mod if and or not".split())
SIZES = ("S", "B", "d", "T", "heads")
KIND_WORDS = {"attn": "attn", "ffn": "ffn", "attn_ffn": "attn-ffn"}  # [P] Conditions: kind / block_kind values
QKV_NORMS = ("none", "per_head_qkv", "full_qk", "per_head_qk_unit")  # [P] `qkv_norm`
HISTORY_READS = ("attend", "history_sum", "history_mean")  # [P] "Reading a history": the stream named first
TENSOR_FUNCS = ("N", "U", "F", "mix_fractions") + HISTORY_READS
FRACTION_INDICES = ("fraction_out", "fraction_in")  # [P] "Slicing the width": mix_fractions's weight only
CONST_FUNCS = {"sqrt": 1, "exp": 1, "log": 1, "floor": 1, "min": 2, "max": 2, "mod": 2, "if": 3}
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


class FileError(ValueError):
    pass


# ----------------------------------------------------------------------------------------------
# Tokens and syntax tree ([P] "Rule grammar", "Constant expressions", "Conditions")
# ----------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)"
                    r"|(?P<op><-|==|!=|<=|>=|[-+*/^(),=;<>])|(?P<nl>\n))", re.S)


def tokenize(text, arrows):
    """Tokens (kind, text). `arrows`: '<-' is the assignment arrow (rules); elsewhere '<' then '-'. A newline
    ends a statement (token ';') except inside parentheses or after a comma, an operator, '=' or '<-'."""
    out, pos, depth = [], 0, 0
    text = text.rstrip()
    while pos < len(text):
        if text[pos] in " \t\r":
            pos += 1
            continue
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise FileError(f"unexpected character {text[pos]!r} at {pos} in {text!r}")
        kind = m.lastgroup
        tok = m.group(kind)
        if tok == "<-" and not arrows:
            tok, end = "<", m.start(kind) + 1
        else:
            end = m.end()
        pos = end
        depth += (tok == "(") - (tok == ")")
        if kind == "nl" and (depth > 0 or not out or out[-1][1] in (",", "+", "-", "*", "/", "^", "=", "<-", ";")):
            continue
        out.append(("op" if kind == "nl" else kind, ";" if kind == "nl" else tok))
    return out


class Node:
    """One syntax-tree node: kind in num, name, call, neg, bin (op + - * / ^), cmp, and, or, not."""
    __slots__ = ("kind", "op", "args", "value")

    def __init__(self, kind, op=None, args=(), value=None):
        self.kind, self.op, self.args, self.value = kind, op, list(args), value

    def __repr__(self):
        return f"{self.kind}:{self.op or self.value}({', '.join(map(repr, self.args))})"


class Parser:
    def __init__(self, text, arrows=False):
        self.text, self.toks, self.i = text, tokenize(text, arrows), 0

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else (None, None)

    def take(self, want=None):
        tok = self.peek()
        if tok[0] is None or (want is not None and tok[1] != want):
            raise FileError(f"expected {want or 'more'} at token {self.i} of {self.text!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def done(self):
        return self.i >= len(self.toks)

    def end(self):
        if not self.done():
            raise FileError(f"unexpected {self.peek()[1]!r} in {self.text!r}")

    # expr := term (('+' | '-') term)*
    def expr(self):
        node = self.term()
        while self.peek()[1] in ("+", "-"):
            node = Node("bin", self.take()[1], [node, self.term()])
        return node

    def term(self):
        node = self.unary()
        while self.peek()[1] in ("*", "/"):
            node = Node("bin", self.take()[1], [node, self.unary()])
        return node

    def unary(self):
        if self.peek()[1] == "-":
            self.take()
            return Node("neg", args=[self.unary()])
        return self.power()

    def power(self):  # power := atom ('^' unary)?  (right-associative, tighter than unary minus)
        node = self.atom()
        if self.peek()[1] == "^":
            self.take()
            node = Node("bin", "^", [node, self.unary()])
        return node

    def atom(self):
        kind, tok = self.take()
        if kind == "num":
            return Node("num", value=float(tok))
        if tok == "(":
            node = self.expr()
            self.take(")")
            return node
        if kind != "name":
            raise FileError(f"expected a number, a name or '(' in {self.text!r}, found {tok!r}")
        if self.peek()[1] != "(":
            return Node("name", value=tok)
        self.take("(")
        args = [self.cond() if tok == "if" else self.expr()]
        while self.peek()[1] == ",":
            self.take()
            args.append(self.expr())
        self.take(")")
        return Node("call", tok, args)

    # conditions: or > and > not > comparison | '(' condition ')'
    def cond(self):
        node = self.cond_and()
        while self.peek()[1] == "or":
            self.take()
            node = Node("or", args=[node, self.cond_and()])
        return node

    def cond_and(self):
        node = self.cond_not()
        while self.peek()[1] == "and":
            self.take()
            node = Node("and", args=[node, self.cond_not()])
        return node

    def cond_not(self):
        if self.peek()[1] == "not":
            self.take()
            return Node("not", args=[self.cond_not()])
        if self.peek()[1] == "(":  # a parenthesised condition, unless the parenthesis opens an expression
            start = self.i
            try:
                self.take("(")
                node = self.cond()
                self.take(")")
                if self.peek()[1] not in COMPARISONS + ("+", "-", "*", "/", "^"):
                    return node
            except FileError:
                pass
            self.i = start
        lhs = self.expr()
        op = self.take()[1]
        if op not in COMPARISONS:
            raise FileError(f"expected a comparison in {self.text!r}, found {op!r}")
        return Node("cmp", op, [lhs, self.expr()])

    # statement := NAME '=' expr | NAME (',' NAME)* '<-' expr (',' expr)*
    def statements(self):
        out = []
        while not self.done():
            if self.peek()[1] == ";":
                self.take()
                continue
            names = [self.take_name()]
            if self.peek()[1] == "=":
                self.take()
                out.append(("bind", names, [self.expr()]))
            else:
                while self.peek()[1] == ",":
                    self.take()
                    names.append(self.take_name())
                self.take("<-")
                exprs = [self.expr()]
                while self.peek()[1] == ",":
                    self.take()
                    exprs.append(self.expr())
                out.append(("assign", names, exprs))
            if not self.done():
                self.take(";")
        return out

    def take_name(self):
        kind, tok = self.take()
        if kind != "name":
            raise FileError(f"expected a name in {self.text!r}, found {tok!r}")
        return tok


def parse_expr(text):
    p = Parser(str(text))
    node = p.expr()
    p.end()
    return node


def parse_cond(text):
    p = Parser(str(text))
    node = p.cond()
    p.end()
    return node


# ----------------------------------------------------------------------------------------------
# Constant expressions, evaluated in double for one sublayer ([P] "Constant expressions")
# ----------------------------------------------------------------------------------------------
class Where:
    """The sizes of the run and the sublayer being built (l, b, kind) with the file's named constants,
    evaluated lazily in any order (a cycle is an error) and cached."""

    def __init__(self, placement, sizes, l, b, kind, block_kind, options=None):
        self.p, self.sizes, self.l, self.b, self.kind, self.block_kind = placement, sizes, l, b, kind, block_kind
        # [P] `[options.KEY]`: key -> (value, given with its flag); default: no flag given
        self.opts = placement.option_values() if options is None else options
        self.cache, self.busy = {}, set()
        self.fraction = None  # [P] mix_fractions: (fraction_out, fraction_in) while its weight is evaluated

    def constant(self, name):
        if name not in self.cache:
            if name in self.busy:
                raise FileError(f"constant '{name}' depends on itself")
            self.busy.add(name)
            c = self.p.const[name]
            if c.option is not None and self.opts[c.option][1]:  # [P] `option`: the given value when given
                value = float(self.opts[c.option][0])
            elif c.ast is not None:  # else `value`
                value = self.value(c.ast)
            elif c.number is not None:
                value = c.number
            else:  # else the option's default
                value = float(self.p.options[c.option].default)
            if not math.isfinite(value):  # a TOML number may be nan or inf
                raise FileError(f"constant '{name}' is {value}")
            self.cache[name] = value
            self.busy.discard(name)
        return self.cache[name]

    def record(self, name):
        """[P] `[constants]`: {value, formula, unit} of a named constant as config.constants reports it: the
        formula is the option's flag when the option was given, else `formula`, else the expression text; the
        unit is `unit`, else inferred from the names used (a given option's value: "-")."""
        c = self.p.const[name]
        given = c.option is not None and self.opts[c.option][1]
        formula = self.p.options[c.option].flag if given else c.formula if c.formula is not None else c.text
        unit = c.unit if c.unit is not None else "-" if given else depth_unit(self.depth_names(name, set()))
        return {"value": self.constant(name), "formula": formula, "unit": unit}

    def depth_names(self, name, seen):
        """Which of S, B, l, b constant `name` uses in this run, directly or through other constants (a given
        option's value and an option's default use none)."""
        c = self.p.const[name]
        if name in seen or c.ast is None or (c.option is not None and self.opts[c.option][1]):
            return set()
        seen.add(name)
        out = set()
        for n in names_in(c.ast):
            if n in ("S", "B", "l", "b"):
                out.add(n)
            elif n not in SIZES and n in self.p.const:
                out |= self.depth_names(n, seen)
        return out

    def word_option(self, node):
        """The key of a word option the file declares, when `node` names one, else None."""
        if node.kind == "name" and node.value in self.p.options and self.p.options[node.value].is_word:
            return node.value
        return None

    def word(self, node):
        """kind / block_kind / attn / ffn / attn_ffn in a comparison (strings), else None."""
        if node.kind != "name":
            return None
        if node.value == "kind":
            return self.kind
        if node.value == "block_kind":
            return self.block_kind
        return KIND_WORDS.get(node.value)

    def fraction_weights(self, node, d):
        """[P] "Slicing the width": (m, w) for the call mix_fractions(e, m, weight) at this sublayer and width d:
        m a whole number >= 1 dividing d (else an error naming m and d), w[f][g] the weight evaluated once per
        pair with fraction_out = f and fraction_in = g (0-based), a double as any constant."""
        m = self.value(node.args[1])
        if not (m >= 1 and m == math.floor(m) and d % int(m) == 0):
            raise FileError(f"mix_fractions: m = {m:g} is not a whole number >= 1 dividing the width d = {d} "
                            f"(at l = {self.l}): {node!r}")
        m = int(m)
        w = [[0.0] * m for _ in range(m)]
        for f in range(m):
            for g in range(m):
                self.fraction = (f, g)
                try:
                    w[f][g] = self.value(node.args[2])
                finally:
                    self.fraction = None
        return m, w

    def value(self, node):
        v = self._value(node)
        if not math.isfinite(v):
            raise FileError(f"{node!r} is {v} (S = {self.sizes['S']}, B = {self.sizes['B']})")
        return v

    def _value(self, node):
        k = node.kind
        if k == "num":
            return node.value
        if k == "name":
            name = node.value
            if name in SIZES:
                return float(self.sizes[name])
            if name == "l":
                return float(self.l)
            if name == "b":
                return float(self.b)
            if name in FRACTION_INDICES:  # [P] mix_fractions: f and g inside its weight; nothing elsewhere
                if self.fraction is None:
                    raise FileError(f"'{name}' is used outside the weight of mix_fractions(e, m, weight)")
                return float(self.fraction[FRACTION_INDICES.index(name)])
            if name in self.p.constants:
                return self.constant(name)
            opt = self.p.options.get(name)
            if opt is not None and not opt.is_word and opt.default is not None:  # [P] by its key, with a default
                return float(self.opts[name][0])
            raise FileError(f"unknown name '{name}' in a constant expression")
        if k == "neg":
            return -self.value(node.args[0])
        if k == "bin":
            return _arith(node.op, self.value(node.args[0]), self.value(node.args[1]))
        if k == "call":
            return self.call(node)
        raise FileError(f"a condition where a number is expected: {node!r}")

    def call(self, node):
        f, args = node.op, node.args
        if f not in CONST_FUNCS or CONST_FUNCS[f] != len(args):
            raise FileError(f"'{f}' with {len(args)} argument(s) in a constant expression")
        if f == "if":  # only the chosen branch is evaluated
            return self.value(args[1] if self.holds(args[0]) else args[2])
        x = [self.value(a) for a in args]
        try:
            return {"sqrt": lambda: math.sqrt(x[0]), "exp": lambda: math.exp(x[0]), "log": lambda: math.log(x[0]),
                    "floor": lambda: float(math.floor(x[0])), "min": lambda: min(x[0], x[1]),
                    "max": lambda: max(x[0], x[1]), "mod": lambda: math.fmod(x[0], x[1])}[f]()
        except (ValueError, OverflowError):
            return math.nan

    def holds(self, node):
        """A condition ([P] "Conditions")."""
        k = node.kind
        if k == "and":
            return self.holds(node.args[0]) and self.holds(node.args[1])
        if k == "or":
            return self.holds(node.args[0]) or self.holds(node.args[1])
        if k == "not":
            return not self.holds(node.args[0])
        if k != "cmp":
            raise FileError(f"expected a condition, found {node!r}")
        key = self.word_option(node.args[0]) or self.word_option(node.args[1])
        if key is not None:  # [P] `KEY == WORD`: the given value, else the default; WORD one of its choices
            other = node.args[1] if self.word_option(node.args[0]) else node.args[0]
            choices = self.p.options[key].choices
            if node.op not in ("==", "!=") or other.kind != "name" or other.value not in choices:
                raise FileError(f"word option '{key}' compares with == or != to one of {choices}: {node!r}")
            return (self.opts[key][0] == other.value) == (node.op == "==")
        lw, rw = self.word(node.args[0]), self.word(node.args[1])
        if lw is not None or rw is not None:
            if lw is None or rw is None or node.op not in ("==", "!="):
                raise FileError(f"kind / block_kind compare with == or != to attn, ffn, attn_ffn: {node!r}")
            return (lw == rw) == (node.op == "==")
        a, c = self.value(node.args[0]), self.value(node.args[1])
        return {"==": a == c, "!=": a != c, "<": a < c, "<=": a <= c, ">": a > c, ">=": a >= c}[node.op]


def _arith(op, a, c):
    try:
        if op == "+":
            return a + c
        if op == "-":
            return a - c
        if op == "*":
            return a * c
        if op == "/":
            return a / c if c != 0 else (math.copysign(math.inf, a) * math.copysign(1.0, c) if a else math.nan)
        return math.pow(a, c)  # std::pow
    except (ValueError, OverflowError, ZeroDivisionError):
        return math.nan


def names_in(node):
    """Every name a syntax tree mentions (conditions of if() included)."""
    out = [node.value] if node.kind == "name" else []
    for a in node.args:
        out += names_in(a)
    return out


def depth_unit(names):
    """[P] the inferred unit: "blocks" (B or b), "sublayers" (S or l), "blocks and sublayers", or "-"."""
    blocks, sublayers = bool(names & {"B", "b"}), bool(names & {"S", "l"})
    return ("blocks and sublayers" if blocks and sublayers else "blocks" if blocks
            else "sublayers" if sublayers else "-")


def number_text(v):
    """The text of a TOML number as recorded for a formula (an integer without a decimal point)."""
    return str(v) if isinstance(v, int) else repr(float(v))


_BOUND = r"\s*([+-]?(?:inf|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))\s*"
_RANGE = re.compile(r"^\s*([\[(])" + _BOUND + "," + _BOUND + r"([\])])\s*$")


def parse_range(text):
    """[P] `range`: "[a, b]", "(a, b)" or mixed, with inf / -inf -> (low, low_closed, high, high_closed)."""
    m = _RANGE.match(text) if isinstance(text, str) else None
    if not m:
        raise FileError(f"range {text!r} is not \"[a, b]\", \"(a, b)\" or mixed (with inf / -inf)")
    lo, hi = float(m.group(2)), float(m.group(3))
    lo_closed, hi_closed = m.group(1) == "[", m.group(4) == "]"
    if not (lo < hi or (lo == hi and lo_closed and hi_closed and math.isfinite(lo))):
        raise FileError(f"range {text!r} is empty")
    return lo, lo_closed, hi, hi_closed


class Option:
    """One `[options.KEY]` table ([P] "[options.KEY]: settings with their own flags")."""

    def __init__(self, key, raw, source):
        where = f"{source}: [options.{key}]"
        if not isinstance(raw, dict):
            raise FileError(f"{where} is not a table")
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", key) or key in RESERVED:
            raise FileError(f"{where}: the key is not an identifier of lower case letters, digits and _ "
                            "(or is reserved)")
        unknown = set(raw) - OPTION_KEYS
        if unknown:
            raise FileError(f"{where}: unknown key(s) {sorted(unknown)}")
        self.key, self.flag = key, "--" + key.replace("_", "-")
        for name in ("help", "default_text", "range", "fix", "when_unused", "sets"):
            if name in raw and not isinstance(raw[name], str):
                raise FileError(f"{where}: `{name}` must be a string")
        for name in ("in_run_config", "in_sweep_model"):
            if name in raw and not isinstance(raw[name], bool):
                raise FileError(f"{where}: `{name}` must be a boolean")
        if "help" not in raw:
            raise FileError(f"{where}: `help` is required")
        self.when_unused = raw.get("when_unused", "warn")
        if self.when_unused not in WHEN_UNUSED:
            raise FileError(f"{where}: when_unused {self.when_unused!r} is not one of {WHEN_UNUSED}")
        # [P] "Further rules": `when_unused = "refuse"` needs `sets`, and `sets` needs it
        if (self.when_unused == "refuse") != ("sets" in raw):
            raise FileError(f"{where}: `sets` is given exactly when when_unused = \"refuse\"")
        self.sets = raw.get("sets")
        # [P] "Further rules": `default` and `default_text` exclude each other
        if "default" in raw and "default_text" in raw:
            raise FileError(f"{where}: `default` and `default_text` exclude each other")
        self.in_run_config, self.in_sweep_model = raw.get("in_run_config", False), raw.get("in_sweep_model", False)
        default = raw.get("default")
        if default is not None and (isinstance(default, bool) or not isinstance(default, (int, float, str))):
            raise FileError(f"{where}: `default` must be a number or a string")
        self.is_word = isinstance(default, str)
        self.default, self.default_text = default, raw.get("default_text")
        if self.is_word:  # a word option: choices required, the default one of them, no range
            choices = raw.get("choices")
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices) \
                    or len(set(choices)) != len(choices):
                raise FileError(f"{where}: a word option needs `choices`, distinct strings")
            # [P] "Further rules": choices are names (letters, digits, `_`), since a condition writes them as names
            bad = [c for c in choices if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", c)]
            if bad:
                raise FileError(f"{where}: choices {bad} are not names (letters, digits and _, not starting "
                                "with a digit)")
            if default not in choices:
                raise FileError(f"{where}: default {default!r} is not one of its choices {choices}")
            if "range" in raw or "default_text" in raw:
                raise FileError(f"{where}: `range` and `default_text` are for number options")
            self.choices, self.range = list(choices), None
        else:
            if "choices" in raw:
                raise FileError(f"{where}: `choices` needs a word (string) `default`")
            self.choices = None
            self.range = parse_range(raw.get("range", "(-inf, inf)"))
            if default is not None:
                self.default = float(default)
                if not self.contains(self.default):
                    raise FileError(f"{where}: default {default!r} is outside its range {raw.get('range')!r}")

    def contains(self, v):
        lo, lo_closed, hi, hi_closed = self.range
        return math.isfinite(v) and (lo <= v if lo_closed else lo < v) and (v <= hi if hi_closed else v < hi)

    def check(self, value):
        """A value given with the flag ([P]: outside `range` or `choices` is refused; NaN always)."""
        if self.is_word:
            if value not in self.choices:
                raise FileError(f"{self.flag} {value!r} is not one of {self.choices}")
            return value
        v = float(value)
        if not self.contains(v):
            raise FileError(f"{self.flag} {value!r} is outside its range {self.range}")
        return v


class Constant:
    """One named constant: a string (an expression), a TOML number, or the inline table of [P] `[constants]`."""

    def __init__(self, name, raw, placement):
        where = f"{placement.source}: constant '{name}'"
        self.option = self.formula = self.unit = None
        if isinstance(raw, dict):
            unknown = set(raw) - CONSTANT_KEYS
            if unknown:
                raise FileError(f"{where}: unknown key(s) {sorted(unknown)}")
            for key in ("option", "formula", "unit"):
                if key in raw and not isinstance(raw[key], str):
                    raise FileError(f"{where}: `{key}` must be a string")
            self.option, self.formula, self.unit = raw.get("option"), raw.get("formula"), raw.get("unit")
            if self.option is not None:
                opt = placement.options.get(self.option)
                if opt is None or opt.is_word:
                    raise FileError(f"{where}: option {self.option!r} is not a number option the file declares")
            if "value" not in raw:
                if self.option is None or placement.options[self.option].default is None:
                    raise FileError(f"{where}: `value` may be left out only for a number option with a default")
                raw = None
            else:
                raw = raw["value"]
        if raw is None:
            self.ast, self.number = None, None
            self.text = number_text(placement.options[self.option].default)
        elif isinstance(raw, str):
            self.ast, self.number, self.text = parse_expr(raw), None, raw
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            self.ast, self.number, self.text = None, float(raw), number_text(raw)
        else:
            raise FileError(f"{where}: a constant is a string, a number or an inline table")


# ----------------------------------------------------------------------------------------------
# The file
# ----------------------------------------------------------------------------------------------
class PlacementFile:
    """A parsed placement file ([P] "Top-level keys", "[[sublayer]]", "The output head")."""

    def __init__(self, text, source="<text>"):
        self.text, self.source = text, source
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise FileError(f"{source}: {e}")
        unknown = set(doc) - TOP_KEYS
        if unknown:
            raise FileError(f"{source}: unknown key(s) {sorted(unknown)}")
        for key in ("id", "citation", "expected_growth", "output", "sublayer"):
            if key not in doc:
                raise FileError(f"{source}: missing '{key}'")
        self.id = doc["id"]
        self.streams = list(doc.get("streams", ["x"]))
        if not isinstance(doc.get("final_norm", ""), str):
            raise FileError(f"{source}: final_norm must be a string")
        self.final_norm = doc.get("final_norm", doc["output"])  # [P] display only; default: the output text
        options = doc.get("options", {})
        if not isinstance(options, dict):
            raise FileError(f"{source}: options must be [options.KEY] tables")
        self.options = {k: Option(k, v, source) for k, v in options.items()}
        self.constants = dict(doc.get("constants", {}))
        self.const = {n: Constant(n, v, self) for n, v in self.constants.items()}
        for n, c in self.const.items():  # [P] "Further rules": an option's name only for a constant bound to it
            if n in self.options and c.option != n:
                raise FileError(f"{source}: constant '{n}' takes the name of option '{n}' without being bound "
                                f"to it (option = \"{n}\")")
        self.constant_ast = {n: c.ast for n, c in self.const.items() if c.ast is not None}
        self.init_gain = {k: parse_expr(v) if isinstance(v, str) else Node("num", value=float(v))
                          for k, v in doc.get("init_gain", {}).items()}
        # [P] `[learning_rate_scale]`: --update's multiplier on --lr for every parameter of sublayer l, per rule
        raw_lr = doc.get("learning_rate_scale", {})
        if not isinstance(raw_lr, dict):
            raise FileError(f"{source}: [learning_rate_scale] must be a table of rule = \"expression\" (sgd, adam)")
        unknown_rules = sorted(set(raw_lr) - {"sgd", "adam"})
        if unknown_rules:
            raise FileError(f"{source}: [learning_rate_scale] has unknown key(s) {unknown_rules}; the keys are sgd "
                            "and adam")
        for k, v in raw_lr.items():  # a string or a number; TOML's booleans are not numbers here
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise FileError(f"{source}: [learning_rate_scale] {k} must be a constant expression or a number")
        self.learning_rate_scale = {k: parse_expr(v) if isinstance(v, str) else Node("num", value=float(v))
                                    for k, v in raw_lr.items()}
        # [P] `[history]`: stream -> the condition (at sublayer l) under which state l is a source of its reads
        raw_history = doc.get("history", {})
        if not isinstance(raw_history, dict):
            raise FileError(f"{source}: [history] must be a table of stream = \"condition\"")
        for k, v in raw_history.items():
            if k not in self.streams:
                raise FileError(f"{source}: [history] names '{k}', which is not a stream")
            if not isinstance(v, str):
                raise FileError(f"{source}: [history] {k} must be a condition (a string)")
        self.history = {k: parse_cond(v) for k, v in raw_history.items()}
        self._check_names()
        self.output = parse_expr(doc["output"])
        self.entries = [Entry(e, self) for e in doc["sublayer"]]
        self.requires = self._read_requires(doc.get("requires", []))
        self._check_fraction_names()
        self._check_constant_names()

    def _read_requires(self, raw):
        """[P] `[[requires]]`: (condition, message) per entry; both keys required, no other key, the condition
        a condition ([P] "Conditions"), the message a string."""
        if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
            raise FileError(f"{self.source}: requires must be [[requires]] tables")
        out = []
        for i, r in enumerate(raw):
            where = f"{self.source}: [[requires]] entry {i + 1}"
            unknown = set(r) - REQUIRES_KEYS
            if unknown:
                raise FileError(f"{where}: unknown key(s) {sorted(unknown)}")
            for key in ("condition", "message"):
                if key not in r:
                    raise FileError(f"{where}: missing '{key}'")
                if not isinstance(r[key], str):
                    raise FileError(f"{where}: `{key}` must be a string")
            try:
                cond = parse_cond(r["condition"])
            except FileError as e:
                raise FileError(f"{where}: condition {r['condition']!r} is not a condition ({e})")
            out.append((cond, r["message"]))
        return out

    def check_requires(self, where):
        """[P] `[[requires]]`: every condition, at the last sublayer with the run's sizes and options, must hold;
        else `--arch ID at S = ..., B = ...: MESSAGE`. Called before any constant is evaluated for the stack
        (a constant the condition itself names is evaluated by it)."""
        for cond, message in self.requires:
            if not where.holds(cond):
                raise FileError(f"--arch {self.id} at S = {where.sizes['S']}, B = {where.sizes['B']}: {message}")

    def option_values(self, given=None):
        """key -> (value, given): `given` (key -> value) are the flags given; the others take their default."""
        given = {k: v for k, v in (given or {}).items() if v is not None and k in self.options}
        return {k: ((o.check(given[k]), True) if k in given else (o.default, False)) for k, o in self.options.items()}

    def _check_constant_names(self):
        """Names in constant expressions and conditions (constants, init gains, `when`, skip_gain, score_scale,
        ffn_hidden_scale) are known ([P]): sizes, l, b, constants, number options with a default; a word
        option only as `KEY == WORD` with WORD one of its choices."""
        known = set(SIZES) | {"l", "b"} | set(self.constants) | \
            {k for k, o in self.options.items() if not o.is_word and o.default is not None}

        def walk(node):
            if node.kind == "cmp":
                a, c = node.args
                for key_side, other in ((a, c), (c, a)):
                    opt = self.options.get(key_side.value) if key_side.kind == "name" else None
                    if opt is not None and opt.is_word:
                        if node.op not in ("==", "!=") or other.kind != "name" or other.value not in opt.choices:
                            raise FileError(f"{self.source}: word option '{opt.key}' compares with == or != "
                                            f"to one of {opt.choices}: {node!r}")
                        return
                words = {"kind", "block_kind"} | set(KIND_WORDS)
                if (a.kind == "name" and a.value in words) or (c.kind == "name" and c.value in words):
                    return  # kind / block_kind, checked when evaluated
            if node.kind == "name" and node.value not in known:
                opt = self.options.get(node.value)
                why = ("a word option is used only in conditions" if opt is not None and opt.is_word else
                       "a number option without a default" if opt is not None else "unknown name")
                raise FileError(f"{self.source}: {why}: '{node.value}'")
            for x in node.args:
                walk(x)

        trees = list(self.constant_ast.values()) + list(self.init_gain.values())
        trees += list(self.learning_rate_scale.values())
        for e in self.entries:
            trees += [t for t in (e.when, e.score_scale, e.ffn_hidden_scale, e.skip_gain) if t is not None]
        trees += [cond for cond, _ in self.requires]
        for t in trees:
            walk(t)

    def _check_fraction_names(self):
        """[P] "Slicing the width": mix_fractions takes 3 arguments, and fraction_out / fraction_in mean something
        only in its third (the weight): anywhere else ([constants], conditions, gains, rules, the output head)
        the file is refused, whether or not that place is ever evaluated."""
        trees = [self.output] + list(self.constant_ast.values()) + list(self.init_gain.values())
        trees += list(self.learning_rate_scale.values()) + list(self.history.values())
        trees += [cond for cond, _ in self.requires]
        for e in self.entries:
            trees += [t for t in (e.when, e.score_scale, e.ffn_hidden_scale, e.skip_gain) if t is not None]
            trees += list(e.bindings.values()) + [x for _, x in e.assignments]
        for t in trees:
            _check_fractions(t, self.source)

    def _check_names(self):
        """[P] Names: identifiers, not reserved, no two alike; a stream may take a size's name (ResiDual's `d`)
        and then means the stream inside rules and the output head."""
        names = self.streams + list(self.constants)
        for n in names:
            size_stream = n in self.streams and n in SIZES + ("l", "b")
            if not re.fullmatch(r"[A-Za-z_]\w*", n) or (n in RESERVED and not size_stream):
                raise FileError(f"{self.source}: '{n}' is not a usable name (reserved or not an identifier)")
        if len(set(names)) != len(names):
            raise FileError(f"{self.source}: a stream and a constant share a name: {names}")
        # a word option's key is a word in conditions: not also a stream or a constant (a number option's key
        # may be a constant's name, e.g. mix-ln's mix_ratio bound to the option; the constant is meant then)
        clash = sorted(k for k, o in self.options.items() if o.is_word and k in names)
        if clash:
            raise FileError(f"{self.source}: word option(s) {clash} share a name with a stream or a constant")

    def entry_for(self, where):
        """[P]: the first [[sublayer]] entry, in file order, whose `when` holds."""
        for e in self.entries:
            if e.when is None or where.holds(e.when):
                return e
        raise FileError(f"{self.source}: no [[sublayer]] entry selects sublayer {where.l} ({where.kind})")


class Entry:
    """One [[sublayer]] entry: its condition, statements and branch options."""

    def __init__(self, raw, placement):
        unknown = set(raw) - SUBLAYER_KEYS
        if unknown:
            raise FileError(f"{placement.source}: unknown [[sublayer]] key(s) {sorted(unknown)}")
        self.when = parse_cond(raw["when"]) if "when" in raw else None
        self.statements = Parser(raw["rule"], arrows=True).statements()
        self.qkv_norm = raw.get("qkv_norm", "none")
        if self.qkv_norm not in QKV_NORMS:
            raise FileError(f"{placement.source}: qkv_norm '{self.qkv_norm}' is not one of {QKV_NORMS}")
        self.score_scale = _opt_expr(raw, "score_scale")
        self.ffn_hidden_scale = _opt_expr(raw, "ffn_hidden_scale")
        self.skip_gain = _opt_expr(raw, "skip_gain")
        if ("update" in raw) != ("sum" in raw):
            raise FileError(f"{placement.source}: name both `update` and `sum`, or neither")
        self.update_name, self.sum_name = raw.get("update"), raw.get("sum")
        self.bindings = {names[0]: exprs[0] for kind, names, exprs in self.statements if kind == "bind"}
        self.assignments = [(n, e) for kind, names, exprs in self.statements if kind == "assign"
                            for n, e in zip(names, exprs)]
        self._check(placement)

    def _check(self, placement):
        streams = set(placement.streams)
        for name in self.bindings:  # [P] Names: a binding's is not reserved, nor a stream's or a constant's
            if name in RESERVED or name in streams or name in placement.constants:
                raise FileError(f"{placement.source}: binding '{name}' takes a reserved name or the name of a "
                                "stream or a constant")
        for kind, names, exprs in self.statements:
            if kind == "assign" and len(names) != len(exprs):
                raise FileError(f"{placement.source}: {len(names)} targets but {len(exprs)} expressions")
        targets = [n for n, _ in self.assignments]
        if not targets or len(set(targets)) != len(targets) or not set(targets) <= streams:
            raise FileError(f"{placement.source}: assignment targets {targets} (streams {sorted(streams)})")
        uses = sum(_count_F(e, {}) for e in self.bindings.values()) + \
            sum(_count_F(e, {}) for _, e in self.assignments)
        if uses != 1:
            raise FileError(f"{placement.source}: F used {uses} times in a rule (exactly once)")


def _opt_expr(raw, key):
    if key not in raw:
        return None
    v = raw[key]
    return parse_expr(v) if isinstance(v, str) else Node("num", value=float(v))


def _count_F(node, seen):
    return (node.kind == "call" and node.op == "F") + sum(_count_F(a, seen) for a in node.args)


def _check_fractions(node, source, in_weight=False):
    """[P] mix_fractions(e, m, w): exactly three arguments; fraction_out and fraction_in only inside w."""
    if node.kind == "name" and node.value in FRACTION_INDICES and not in_weight:
        raise FileError(f"{source}: '{node.value}' is used outside the weight (third argument) of "
                        "mix_fractions(e, m, weight)")
    if node.kind == "call" and node.op == "mix_fractions":
        if len(node.args) != 3:
            raise FileError(f"{source}: mix_fractions takes 3 arguments (a tensor, m, a weight), not "
                            f"{len(node.args)}: {node!r}")
        for i, a in enumerate(node.args):
            _check_fractions(a, source, i == 2)
        return
    for a in node.args:
        _check_fractions(a, source, in_weight)


# ----------------------------------------------------------------------------------------------
# The stack a file builds ([P] "Meaning of each construct", "The update and the sum")
# ----------------------------------------------------------------------------------------------
class FileStack:
    """Same interface as gradflow_reference.Stack (init_state, sublayer, output, forward, streams, kinds, S),
    so gradflow_reference.analyze() computes the figures."""

    def __init__(self, placement, weights, heads, block, norm, d, T, branch="model", sublayers=None, ops=None,
                 options=None):
        self.p, self.W, self.heads, self.block, self.branch = placement, weights, heads, block, branch
        # [P] `[options.KEY]`: key -> (value, given); `options` may be key -> value of the flags given
        if options is None or not all(isinstance(v, tuple) for v in options.values()):
            options = placement.option_values(options)
        self.options = options
        # issue 19's block ops, as gradflow_reference.Stack takes them (R.block_ops of the export's config)
        self.ops = dict({"ffn": "gelu", "kv_heads": None, "rope": None, "eps": R.EPS}, **(ops or {}))
        self.N = lambda x, _n=R.NORMS[norm], _eps=self.ops["eps"]: _n(x, _eps)  # [P] N: --norm, --norm-eps
        self.S = len(weights) if sublayers is None else int(sublayers)
        self.per_block = 2 if block == "attn-ffn" else 1
        if self.S % self.per_block:
            raise FileError("odd sublayer count for attn-ffn")
        self.B = self.S // self.per_block
        self.sizes = {"S": self.S, "B": self.B, "d": d, "T": T, "heads": heads}
        self.kinds = [("attn" if l % 2 == 0 else "ffn") if block == "attn-ffn" else block for l in range(self.S)]
        self.streams = list(placement.streams)
        if _attended(placement.output):
            raise FileError(f"{placement.source}: a history read (attend, history_sum, history_mean) is not allowed "
                            "in the output head")
        self.admin_w = None
        self.Q = None  # --update-params all: gradflow_reference.PseudoQueries, the reads' w as parameters
        self.where = [self._where(l) for l in range(self.S)]
        placement.check_requires(self._where(self.S - 1))  # [P] before the constants; a fresh cache
        self.entries = [placement.entry_for(w) for w in self.where]  # every sublayer checked before any work
        # [P] `attend(s, e[, q])`: the streams whose history this run's rules read (the entries selected)
        self.history_streams = {s for e in self.entries for _, x in e.assignments + list(e.bindings.items())
                                for s in _attended(x)}
        # [P] `[history]`: per stream named there, whether state l (l < S) is a source; state S never is read
        self.members = {s: [w.holds(c) for w in self.where] for s, c in placement.history.items()}
        for l in range(self.S):  # [P] `[learning_rate_scale]`: both rules, every sublayer, before any work
            for rule in placement.learning_rate_scale:
                self.learning_rate_scale(l, rule)
        # [P] "Slicing the width": every mix_fractions's m (a whole number >= 1 dividing d) and weights, at each
        # sublayer's selected entry and at the output head (l = S - 1), before any work
        for w, e in list(zip(self.where, self.entries)) + [(self.where[-1], None)]:
            trees = [placement.output] if e is None else list(e.bindings.values()) + [x for _, x in e.assignments]
            for call in (c for t in trees for c in _mix_calls(t)):
                w.fraction_weights(call, d)

    def _where(self, l):
        return Where(self.p, self.sizes, l, l // self.per_block, self.kinds[l], self.block, self.options)

    def block_of(self, l):
        return l // self.per_block

    def constants_at_last_sublayer(self):
        """[P] `[constants]`: config.constants reports each named constant at l = S-1, b = B-1, its kind."""
        last = self.where[-1]
        return {name: last.constant(name) for name in self.p.constants}

    def constant_records_at_last_sublayer(self):
        """[P] `[constants]`: {name: {value, formula, unit}} as config.constants reports them."""
        last = self.where[-1]
        return {name: last.record(name) for name in self.p.constants}

    def learning_rate_scale(self, l, rule):
        """[P] `[learning_rate_scale]`: the multiplier on --lr for sublayer l's parameters under `rule` (sgd or
        adam; 1 when the table does not name the rule)."""
        if rule not in self.p.learning_rate_scale:
            return 1.0
        value = self.where[l].value(self.p.learning_rate_scale[rule])
        if not value > 0:
            raise FileError(f"{self.p.source}: learning_rate_scale must be > 0, not {value}")
        return value

    def skip_gain_theory(self):
        return [w.value(e.skip_gain) if e.skip_gain is not None else None for w, e in zip(self.where, self.entries)]

    def init_state(self, x0):
        return tuple(x0.clone() for _ in self.streams)  # [P] every stream of x_0 is a copy of the input

    def output(self, state):
        ev = Evaluation(self, dict(zip(self.streams, state)), self.where[-1], None, False, {})
        return ev.tensor(self.p.output)

    def member(self, s, l):
        """[P] `[history]`: state l of stream s is a source of the reads of s's history (every state by default)."""
        return s not in self.members or self.members[s][l]

    def history_at(self, l, states):
        """[P] attend: per history stream, its values at the member states among 0 .. l-1 before sublayer l."""
        return {s: [states[j][i] for j in range(l) if self.member(s, j)]
                for i, s in enumerate(self.streams) if s in self.history_streams}

    def sublayer(self, l, state, detach=False, history=None):
        entry = self.entries[l]
        if history is None and self.history_streams:
            raise FileError(f"{self.p.source}: sublayer {l} reads a history; pass history=stack.history_at(l, ...)")
        ev = Evaluation(self, dict(zip(self.streams, state)), self.where[l], l, detach, entry.bindings, entry)
        ev.history = history or {}
        new = dict(ev.inputs)
        for name, e in entry.assignments:  # simultaneous: every expression reads the sublayer's input
            new[name] = ev.tensor(e)
        update, total = ev.update_and_sum()
        return tuple(new[s] for s in self.streams), update, total

    def forward(self, x0):
        with torch.no_grad():
            state = self.init_state(x0)
            states, updates, presums = [state], [], []
            for l in range(self.S):
                state, u, s = self.sublayer(l, state, history=self.history_at(l, states))
                states.append(state)
                updates.append(u)
                presums.append(s)
        return states, updates, presums


class Evaluation:
    """One evaluation of a rule (or the output head) on one state: values of every node, bindings once."""

    def __init__(self, stack, inputs, where, l, detach, bindings, entry=None):
        self.st, self.inputs, self.where, self.l, self.detach = stack, inputs, where, l, detach
        self.bindings, self.entry, self.bound, self.values = bindings, entry, {}, {}
        self.history = {}  # [P] attend: per history stream, its values at the earlier states

    def is_tensor(self, node):
        if node.kind == "name":
            return node.value in self.inputs or node.value in self.bindings
        if node.kind == "call" and node.op in TENSOR_FUNCS:
            return True
        return any(self.is_tensor(a) for a in node.args if a.kind not in ("cmp", "and", "or", "not"))

    def tensor(self, node):
        if id(node) not in self.values:
            self.values[id(node)] = self._tensor(node)
        return self.values[id(node)]

    def _tensor(self, node):
        k = node.kind
        if k == "name":
            if node.value in self.inputs:
                return self.inputs[node.value]
            if node.value not in self.bound:  # a binding is one node, evaluated once
                self.bound[node.value] = self.tensor(self.bindings[node.value])
            return self.bound[node.value]
        if k == "call" and node.op == "attend":
            return self.attend(node)
        if k == "call" and node.op in ("history_sum", "history_mean"):
            return self.history_read(node)
        if k == "call" and node.op == "mix_fractions":
            return self.mix_fractions(node)
        if k == "call":
            if node.op not in TENSOR_FUNCS or len(node.args) != 1:
                raise FileError(f"{node.op}() of a tensor")
            x = self.tensor(node.args[0])
            return self.st.N(x) if node.op == "N" else R.unit(x) if node.op == "U" else self.branch(x)
        if k == "neg":
            return self.tensor(node.args[0]) * -1.0
        a, c = node.args
        ta, tc = self.is_tensor(a), self.is_tensor(c)
        if node.op in ("+", "-"):
            if not (ta and tc):
                raise FileError(f"'{node.op}' of a tensor and a constant: {node!r}")
            return self.tensor(a) + (self.tensor(c) if node.op == "+" else self.tensor(c) * -1.0)
        if node.op == "*" and ta != tc:
            return scale(self.tensor(a), self.where.value(c)) if ta else scale(self.tensor(c), self.where.value(a))
        if node.op == "/" and ta and not tc:
            return scale(self.tensor(a), 1.0 / self.where.value(c))
        raise FileError(f"'{node.op}' not defined on these operands: {node!r}")

    def attend(self, node):
        """[P] `attend(s, e[, q])`: attention over depth (Kimi Team 2026, arXiv 2603.15031, Eq. 2-4) over the
        sources [s at the member states among 0 .. l-1, s at this sublayer's input if it is a member, e]: keys RMSNorm(v) (gain 1, --norm-eps),
        logits w . key with every entry of the pseudo-query w equal to q (default 0), a softmax over the
        sources per token, and the read sum_i alpha_i v_i."""
        stream = node.args[0].value
        extra = self.tensor(node.args[1])
        q = self.where.value(node.args[2]) if len(node.args) == 3 else 0.0
        own = [self.inputs[stream]] if self.st.member(stream, self.l) else []  # [P] `[history]`: a member?
        V = torch.stack(list(self.history.get(stream, [])) + own + [extra])
        keys = R.rms_norm(V, self.st.ops["eps"])
        w = torch.full((V.shape[-1],), q, dtype=V.dtype) if self.st.Q is None else self.st.Q(self.l, q, V)
        alpha = torch.einsum("d,ntd->nt", w, keys).softmax(dim=0)
        return torch.einsum("nt,ntd->td", alpha, V)

    def mix_fractions(self, node):
        """[P] `mix_fractions(e, m, w)`: result fraction f (columns f d/m .. (f+1) d/m - 1) is the sum over g of
        w(f, g) times e's fraction g, w evaluated with fraction_out = f and fraction_in = g; m a whole number
        >= 1 dividing d. Each output fraction sums its input fractions in increasing g, skipping zero weights
        (none: zeros); the identity builds no node (e itself, as a scale by exactly 1). Linear: autograd gives
        the backward (input fraction g gets sum over f of w(f, g) times output fraction f's cotangent)."""
        e, m_arg, w_arg = node.args  # three arguments: checked when the file was read
        if not self.is_tensor(e) or self.is_tensor(m_arg) or self.is_tensor(w_arg):
            raise FileError(f"mix_fractions takes a tensor, a constant m and a constant weight: {node!r}")
        x = self.tensor(e)
        m, w = self.where.fraction_weights(node, x.shape[-1])
        if all(w[f][g] == (1.0 if f == g else 0.0) for f in range(m) for g in range(m)):
            return x
        cols = x.shape[-1] // m
        fractions = [x[..., g * cols:(g + 1) * cols] for g in range(m)]
        out = []
        for f in range(m):
            total = None
            for g in range(m):
                if w[f][g] != 0.0:
                    term = fractions[g] * w[f][g]
                    total = term if total is None else total + term
            out.append(torch.zeros_like(fractions[0]) if total is None else total)
        return torch.cat(out, dim=-1)

    def history_read(self, node):
        """[P] `history_sum(s)`, `history_mean(s)`: the sum, or the mean, of stream s's values at its member states
        among 0 .. l (the earlier ones, then this sublayer's input if it is a member); fixed weights."""
        stream = node.args[0].value
        own = [self.inputs[stream]] if self.st.member(stream, self.l) else []
        V = list(self.history.get(stream, [])) + own
        if not V:
            if node.op == "history_sum":
                return torch.zeros_like(self.inputs[stream])
            raise FileError(f"history_mean({stream}) at sublayer {self.l} reads no member state")
        total = torch.stack(V).sum(dim=0)
        return total / len(V) if node.op == "history_mean" else total

    def branch(self, x):
        """F ([P] "F(e)"): attention or FFN with the entry's options, or gradflow --ideal-branch's rotation."""
        l, e, w = self.l, self.entry, self.where
        if self.st.branch == "rotation":
            out = R.rotate_pairs(x)
        elif self.st.kinds[l] == "attn":
            dh = self.st.sizes["d"] / self.st.heads
            scale_ = w.value(e.score_scale) if e.score_scale is not None else 1.0 / math.sqrt(dh)
            out = attention(x, self.st.W[l], self.st.heads, e.qkv_norm, scale_, self.st.ops)
        else:
            hidden = w.value(e.ffn_hidden_scale) if e.ffn_hidden_scale is not None else 1.0
            out = R.ffn(x, self.st.W[l], hidden, self.st.ops["ffn"])
        return out.detach() if self.detach else out

    def update_and_sum(self):
        e = self.entry
        if e.update_name is not None:  # named bindings ([P] `update = "NAME"` and `sum = "NAME"`)
            return self.tensor(self.bindings[e.update_name]), self.tensor(self.bindings[e.sum_name])
        for _, expr in e.assignments:  # the marked stream: the first target whose expression depends on F
            path = self.path_to_F(expr)
            if path:
                break
        for i, node in enumerate(path):  # the outermost + or - on the path from the root down to F
            if node.kind == "bin" and node.op in ("+", "-"):
                operand = path[i + 1]
                update = self.tensor(operand)
                if node.op == "-" and operand is node.args[1]:
                    update = update * -1.0  # the scale(., -1) node
                return update, self.tensor(node)
        return self.tensor(expr), self.tensor(expr)

    def path_to_F(self, node):
        """Nodes from `node` down to the F call, looking through bindings; [] when F is not below."""
        if node.kind == "call" and node.op == "F":
            return [node]
        if node.kind == "name" and node.value in self.bindings:
            below = self.path_to_F(self.bindings[node.value])
            return [node] + below if below else []
        for a in node.args:
            below = self.path_to_F(a)
            if below:
                return [node] + below
        return []


def scale(x, c):
    return x if c == 1.0 else x * c  # [P] a scale by exactly 1 builds no node


def _mix_calls(node):
    """Every mix_fractions call in a tensor expression (nested ones included)."""
    found = [node] if node.kind == "call" and node.op == "mix_fractions" else []
    for a in node.args:
        found += _mix_calls(a)
    return found


def _attended(node):
    """The streams whose history `node` reads (the first argument of attend, history_sum, history_mean)."""
    found = {node.args[0].value} if node.kind == "call" and node.op in HISTORY_READS else set()
    for a in node.args:
        found |= _attended(a)
    return found


def analyze_history(stack, x0, probes):
    """R.analyze for a stack that reads a history ([P] attend): the sublayers are not Markov, so dL/dx_l is the
    gradient with respect to a perturbation of state l's value wherever it is read (sublayer l and every later
    read of its history), by autograd through the whole forward pass with a zero perturbation per state and
    stream. gain is the ratio of probe-RMS norms; skip_gain and branch_gain have no meaning (None)."""
    S, K, ln10 = stack.S, probes.shape[0], math.log(10.0)
    states, updates, presums = stack.forward(x0)
    logn = np.zeros((K, S + 1))
    logn_stream = np.full((K, S + 1, len(stack.streams)), -np.inf)
    for k in range(K):
        deltas = [tuple(torch.zeros_like(t, requires_grad=True) for t in st) for st in states]
        state = tuple(t + dl for t, dl in zip(stack.init_state(x0), deltas[0]))
        perturbed = [state]
        for l in range(S):
            new, _, _ = stack.sublayer(l, state, history=stack.history_at(l, perturbed))
            state = tuple(t + dl for t, dl in zip(new, deltas[l + 1]))
            perturbed.append(state)
        loss = (probes[k] * stack.output(state)).sum()
        flat = [dl for st in deltas for dl in st]
        grads = torch.autograd.grad(loss, flat, allow_unused=True)
        i = 0
        for l, st in enumerate(deltas):
            gs = [g if g is not None else torch.zeros_like(dl) for g, dl in zip(grads[i:i + len(st)], st)]
            i += len(st)
            logn[k, l] = math.log(R.tnorm(gs))
            for j, g in enumerate(gs):
                n = float(g.norm())
                logn_stream[k, l, j] = math.log(n) if n > 0 else -math.inf
    log10_grad = [R._log_rms(logn[:, l]) / ln10 for l in range(S + 1)]
    gain = [math.exp(R._log_rms(logn[:, l]) - R._log_rms(logn[:, l + 1])) for l in range(S)]
    streams = {name: {"rms": [R._stream_rms(states[l], i) for l in range(S + 1)],
                      "log10_grad": [R._log_rms(logn_stream[:, l, i]) / ln10 for l in range(S + 1)]}
               for i, name in enumerate(stack.streams)}
    for v in streams.values():  # a stream nothing reads (v at x_S): log10_grad of a zero gradient -> None
        for key in ("rms", "log10_grad"):
            v[key] = [x if math.isfinite(x) else None for x in v[key]]
    return {
        "states": {"index": list(range(S + 1)), "rms": [R.trms(st) for st in states], "log10_grad": log10_grad,
                   "log10_grad_rel": [v - log10_grad[S] for v in log10_grad], "streams": streams},
        "sublayers": {
            "index": list(range(S)), "kind": stack.kinds, "block": [stack.block_of(l) for l in range(S)],
            "gain": gain, "skip_gain": [None] * S, "branch_gain": [None] * S,
            "branch_rms": [R.trms((u,)) for u in updates],
            "stream_share": [R.tnorm((u,)) / R.tnorm((s,)) for u, s in zip(updates, presums)],
            "admin_w": stack.admin_w,
        },
    }



def exact_jacobian_history(stack, x0):
    """gradflow --exact-jacobian for a stack that reads a history ([P] attend): J_{l->out} = dy/dx_l, x_l
    perturbed wherever it is read (sublayer l and every later read of its history), one autograd backward per
    output coordinate through the whole forward pass with a zero perturbation per state and stream. Returns
    per state log10 of its Frobenius and spectral norms."""
    states, _, _ = stack.forward(x0)
    with torch.enable_grad():
        deltas = [tuple(torch.zeros_like(t, requires_grad=True) for t in st) for st in states]
        state = tuple(t + dl for t, dl in zip(stack.init_state(x0), deltas[0]))
        perturbed = [state]
        for l in range(stack.S):
            new, _, _ = stack.sublayer(l, state, history=stack.history_at(l, perturbed))
            state = tuple(t + dl for t, dl in zip(new, deltas[l + 1]))
            perturbed.append(state)
        y = stack.output(state).reshape(-1)
        flat = [dl for st in deltas for dl in st]
        rows = []
        for c in range(y.numel()):
            grads = torch.autograd.grad(y[c], flat, retain_graph=True, allow_unused=True)
            rows.append([g if g is not None else torch.zeros_like(dl) for g, dl in zip(grads, flat)])
    fro, spectral, i = [], [], 0
    for st in deltas:
        J = torch.stack([torch.cat([r[i + j].reshape(-1) for j in range(len(st))]) for r in rows])
        i += len(st)
        fro.append(math.log10(float(J.norm())))
        spectral.append(math.log10(float(torch.linalg.matrix_norm(J, ord=2))))
    return fro, spectral


# [P] `qkv_norm` -> the q/k/v norm of gradflow_reference.attention that the page describes
QK_VARIANTS = {"none": "none", "per_head_qkv": "qkv-per-head", "full_qk": "qk-full", "per_head_qk_unit": "ngpt"}


def attention(x, W, heads, qkv_norm, score_scale, ops=None):
    """[P] F for attention with `qkv_norm` and `score_scale`: Q = x W_Q, K = x W_K, V = x W_V, per head
    softmax(causal(score_scale * Q_h K_h^T)) V_h, heads concatenated, @ W_O (docs/placements.md), through the
    reference's own attention: per_head_qkv is RMSNorm on each head's q, k and v (HybridNorm), full_qk RMSNorm
    over the full q and k (OLMo 2), per_head_qk_unit unit q and k per head (nGPT); [P] q/k/v norms are RMSNorm
    whatever --norm is. `ops` (R.block_ops): shared key/value heads, rotary embeddings, the norm epsilon."""
    ops = ops or {}
    eps = ops.get("eps", R.EPS)
    return R.attention(x, W, heads, QK_VARIANTS[qkv_norm], lambda v: R.rms_norm(v, eps), ops.get("kv_heads"),
                       ops.get("rope"), score_scale)


# ----------------------------------------------------------------------------------------------
# From an export
# ----------------------------------------------------------------------------------------------
def fnv1a64(data):
    """[P] placement_file.hash: FNV-1a 64-bit of the file's bytes, written 'fnv1a64:' + 16 hex digits."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"fnv1a64:{h:016x}"


def build_from_export(placement, path, overrides=None):
    """(stack, x0, probes, cfg, notes) for a placement file on gradflow's exported weights. `overrides`
    (block, norm, heads, and issue 19's R.OPS_KEYS) are what the caller asked gradflow for and take
    precedence over the config."""
    arch, cfg, meta, x0, probes, weights = R.load_export(path)
    ov = {k: v for k, v in (overrides or {}).items() if v is not None}
    notes = []
    if arch != placement.id:
        notes.append(f"export's arch is '{arch}' but the file's id is '{placement.id}'")
    T, d = x0.shape
    branch = cfg.get("branch") or "model"
    S = int(cfg["sublayers"]) if branch == "rotation" else len(weights)
    if branch == "rotation":
        weights = [{} for _ in range(S)]
    heads = int(ov.get("heads", cfg.get("heads", 1)))
    ops = R.block_ops({**cfg, **{k: ov[k] for k in R.OPS_KEYS if k in ov}}, heads, d)
    options, onotes = options_of_run(placement, cfg, ov)
    notes += onotes
    stack = FileStack(placement, weights, heads, ov.get("block", cfg.get("block", "attn-ffn")),
                      ov.get("norm", cfg.get("norm", "rms")), d, T, branch, S, ops, options)
    return stack, x0, probes, cfg, notes


def options_of_run(placement, cfg, ov):
    """(key -> (value, given), notes): the values of the file's `[options.KEY]` in the run. In order:
    1. `ov[KEY]` (the caller's overrides, e.g. {"alpha": 2, "keel_variant": "v1"}): given with the flag;
    2. the run's config.constants record of a constant bound to the option whose formula is the option's flag
       ([P]: the formula is "--alpha" when the option was given): given, with the recorded value;
    3. config[KEY] (an option with in_run_config): the value the run used, counted as given when it differs
       from the default;
    4. otherwise not given: the option's default.
    compare.py's file_reference passes no option flags, so for it 2 and 3 are where a run's options come from
    (the value of an option-bound constant is then gradflow's own; what depends on it is still recomputed)."""
    jc = cfg.get("constants") or {}
    given, notes = {}, []
    for key, opt in placement.options.items():
        if ov.get(key) is not None:
            given[key] = ov[key]
            continue
        bound = [n for n, c in placement.const.items() if c.option == key]
        rec = next((jc[n] for n in bound if isinstance(jc.get(n), dict) and jc[n].get("formula") == opt.flag), None)
        if rec is not None and R._num(rec.get("value")) is not None:
            given[key] = R._num(rec["value"])
            notes.append(f"option {key} = {given[key]!r} read from the run's config.constants (formula {opt.flag})")
        elif cfg.get(key) is not None:
            val = cfg[key] if opt.is_word else R._num(cfg[key])
            if val is not None and val != opt.default:
                given[key] = val
                notes.append(f"option {key} = {val!r} read from the run's config.{key}")
    return placement.option_values(given), notes


def run_reference(placement, path, overrides=None, built=None):
    """The figures of `placement` on the weights exported to `path`; `built`, a list, receives the stack, x_0
    and the probes (for --update's own optimizer step, gradflow_reference.model_update)."""
    stack, x0, probes, cfg, notes = build_from_export(placement, path, overrides)
    if built is not None:
        built.extend([stack, x0, probes])
    res = analyze_history(stack, x0, probes) if stack.history_streams else R.analyze(stack, x0, probes)
    res["sublayers"]["skip_gain_theory"] = stack.skip_gain_theory()
    res.update({"arch": placement.id, "constants": stack.constants_at_last_sublayer(),
                "constant_records": stack.constant_records_at_last_sublayer(),
                "options": {k: v for k, (v, _) in stack.options.items()}, "notes": notes})
    return res


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    return PlacementFile(data.decode("utf-8"), path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("placement", help="a placement file (.toml)")
    p.add_argument("export", help="gradflow analyze --export-weights FILE.safetensors of that placement")
    p.add_argument("-o", "--output")
    a = p.parse_args(argv)
    try:
        res = run_reference(load(a.placement), a.export)
    except (OSError, ValueError, KeyError) as e:
        print(f"placement_file: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=1, allow_nan=True)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
