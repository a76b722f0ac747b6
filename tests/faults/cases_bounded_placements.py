"""Fault table: placement files that are hostile rather than mistaken (issue 34, docs/placement-files.md
"Limits"): nesting that would overflow the stack, rules long enough to expose quadratic parsing,
symbolic link loops, FIFOs, devices and directories where a file belongs, reserved or malformed ids
and aliases, repeated stream names. Each must end with exit 2 and one line naming the file (and the
line and column where there is one) and the fix, within seconds, in bounded memory, leaving nothing
behind; the few valid ones (just inside a limit) must run.

The campaign's examples are here as given (3,000 parentheses, a constant nested 5,000 deep, 100,000
unary minuses, N(N(...)) 5,000 deep, rules of 8,000 and 100,000 terms) and 10 times larger or deeper,
under a 5 s timeout and an address-space limit (RLIMIT_AS) of 400 MB."""
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402

TINY = ["--depth", "2", "--width", "16", "--heads", "2", "--seq", "4"]
HEAD = 'id = "bad"\ncitation = "a test"\nexpected_growth = "sqrt"\noutput = "N(x)"\n'
RULE = "x <- x + F(N(x))"
ADDRESS_SPACE = 400 * 1024 * 1024


def bounded():
    """Run in the child: address space limited, so a runaway allocation fails instead of swapping."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def sublayer(rule, extra=""):
    return f'[[sublayer]]\nrule = "{rule}"\n{extra}'


def analyze(path="{dir}/p.toml"):
    return ["analyze", "--arch", path, *TINY, "-o", "{dir}/out.json"]


def archs(path="{dir}/p.toml"):
    return ["archs", "--arch", path]


def heavy(name, text, message, timeout=5.0, exit=2):
    """A large or deep file, through archs and through analyze, bounded in time and memory."""
    out = []
    run = analyze() if exit else ["analyze", "--arch", "{dir}/p.toml", *TINY, "--format", "json", "-q"]
    for command, args in (("archs", archs()), ("analyze", run)):
        out.append(Case(f"{name} ({command})", args, message=message, exit=exit, files={"p.toml": text},
                        timeout=timeout, preexec=bounded, one_line=exit != 0, quiet_stdout=exit != 0))
    return out


def at(message):
    return r"p\.toml:\d+:\d+: " + message


NESTING = at(r"more than 200 levels of nesting")
DEPTH = r"more than 1000 operations deep"
TOO_LARGE = r"p\.toml: \d+ bytes, more than the 1048576 bytes \(1 MiB\)"


def parentheses(n):
    return "(" * n + "x" + ")" * n


def calls(name, n, inner="x"):
    return f"{name}(" * n + inner + ")" * n


def terms(n):
    """x <- x + F(N(x)) + x + ... : a rule of n terms."""
    return "x <- x + F(N(x))" + " + x" * (n - 2)


def chained_constants(n):
    lines = ["[constants]", 'c0 = "1"'] + [f'c{k} = "c{k - 1}"' for k in range(1, n)]
    return HEAD + "\n".join(lines) + "\n" + sublayer(f"x <- x + c{n - 1}*F(N(x))")


def chained_bindings(n):
    statements = ["b0 = F(N(x))"] + [f"b{k} = N(b{k - 1})" for k in range(1, n)] + [f"x <- x + b{n - 1}"]
    return HEAD + sublayer("; ".join(statements))


def recursion_cases():
    cases = []
    for scale, tag in ((1, ""), (10, ", 10x")):
        cases += heavy(f"{3000 * scale} parentheses in a rule{tag}",
                       HEAD + sublayer(f"x <- x + F(N({parentheses(3000 * scale)}))"), NESTING)
        cases += heavy(f"{3000 * scale} parentheses in a condition{tag}",
                       HEAD + sublayer(RULE, f'when = "{parentheses(3000 * scale).replace("x", "l == 0")}"\n') +
                       sublayer(RULE), NESTING)
        cases += heavy(f"a constant nested {5000 * scale} deep{tag}",
                       HEAD + f'[constants]\na = "{parentheses(5000 * scale).replace("x", "1")}"\n' +
                       sublayer("x <- x + a*F(N(x))"), NESTING)
        cases += heavy(f"{100000 * scale} unary minuses{tag}",
                       HEAD + sublayer("x <- x + " + "-" * (100000 * scale) + "F(N(x))"), NESTING)
        cases += heavy(f"N(N(...)) {5000 * scale} deep{tag}",
                       HEAD + sublayer(f"x <- x + F({calls('N', 5000 * scale)})"), NESTING)
    cases += heavy("sqrt(sqrt(...)) 5000 deep in a constant",
                   HEAD + f'[constants]\na = "{calls("sqrt", 5000, "2")}"\n' + sublayer("x <- x + a*F(N(x))"),
                   NESTING)
    cases += heavy("2^2^...^2 with 100000 powers",
                   HEAD + '[constants]\na = "' + "2^" * 100000 + '1"\n' + sublayer("x <- x + a*F(N(x))"), NESTING)
    cases += heavy("not not ... 100000 times in a condition",
                   HEAD + sublayer(RULE, 'when = "' + "not " * 100000 + 'l == 0"\n') + sublayer(RULE), NESTING)
    cases += heavy("a chain of 5000 constants", chained_constants(5000), at(DEPTH))
    cases += heavy("a chain of 50000 constants, 10x", chained_constants(50000), at(DEPTH))
    cases += heavy("a chain of 2000 bindings", chained_bindings(2000), at(DEPTH))
    cases += heavy("a sum of 30 groups of 500 terms (over 10000 names and operators)",
                   HEAD + sublayer("x <- x + F(N(x)) + " + " + ".join(["(" + "+".join(["x"] * 500) + ")"] * 30)),
                   at(r"more than 10000 numbers, names and operators in one string"))
    # Just inside the limits: still a valid placement.
    cases += heavy("190 parentheses are allowed", HEAD + sublayer(f"x <- x + F(N({parentheses(190)}))"), "",
                   exit=0)
    cases += heavy("a sum of 990 terms is allowed", HEAD + sublayer(terms(990)), "", exit=0)
    cases += heavy("60 constants each using the one before twice (a walk per use is 2^60)",
                   HEAD + "[constants]\nc0 = \"1\"\n" +
                   "".join(f'c{k} = "c{k - 1} + c{k - 1} - c{k - 1}"\n' for k in range(1, 60)) +
                   sublayer("x <- x + c59*F(N(x))"), "", exit=0)
    return cases


def quadratic_cases():
    cases = []
    for n in (8000, 100000, 80000):
        cases += heavy(f"a rule of {n} terms", HEAD + sublayer(terms(n)), at(DEPTH))
    cases += heavy("a rule of 1000000 terms (over 1 MiB), 10x", HEAD + sublayer(terms(1000000)), TOO_LARGE)
    many = "".join(f'c{k} = "{k}"\n' for k in range(40000))
    cases += heavy("40000 constants, the last one broken",
                   HEAD + "[constants]\n" + many + 'zz = "qq"\n' + sublayer("x <- x + c1*F(N(x))"),
                   at(r"unknown name 'qq'"))
    inline = ", ".join(f'c{k} = "{k}"' for k in range(40000))
    cases += heavy("40000 constants on one line, the last one broken",
                   HEAD + "constants = { " + inline + ', zz = "qq" }\n' + sublayer("x <- x + c1*F(N(x))"),
                   at(r"unknown name 'qq'"))
    cases += heavy("a file of 2 MiB", HEAD + "#" * (2 << 20) + "\n" + sublayer(RULE), TOO_LARGE)
    options = "".join(f'[options.o{k}]\nhelp = "h"\ndefault = 1\n' for k in range(20000))
    cases += heavy("20000 options", HEAD + options + sublayer(RULE), at(r"more than 64 options"))
    cases.append(in_placements("20000 options in GRADFLOW_PLACEMENTS", None, r"mine/p\.toml:\d+:\d+: more than 64 options",
                               files={"mine/p.toml": HEAD + options + sublayer(RULE)}))
    entries = "".join(sublayer(RULE, f'when = "l == {k + 100}"\n') for k in range(15000))
    cases += heavy("15000 [[sublayer]] entries", HEAD + entries + sublayer(RULE),
                   at(r"more than 1000 \[\[sublayer\]\] entries"))
    parts = ".".join(["a"] * 500000)
    cases += heavy("a dotted key of 500000 parts", HEAD + parts + " = 1\n" + sublayer(RULE),
                   r"p\.toml:5:\d+: a key of more than 64 dotted parts")
    cases += heavy("a table header of 500000 parts", HEAD + sublayer(RULE) + "[" + parts + "]\nz = 1\n",
                   r"p\.toml:7:\d+: a key of more than 64 dotted parts")
    streams = ", ".join(f'"s{k}"' for k in range(100000))
    cases += heavy("100000 streams", HEAD + f"streams = [{streams}]\n" + sublayer(RULE),
                   at(r"more than 64 streams; a placement has a few"))
    return cases


def make_fifo(name):
    return lambda directory: os.mkfifo(os.path.join(directory, name))


def link(name, target):
    def setup(directory):
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)
    return setup


def steps(*functions):
    def setup(directory):
        for function in functions:
            function(directory)
    return setup


def sparse(name, size):
    def setup(directory):
        with open(os.path.join(directory, name), "wb") as handle:
            handle.truncate(size)
    return setup


def in_placements(name, setup, message, files=None, args=None, exit=2):
    """A case whose GRADFLOW_PLACEMENTS directory is mine/ (as every run reads it)."""
    return Case(name, args or ["analyze", "--arch", "pre-ln", *TINY, "-o", "{dir}/out.json"],
                message=message, env={"GRADFLOW_PLACEMENTS": "mine"}, setup=setup, files=files or {},
                timeout=5, exit=exit, one_line=exit != 0, quiet_stdout=exit != 0)


VALID = HEAD.replace('"bad"', '"mine"') + sublayer(RULE)
LOOP = r"a symbolic link loop \(too many levels of symbolic links\); fix the link"


def loop_cases():
    return [
        in_placements("a link to itself in GRADFLOW_PLACEMENTS", link("mine/loop.toml", "loop.toml"),
                      r"mine/loop\.toml: " + LOOP),
        in_placements("a link to itself in GRADFLOW_PLACEMENTS (archs)", link("mine/loop.toml", "loop.toml"),
                      r"mine/loop\.toml: " + LOOP, args=["archs"]),
        in_placements("two links to each other in GRADFLOW_PLACEMENTS",
                      steps(link("mine/a.toml", "b.toml"), link("mine/b.toml", "a.toml")),
                      r"mine/a\.toml: " + LOOP),
        in_placements("a GRADFLOW_PLACEMENTS directory that is a link loop", link("mine", "mine"),
                      r"mine: cannot list this placement directory \(a symbolic link loop"),
        in_placements("a GRADFLOW_PLACEMENTS entry that is a file", None,
                      r"mine: cannot list this placement directory \(Not a directory\)", files={"mine": "x"}),
        in_placements("a dangling link in GRADFLOW_PLACEMENTS", link("mine/gone.toml", "nowhere.toml"),
                      r"mine/gone\.toml: cannot read the placement file \(No such file or directory\)"),
        in_placements("a directory link loop inside GRADFLOW_PLACEMENTS is not entered",
                      steps(link("mine/sub", "."), link("mine/up", "..")), "", files={"mine/ok.toml": VALID},
                      args=["archs", "--arch", "mine"], exit=0),
        Case("--arch naming a link to itself (archs)", archs("{dir}/loop.toml"), message=r"loop\.toml: " + LOOP,
             setup=link("loop.toml", "loop.toml"), timeout=5),
        Case("--arch naming a link to itself (analyze)", analyze("{dir}/loop.toml"),
             message=r"loop\.toml: " + LOOP, setup=link("loop.toml", "loop.toml"), timeout=5),
        Case("--arch naming a link to a valid file runs", archs("{dir}/link.toml"), exit=0, one_line=False,
             quiet_stdout=False, files={"real.toml": VALID}, setup=link("link.toml", "real.toml"), timeout=5),
    ]


NOT_REGULAR = r"not a placement file; give the path of a regular \.toml file"


def special_file_cases():
    cases = []
    for command, args in (("archs", archs), ("analyze", analyze)):
        cases += [
            Case(f"a FIFO as the placement file ({command})", args(), setup=make_fifo("p.toml"), timeout=5,
                 message=r"p\.toml: a FIFO \(named pipe\), " + NOT_REGULAR),
            Case(f"a link to /dev/null as the placement file ({command})", args("{dir}/null.toml"), timeout=5,
                 setup=link("null.toml", "/dev/null"), message=r"null\.toml: a character device, " + NOT_REGULAR),
            Case(f"a link to /dev/zero as the placement file ({command})", args("{dir}/zero.toml"), timeout=5,
                 setup=link("zero.toml", "/dev/zero"), preexec=bounded,
                 message=r"zero\.toml: a character device, " + NOT_REGULAR),
            Case(f"a directory as the placement file ({command})", args("{dir}/d.toml"), timeout=5,
                 setup=lambda directory: os.mkdir(os.path.join(directory, "d.toml")),
                 message=r"d\.toml: a directory, " + NOT_REGULAR),
            Case(f"a sparse file of 1 GiB as the placement file ({command})", args(), timeout=5, preexec=bounded,
                 setup=sparse("p.toml", 1 << 30), message=r"p\.toml: 1073741824 bytes, more than the 1048576"),
        ]
    cases += [
        Case("a link to a FIFO as the placement file", archs("{dir}/link.toml"), timeout=5,
             setup=steps(make_fifo("fifo"), link("link.toml", "fifo")),
             message=r"link\.toml: a FIFO \(named pipe\), " + NOT_REGULAR),
        in_placements("a FIFO in GRADFLOW_PLACEMENTS",
                      steps(lambda d: os.mkdir(os.path.join(d, "mine")), make_fifo("mine/p.toml")),
                      r"mine/p\.toml: a FIFO \(named pipe\), " + NOT_REGULAR),
        in_placements("a directory named *.toml in GRADFLOW_PLACEMENTS",
                      lambda d: os.makedirs(os.path.join(d, "mine", "d.toml")),
                      r"mine/d\.toml: a directory, " + NOT_REGULAR),
        in_placements("a link to /dev/zero in GRADFLOW_PLACEMENTS", link("mine/zero.toml", "/dev/zero"),
                      r"mine/zero\.toml: a character device, " + NOT_REGULAR),
        in_placements("a file of 2 MiB in GRADFLOW_PLACEMENTS", None,
                      r"mine/p\.toml: \d+ bytes, more than the 1048576 bytes",
                      files={"mine/p.toml": VALID + "#" * (2 << 20) + "\n"}),
    ]
    return cases


def named(head_id='"bad"', extra=""):
    return HEAD.replace('"bad"', head_id) + extra + sublayer(RULE)


NOT_A_NAME = r"expected an {} of lower-case letters, digits and '-', starting with a letter, not "


def name_cases():
    cases = []
    for command, args in (("archs", archs), ("analyze", analyze)):
        cases += [
            Case(f"the id 'all' ({command})", args(), files={"p.toml": named('"all"')},
                 message=at(r'the id "all" is reserved \(--arch all means every placement\); choose another')),
            Case(f"the alias '../x' ({command})", args(), files={"p.toml": named(extra='aliases = ["../x"]\n')},
                 message=at(NOT_A_NAME.format("alias") + r'"\.\./x"')),
        ]
    bad_ids = {"empty": "", "a path": "../x", "a leading '-'": "-x", "upper case": "Pre-LN", "a .toml name": "x.toml",
               "a comma": "a,b", "a space": "pre ln", "a newline": "a\\nb"}
    for what, value in bad_ids.items():
        cases.append(Case(f"an id with {what}", archs(), files={"p.toml": named(f'"{value}"')},
                          message=at(NOT_A_NAME.format("id"))))
        cases.append(Case(f"an alias with {what}", archs(), files={"p.toml": named(extra=f'aliases = ["{value}"]\n')},
                          message=at(NOT_A_NAME.format("alias"))))
    cases += [
        Case("the alias 'all'", archs(), files={"p.toml": named(extra='aliases = ["mine", "all"]\n')},
             message=at(r'the alias "all" is reserved')),
        Case("an alias that repeats the id", archs(), files={"p.toml": named(extra='aliases = ["bad"]\n')},
             message=at(r'alias "bad" repeats the id or another alias; remove it')),
        Case("an alias given twice", archs(), files={"p.toml": named(extra='aliases = ["b1", "b2", "b1"]\n')},
             message=r'p\.toml:5:\d+: alias "b1" repeats the id or another alias; remove it'),
        Case("an alias that is a built-in's id", archs(), files={"p.toml": named(extra='aliases = ["keel"]\n')},
             message=at(r"placement 'keel' is already defined by built-in")),
        in_placements("the id 'all' in GRADFLOW_PLACEMENTS", None, r"mine/p\.toml:1:\d+: the id \"all\" is reserved",
                      files={"mine/p.toml": named('"all"')}),
        in_placements("the alias '../x' in GRADFLOW_PLACEMENTS", None,
                      r"mine/p\.toml:5:\d+: " + NOT_A_NAME.format("alias"),
                      files={"mine/p.toml": named(extra='aliases = ["../x"]\n')}),
    ]
    for command, args in (("archs", archs), ("analyze", analyze)):
        cases.append(Case(f"a stream named twice ({command})", args(),
                          files={"p.toml": named(extra='streams = ["x", "x"]\n')},
                          message=r"p\.toml:5:17: stream 'x' is named twice in streams; give each stream its own name"))
    cases += [
        Case("a stream named twice among others", archs(),
             files={"p.toml": named(extra='streams = ["x", "h", "x"]\n')}, message=at(r"stream 'x' is named twice")),
        Case("a stream whose name is not a name", archs(), files={"p.toml": named(extra='streams = ["x", "x-y"]\n')},
             message=at(r'"x-y" cannot be a stream name')),
        in_placements("a stream named twice in GRADFLOW_PLACEMENTS", None, r"mine/p\.toml:5:\d+: stream 'x' is named twice",
                      files={"mine/p.toml": named(extra='streams = ["x", "x"]\n')}),
    ]
    return cases


CASES = recursion_cases() + quadratic_cases() + loop_cases() + special_file_cases() + name_cases()

if __name__ == "__main__":
    run_table(CASES)
