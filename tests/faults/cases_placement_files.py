"""Fault table: malformed placement files (docs/placement-files.md). Each must stop gradflow with
exit 2 and one line `gradflow: error: FILE:LINE:COLUMN: what was expected` (with a suggestion for a
misspelt name), before any work and with nothing written."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402

TINY = ["--depth", "2", "--width", "16", "--heads", "2", "--seq", "4"]
HEAD = 'id = "bad"\ncitation = "a test"\nexpected_growth = "sqrt"\noutput = "N(x)"\n'


def placement(name, body, message, head=HEAD, args=None):
    """A case: p.toml holds head + body; analyze it into out.json (which must not appear)."""
    command = args or ["analyze", "--arch", "{dir}/p.toml", *TINY, "-o", "{dir}/out.json"]
    return Case(name, command, message=r"p\.toml:\d+:\d+: " + message, files={"p.toml": head + body})


def rule(text):
    return f'[[sublayer]]\nrule = "{text}"\n'


def two_definitions():
    """Two analyze documents of placement 'mine' made from two different files."""
    import subprocess
    import tempfile
    docs = {}
    with tempfile.TemporaryDirectory() as directory:
        for name, update in (("a", "x + F(N(x))"), ("b", "x + 0.5*F(N(x))")):
            path = os.path.join(directory, f"{name}.toml")
            with open(path, "w") as handle:
                handle.write(HEAD.replace('"bad"', '"mine"') + rule(f"x <- {update}"))
            out = subprocess.run([sys.argv[1], "analyze", "--arch", path, *TINY, "--format", "json", "-q"],
                                 capture_output=True, text=True, check=True)
            docs[f"{name}.json"] = out.stdout
    return docs


CASES = [
    placement("F used twice", rule("x <- x + F(x) + F(x)"), r"F is used a second time"),
    placement("F never used", rule("x <- N(x)"), r"F \(the branch\) is never used"),
    placement("unknown name, with a suggestion", '[constants]\nalpha = 2\n' + rule("x <- N(alpah*x + F(x))"),
              r"unknown name 'alpah'; did you mean 'alpha'\?"),
    placement("unbalanced parentheses", rule("x <- x + F(N(x)"), r"expected '\)' to close F\("),
    placement("constant is NaN", '[constants]\na = "sqrt(0 - 1)"\n' + rule("x <- x + a*F(N(x))"),
              r"evaluates to NaN .*expected a finite value"),
    placement("constant is infinite", '[constants]\na = "1/(S - S)"\n' + rule("x <- x + a*F(N(x))"),
              r"evaluates to infinity .*expected a finite value"),
    placement("negative init gain", '[init_gain]\nv = "-1"\n' + rule("x <- x + F(N(x))"),
              r"an init gain must be >= 0, not -1"),
    # [learning_rate_scale] (issue 30): a table of sgd / adam constant expressions, positive at every sublayer
    placement("learning_rate_scale not a table", 'learning_rate_scale = "2"\n' + rule("x <- x + F(N(x))"),
              r"expected \[learning_rate_scale\] as a table"),
    placement("learning_rate_scale unknown rule", '[learning_rate_scale]\nmomentum = "2"\n' + rule("x <- x + F(N(x))"),
              r"unknown key 'momentum' in \[learning_rate_scale\] \(the update rules sgd adam\)"),
    placement("learning_rate_scale zero at a sublayer", '[learning_rate_scale]\nsgd = "1 - l"\n' + rule("x <- x + F(N(x))"),
              r"\[learning_rate_scale\] sgd must be > 0, not 0, at sublayer l = 1 .*positive at every sublayer"),
    placement("learning_rate_scale infinite", '[learning_rate_scale]\nadam = "1/(S - S)"\n' + rule("x <- x + F(N(x))"),
              r"evaluates to infinity"),
    placement("learning_rate_scale unknown name", '[learning_rate_scale]\nadam = "eta_scale"\n' + rule("x <- x + F(N(x))"),
              r"unknown name 'eta_scale'"),
    placement("stream assigned twice", rule("x <- x + F(x); x <- N(x)"), r"stream 'x' is assigned twice"),
    placement("no rule for some sublayer", '[[sublayer]]\nwhen = "l == 0"\nrule = "x <- x + F(N(x))"\n',
              r"no \[\[sublayer\]\] entry's 'when' holds for sublayer l = 1"),
    placement("unknown key, with a suggestion", 'citaton = "typo"\n' + rule("x <- x + F(N(x))"),
              r"unknown key 'citaton' in the placement file; did you mean 'citation'\?"),
    placement("missing output head", rule("x <- x + F(N(x))"), r"missing required key 'output'",
              head='id = "bad"\ncitation = "a test"\nexpected_growth = "sqrt"\n'),
    placement("not TOML", 'rule = "x <- x\n', r"not valid TOML"),
    placement("unknown function", rule("x <- x + F(nrm(x))"), r"unknown function 'nrm'"),
    placement("F in the output head", rule("x <- x + F(N(x))"), r"F \(the branch\) can only be used in a",
              head='id = "bad"\ncitation = "a test"\nexpected_growth = "sqrt"\noutput = "F(x)"\n'),
    placement("tensor plus constant", rule("x <- x + F(x) + 1"), r"'\+' between a tensor and a constant"),
    placement("product of two tensors", rule("x <- x * F(x)"), r"a product of two tensors"),
    placement("assignment to an unknown stream", rule("y <- x + F(x)"), r"'y' is not a stream \(streams: x\)"),
    placement("constants in a cycle", '[constants]\na = "c"\nc = "a"\n' + rule("x <- x + a*F(x)"),
              r"constant 'a' depends on itself"),
    placement("unknown growth class", rule("x <- x + F(N(x))"), r"expected_growth is one of vanishing",
              head='id = "bad"\ncitation = "a test"\nexpected_growth = "cubic"\noutput = "N(x)"\n'),
    placement("unused binding", rule("o = F(x); p = N(x); x <- x + o"), r"binding 'p' is never used"),
    placement("qkv_norm misspelt, with a suggestion", rule("x <- x + F(x)") + 'qkv_norm = "full_q"\n',
              r"qkv_norm is one of .*did you mean 'full_qk'\?"),
    placement("id of a built-in", rule("x <- x + F(N(x))"), r"placement 'pre-ln' is already defined by built-in",
              head='id = "pre-ln"\ncitation = "a test"\nexpected_growth = "sqrt"\noutput = "N(x)"\n'),
    placement("fewer expressions than streams", rule("x, h <- x + F(x)"), r"2 stream\(s\) assigned but 1",
              head=HEAD + 'streams = ["x", "h"]\n'),
    placement("a sweep refuses it too", rule("x <- x + G(x)"), r"unknown function 'G'",
              args=["sweep", "--arch", "{dir}/p.toml", "--depth", "2", "--width", "16", "-o", "{dir}/sweep"]),
    # [options.KEY], option-bound constants and [[requires]] (the built-ins' files use them).
    placement("word option whose default is not a choice",
              '[options.variant]\nhelp = "h"\nchoices = ["v1", "v2"]\ndefault = "v3"\n' + rule("x <- x + F(N(x))"),
              r'default "v3" is not one of the choices v1, v2'),
    placement("option range that is not an interval",
              '[options.ratio]\nhelp = "h"\ndefault = 0.5\nrange = "0 to 1"\n' + rule("x <- x + F(N(x))"),
              r'range "0 to 1": expected an interval such as "\[0, 1\]"'),
    placement("option default outside its range",
              '[options.ratio]\nhelp = "h"\ndefault = 2\nrange = "[0, 1]"\n' + rule("x <- x + F(N(x))"),
              r"default 2 is outside the option's range"),
    placement("option key misspelt, with a suggestion",
              '[options.ratio]\nhelp = "h"\ndefualt = 0.5\n' + rule("x <- x + F(N(x))"),
              r"unknown key 'defualt' in \[options.ratio\]; did you mean 'default'\?"),
    placement("option without a default", '[options.ratio]\nhelp = "h"\n' + rule("x <- x + F(N(x))"),
              r"option 'ratio': expected a default \(or a default_text\)"),
    placement("condition on an undeclared option", rule("x <- x + F(N(x))") + 'when = "variant == v1"\n' +
              rule("x <- x + F(N(x))"), r"unknown name 'variant'"),
    placement("word option compared with a word it does not have",
              '[options.variant]\nhelp = "h"\nchoices = ["v1", "v2"]\ndefault = "v2"\n' + rule("x <- x + F(N(x))") +
              'when = "variant == v3"\n' + rule("x <- x + F(N(x))"), r"variant is compared with one of v1, v2"),
    placement("constant bound to an undeclared option",
              '[constants]\na = { value = "1", option = "alpha" }\n' + rule("x <- x + a*F(N(x))"),
              r"'alpha' is not a number option of this file \(declare \[options.alpha\]\)"),
    placement("option declared differently from a built-in's",
              '[options.alpha]\nhelp = "h"\ndefault = 0.5\nrange = "[0, 1]"\n' + rule("x <- x + F(N(x))"),
              r"option 'alpha' is declared differently by 'deepnorm'"),
    placement("requirement that is not a condition", '[[requires]]\ncondition = "S"\nmessage = "m"\n' +
              rule("x <- x + F(N(x))"), r"expected a condition"),
    Case("requirement the run's depth does not meet", ["analyze", "--arch", "{dir}/p.toml", *TINY, "-o", "{dir}/out.json"],
         message=r"--arch bad at S = 4, B = 2: bad needs at least 8 sublayers; try --depth 4",
         files={"p.toml": HEAD + '[[requires]]\ncondition = "S >= 8"\nmessage = "bad needs at least 8 sublayers; '
                'try --depth 4"\n' + rule("x <- x + F(N(x))")}),
    # attend (docs/placement-files.md, "Reading a history")
    placement("attend of a binding, not a stream", rule("o = F(N(x)); x <- attend(o, o)"),
              r"attend's first argument is a stream name"),
    placement("attend with one argument", rule("x <- attend(x) + F(N(x))"),
              r"attend\(\.\.\.\) takes a stream, a tensor and an optional constant query, not 1 argument"),
    placement("attend with a tensor as its query", rule("o = F(N(x)); x <- attend(x, o, o)"),
              r"expected a constant expression"),
    placement("attend in the output head", rule("x <- x + F(N(x))"), r"attend\(\.\.\.\) can only be used in a "
              r"\[\[sublayer\]\] rule", head=HEAD.replace('output = "N(x)"', 'output = "N(attend(x, x))"')),
    # [history]: which states are a history's sources (docs/placement-files.md, "Reading a history")
    placement("history not a table", 'history = "l == 0"\n' + rule("x <- attend(x, F(N(x)))"),
              r"expected \[history\] as a table of stream = \"condition\""),
    placement("history of a name that is not a stream", '[history]\ny = "l == 0"\n' + rule("x <- attend(x, F(N(x)))"),
              r"\[history\] names 'y', which is not a stream \(streams = \[x\]\)"),
    placement("history of a stream no rule attends", '[history]\nx = "l == 0"\n' + rule("x <- x + F(N(x))"),
              r"\[history\] x: no rule reads x's history; write attend\(x, \.\.\.\)"),
    placement("history_sum of a binding, not a stream", rule("o = F(N(x)); x <- x + o + history_sum(o)"),
              r"history_sum\(\.\.\.\) takes one stream name"),
    placement("history_mean in the output head", rule("x <- x + F(N(x))"), r"history_mean\(\.\.\.\) can only be used "
              r"in a \[\[sublayer\]\] rule", head=HEAD.replace('output = "N(x)"', 'output = "N(history_mean(x))"')),
    Case("history_mean before any member state", ["analyze", "--arch", "{dir}/p.toml", *TINY, "-o", "{dir}/out.json"],
         message=r"history_mean\(\.\.\.\) reads a stream's history before any of its states is a member",
         files={"p.toml": HEAD + '[history]\nx = "l >= 1"\n' + rule("x <- x + F(N(history_mean(x)))")}),
    placement("history membership not a condition", '[history]\nx = "l + 1"\n' + rule("x <- attend(x, F(N(x)))"),
              r"expected a condition such as 'l == 0'"),
    # mix_fractions (docs/placement-files.md, "Slicing the width")
    placement("mix_fractions with two arguments", rule("x <- x + F(N(mix_fractions(x, 2)))"),
              r"mix_fractions\(\.\.\.\) takes a tensor, a fraction count m and a weight in fraction_out and "
              r"fraction_in, not 2 argument"),
    placement("mix_fractions of a constant", rule("x <- x + F(N(x)) + mix_fractions(2, 2, 1)"),
              r"expected a tensor expression"),
    placement("mix_fractions with a tensor weight", rule("x <- x + F(N(mix_fractions(x, 2, x)))"),
              r"expected a constant expression"),
    placement("fraction_out outside mix_fractions", rule("x <- x + fraction_out*F(N(x))"),
              r"'fraction_out' can only be used in the weight of mix_fractions"),
    placement("fraction_in in the fraction count", rule("x <- x + F(N(mix_fractions(x, fraction_in, 1)))"),
              r"'fraction_in' can only be used in the weight of mix_fractions"),
    placement("fraction_out in a constant", '[constants]\nw = "fraction_out"\n' + rule("x <- x + w*F(N(x))"),
              r"'fraction_out' can only be used in the weight of mix_fractions"),
    placement("mix_fractions whose m does not divide the width",
              rule("x <- x + F(N(mix_fractions(x, 3, 1)))"),
              r"mix_fractions's fraction count m = 3 must be a whole number that divides the width d = 16"),
    placement("mix_fractions whose m is not whole", rule("x <- x + F(N(mix_fractions(x, 1.5, 1)))"),
              r"mix_fractions's fraction count m = 1.5 must be a whole number"),
    placement("a constant named fraction_in", '[constants]\nfraction_in = "1"\n' + rule("x <- x + F(N(x))"),
              r"'fraction_in' is a reserved name"),
    placement("option that refuses without saying what it sets",
              '[options.ratio]\nhelp = "h"\ndefault = 0.5\nwhen_unused = "refuse"\n' + rule("x <- x + F(N(x))"),
              r"option 'ratio' refuses runs without it: say what it sets"),
    placement("word option whose choice is not a name",
              '[options.variant]\nhelp = "h"\nchoices = ["v1", "v-2"]\ndefault = "v1"\n' + rule("x <- x + F(N(x))"),
              r'choice "v-2": expected distinct names'),
    placement("constant named like an option it is not bound to",
              '[options.ratio]\nhelp = "h"\ndefault = 0.5\n[constants]\nratio = "0.3"\n' + rule("x <- x + ratio*F(N(x))"),
              r"constant 'ratio' has the name of option 'ratio' without being bound to it"),
    placement("option without a default used in an expression",
              '[options.ratio]\nhelp = "h"\ndefault_text = "the paper\'s"\n' + rule("x <- x + ratio*F(N(x))"),
              r"option 'ratio' has no default to use here; bind it to a constant"),
    # Files of GRADFLOW_PLACEMENTS are read before the flags are parsed (their options are flags).
    Case("a broken file in GRADFLOW_PLACEMENTS stops every run with its position",
         ["analyze", "--arch", "pre-ln", *TINY, "-o", "{dir}/out.json"], env={"GRADFLOW_PLACEMENTS": "mine"},
         message=r"mine/p\.toml:6:\d+: F is used a second time", files={"mine/p.toml": HEAD + rule("x <- x + F(F(x))")}),
    Case("an option whose flag gradflow already has", ["analyze", "--arch", "pre-ln", *TINY, "-o", "{dir}/out.json"],
         env={"GRADFLOW_PLACEMENTS": "mine"},
         message=r"mine/p\.toml:\d+:\d+: option 'width' would take the flag --width, which gradflow analyze already has",
         files={"mine/p.toml": HEAD + '[options.width]\nhelp = "h"\ndefault = 2\n' + rule("x <- x + F(N(x))")}),
    Case("a word option's value outside its choices, with the default as the fix",
         ["analyze", "--arch", "bad", "--variant", "v3", *TINY, "-o", "{dir}/out.json"], env={"GRADFLOW_PLACEMENTS": "mine"},
         message=r'--variant "v3" is not v1 or v2; try --variant v2',
         files={"mine/p.toml": HEAD + '[options.variant]\nhelp = "h"\nchoices = ["v1", "v2"]\ndefault = "v2"\n' +
                rule("x <- x + F(N(x))")}),
    Case("check refuses runs of two different definitions", ["check", "{dir}/a.json", "--baseline", "{dir}/b.json"],
         message=r"placement 'mine': the two runs were made with different placement definitions \(fnv1a64:",
         files=two_definitions()),
]

if __name__ == "__main__":
    run_table(CASES)
