"""Keyword arguments type-checked against the options they name, and never read as options
themselves (issue 51, item 9 and acceptance 5). Run with the rest of tests/python by ctest:

    PYTHONPATH=build/python GRADFLOW_BINARY=build/gradflow /usr/bin/python3 -m pytest tests/python

What each option takes (a flag, a whole number, a number, text; one value or a list) is the
command line's own declaration, which the native part hands over (gradflow._gradflow.options,
cli::option_table). The cases below are generated from that table as the native part gives it,
not from the module's Python, so a new option is covered without a line here, and the cases
hold a Python part that builds its command line otherwise to the same standard.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

try:
    import gradflow
except ImportError as error:  # a build without the module: say so, never pass silently
    pytest.exit(f"the gradflow module was not built or not found ({error}): install pybind11-dev and python3-dev, "
                "reconfigure with -DGRADFLOW_PYTHON=ON and set PYTHONPATH=build/python", returncode=1)

BINARY = os.path.abspath(os.environ.get("GRADFLOW_BINARY", "build/gradflow"))
SMALL = dict(depth=2, width=16, heads=2, seq=4, no_timing=True)
SWEEP_SMALL = dict(arch="keel", depth=[2], width=16, heads=2, seq=4)
SUBCOMMANDS = ("analyze", "sweep")
# Keywords the functions refuse or take as their own parameters, not as options.
REFUSED = {"format", "quiet", "help", "version"}
NOT_KEYWORDS = {"analyze": REFUSED, "sweep": REFUSED | {"plan"}, "check": REFUSED | {"baseline"}}
# The options whose rule refuses fractions though the flag reads a number (PlacementOption::whole):
# the MoE op's counts and the placement files' [[requires]] floor(X) == X.
WHOLE_BY_RULE = ("experts", "experts_active", "shared_expert_hidden", "num_fracs", "attnres_blocks")


@pytest.fixture(autouse=True)
def in_a_temporary_directory(tmp_path, monkeypatch):
    """Every case runs in its own directory: a value taken as a file name (or a module that does
    not refuse what it should) writes there, not where pytest was started."""
    monkeypatch.chdir(tmp_path)


def table(subcommand):
    """(keyword, row) for every long name of `subcommand`'s options, as the native part declares them."""
    code, message, rows = gradflow._gradflow.options(subcommand)
    assert code == 0 and rows, (subcommand, code, message)
    return [(name.replace("-", "_"), row) for row in rows for name in row["names"]]


def kind(row):
    return "flag" if row["flag"] else {"whole": "int", "real": "number", "text": "text"}[row["kind"]]


def options_of(subcommand, *kinds):
    """(keyword, row) of `subcommand`'s options of the given kinds, those its function refuses left out."""
    return [(key, row) for key, row in table(subcommand) if key not in NOT_KEYWORDS[subcommand] and kind(row) in kinds]


def call(subcommand, keyword, value):
    """`subcommand` on a small model with keyword=value in place of the small model's own."""
    if subcommand == "analyze":
        return gradflow.analyze(**{**{k: v for k, v in SMALL.items() if k != keyword}, keyword: value})
    options = {**{k: v for k, v in SWEEP_SMALL.items() if k != keyword}, keyword: value}
    return gradflow.sweep(options.pop("output", "out"), **options)


def valued(*kinds, subcommands=SUBCOMMANDS):
    return [pytest.param(sub, key, id=f"{sub}-{key}") for sub in subcommands for key, _ in options_of(sub, *kinds)]


def test_the_option_table_is_the_command_lines():
    """Every option the binary's help lists is in the table, and the kinds of a few are the ones
    the C++ declares: CLI11's INT and UINT, FLOAT, a CLI11 list, a comma-separated text list, and a
    number option whose rule refuses fractions."""
    for subcommand in ("analyze", "sweep", "check", "archs", "merge", "explain"):
        text = subprocess.run([BINARY, subcommand, "--help"], capture_output=True, text=True, check=True).stdout
        listed = {name.replace("-", "_") for name in re.findall(r"^  (?:-\w,)?--([\w-]+)", text, re.MULTILINE)}
        assert listed and {key for key, _ in table(subcommand)} == listed, subcommand
    analyze, sweep, check = (gradflow._options(sub) for sub in ("analyze", "sweep", "check"))
    kinds = {key: (option.kind, option.several) for key, option in analyze.items()}
    assert kinds["depth"] == ("int", "")
    assert kinds["seed"] == ("int", "")  # UINT
    assert kinds["no_timing"] == ("flag", "")
    assert kinds["lr"] == ("number", "repeat")  # a CLI11 list: one --lr=VALUE per value
    assert kinds["arch"] == ("text", "join")  # comma-separated in one value
    assert kinds["output"] == ("text", "")
    assert kinds["rope_theta"] == kinds["alpha"] == ("number", "")
    assert kinds["keel_variant"] == ("text", "")  # declared by the registry
    for key in WHOLE_BY_RULE:
        assert kinds[key] == ("int", ""), key
    assert (sweep["depth"].kind, sweep["depth"].several) == ("int", "join")
    assert (sweep["width"].kind, sweep["width"].several) == ("int", "join")
    assert (check["expect"].kind, check["expect"].several) == ("text", "repeat")
    assert check["max_rows"].kind == "int"
    gradflow._options.cache_clear()
    gradflow._options("analyze"), gradflow._options("analyze")
    assert gradflow._options.cache_info().misses == 1  # read once per process
    assert gradflow._gradflow.options("nope")[0] == 2


def placements_run(directory, code):
    """`code` in a new interpreter whose registry reads GRADFLOW_PLACEMENTS=directory (read once per
    process, so not in this one)."""
    env = {**os.environ, "GRADFLOW_PLACEMENTS": str(directory)}
    return subprocess.run([sys.executable, "-c", "import gradflow\n" + code], capture_output=True, text=True, env=env)


def test_a_broken_placement_file_raises_input_error_with_the_command_lines_line(tmp_path):
    (tmp_path / "broken.toml").write_text('id = "broken"\nupdate_rule = \n')
    expected = subprocess.run([BINARY, "analyze", "--depth", "2"], capture_output=True, text=True,
                              env={**os.environ, "GRADFLOW_PLACEMENTS": str(tmp_path)})
    assert expected.returncode == 2 and "broken.toml" in expected.stderr
    outcome = placements_run(tmp_path, "try:\n    gradflow.analyze(depth=2)\nexcept gradflow.InputError as e:\n"
                                       "    print(e)\n")
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.strip() == expected.stderr.strip()


def test_a_placement_files_whole_number_rule_makes_its_option_whole(tmp_path):
    """An option is a whole number when a [[requires]] says floor(KEY) == KEY (or of a constant it
    feeds, or as a term of an 'and'); one declared by two files is whole when both say so."""
    source = open(os.path.join(os.path.dirname(__file__), "..", "..", "data", "placements", "builtins",
                               "pre-ln.toml")).read()
    option = '\n[options.{key}]\nhelp = "a count"\ndefault = 2\nrange = "[1, inf)"\n'
    rule = '\n[[requires]]\ncondition = "{condition}"\nmessage = "--{flag} is a whole number"\n'
    files = {
        "a": option.format(key="my_count") + rule.format(condition="floor(my_count) == my_count", flag="my-count")
        + option.format(key="my_share") + option.format(key="my_both")
        + rule.format(condition="S >= 1 and my_both == floor(my_both)", flag="my-both"),
        "b": option.format(key="my_both") + "\n[constants]\nn = { option = \"my_both\" }\n"
        + rule.format(condition="floor(n) == n", flag="my-both")
        + option.format(key="my_half") + rule.format(condition="floor(my_half) == my_half or S > 1", flag="my-half"),
    }
    for name, extra in files.items():
        text = source.replace('id = "pre-ln"', f'id = "mine-{name}"', 1)
        head, sublayer = text.split("[[sublayer]]", 1)
        (tmp_path / f"{name}.toml").write_text(head + extra + "\n[[sublayer]]" + sublayer)
    outcome = placements_run(tmp_path, "t = gradflow._options('analyze')\n"
                                       "print(*(t[k].kind for k in ('my_count', 'my_share', 'my_both', 'my_half')))\n"
                                       "try:\n    gradflow.analyze(arch='mine-a', my_count=2.5)\n"
                                       "except TypeError as e:\n    print(e)\n")
    assert outcome.returncode == 0, outcome.stderr
    kinds, refusal = outcome.stdout.splitlines()
    assert kinds == "int number int number"
    assert refusal.startswith("my_count= takes a whole number")


def test_a_bool_for_a_valued_option_raises_type_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=r"output= takes a string"):
        gradflow.analyze(depth=2, output=True)
    assert list(tmp_path.iterdir()) == []  # no file named -q (the module's own next argument)


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("subcommand,keyword", valued("int", "number", "text"))
def test_a_bool_for_any_valued_option_raises_type_error(subcommand, keyword, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=rf"^{keyword}= takes .*, not {value} \(bool\)"):
        call(subcommand, keyword, value)
    assert list(tmp_path.iterdir()) == []


def command_line(subcommand, keyword, value):
    """The command line `call` stands for, written here with every value attached (--option=value)."""
    if subcommand == "analyze":
        options, words = {**{k: v for k, v in SMALL.items() if k != keyword}, keyword: value}, []
    else:
        options = {**{k: v for k, v in SWEEP_SMALL.items() if k != keyword}, keyword: value}
        words = [f"--output={options.pop('output', 'out')}"]
    for key, item in options.items():
        flag = "--" + key.replace("_", "-")
        words.append(flag if item is True else f"{flag}={','.join(map(str, item)) if isinstance(item, list) else item}")
    return [subcommand, *words, "-q"]


def leave_empty(directory):
    made = sorted(os.listdir(directory))
    for name in made:
        path = os.path.join(directory, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    return made


class Submitted(Exception):
    """Raised by a stand-in for the native run: the command line was built, and is not run."""


def command_line_built(monkeypatch, function, *args, **keywords):
    """The words `function(*args, **keywords)` hands to the native run, which is not run."""
    seen = []

    def run(words, *_, **__):
        seen.append(list(words))
        raise Submitted

    monkeypatch.setattr(gradflow._gradflow, "run", run)
    with pytest.raises(Submitted):
        function(*args, **keywords)
    return seen[0]


DASHED = ["-q", "--depth", "--", "-o=x"]


@pytest.mark.parametrize("value", DASHED)
@pytest.mark.parametrize("subcommand,keyword", valued("int", "number", "text", subcommands=("analyze", "sweep", "check")))
def test_a_value_starting_with_a_dash_is_attached_to_its_option(subcommand, keyword, value, monkeypatch):
    """No value, whatever it starts with, is a word of its own that could be read as an option: it
    is one word with its option, --option=VALUE (CLI11 2.1.2 happens to take a separate next word
    as the value whatever it starts with, so a run alone could not tell the two apart)."""
    flag = "--" + keyword.replace("_", "-")
    if subcommand == "analyze":
        words = command_line_built(monkeypatch, gradflow.analyze, **{keyword: value})
        assert words == ["analyze", f"{flag}={value}", "-q"]
    elif subcommand == "sweep" and keyword == "output":
        assert command_line_built(monkeypatch, gradflow.sweep, value) == ["sweep", f"--output={value}", "-q"]
    elif subcommand == "sweep":
        words = command_line_built(monkeypatch, gradflow.sweep, "out", **{keyword: value})
        assert words == ["sweep", "--output=out", f"{flag}={value}", "-q"]
    else:
        words = command_line_built(monkeypatch, gradflow.check, "r.json", "b.json", **{keyword: value})
        assert words == ["check", "--baseline=b.json", f"{flag}={value}", "--json", "--", "r.json"]


@pytest.mark.parametrize("value", DASHED)
def test_positional_values_starting_with_a_dash_follow_a_double_dash(value, monkeypatch):
    assert command_line_built(monkeypatch, gradflow.explain, value) == ["explain", "--", value]
    words = command_line_built(monkeypatch, gradflow.check, value, value)
    assert words == ["check", f"--baseline={value}", "--json", "--", value]


# One option of each shape for the runs below (the words of every option are checked above).
RUN_SAMPLE = [("analyze", "output"), ("analyze", "depth"), ("analyze", "rope_theta"), ("analyze", "init"),
              ("analyze", "arch"), ("analyze", "lr"), ("analyze", "keel_variant"), ("analyze", "experts"),
              ("sweep", "output"), ("sweep", "depth")]


@pytest.mark.parametrize("value", ["-q", "--depth", "--"])
@pytest.mark.parametrize("subcommand,keyword", RUN_SAMPLE)
def test_a_value_starting_with_a_dash_runs_as_that_options_value(subcommand, keyword, value, tmp_path):
    """The call does what the command line does with the value attached to its option
    (--option=VALUE): the same refusal, which names the option, or the same run (a file or
    directory of that name, for -o)."""
    assert keyword in dict(options_of(subcommand, "int", "number", "text")), (subcommand, keyword)
    expected = subprocess.run([BINARY, *command_line(subcommand, keyword, value)], capture_output=True,
                              text=True, errors="replace")
    made = leave_empty(tmp_path)
    flag = "--" + keyword.replace("_", "-")
    if expected.returncode == 2:
        with pytest.raises(gradflow.InputError) as raised:
            call(subcommand, keyword, value)
        assert str(raised.value) == expected.stderr.strip()
        assert re.search(re.escape(flag) + r"(?![\w-])", str(raised.value)), (flag, str(raised.value))
    else:
        assert expected.returncode == 0, expected.stderr
        call(subcommand, keyword, value)
        assert value in made, f"{flag}={value} ran, and not as {flag}'s value ({made})"
    assert sorted(os.listdir(tmp_path)) == made


INTEGER_OPTIONS = valued("int")


def test_the_integer_options_include_those_whole_by_their_rule():
    assert {(sub, key) for sub in SUBCOMMANDS for key in WHOLE_BY_RULE} <= {tuple(p.values) for p in INTEGER_OPTIONS}


@pytest.mark.parametrize("value", [2.5, 2.0])
@pytest.mark.parametrize("subcommand,keyword", INTEGER_OPTIONS)
def test_a_float_for_an_integer_option_raises_type_error(subcommand, keyword, value):
    with pytest.raises(TypeError, match=rf"^{keyword}= takes a whole number .*, not {value} \(float\)"):
        call(subcommand, keyword, value)


@pytest.mark.parametrize("value", [[2, 4], ("a", "b")])
@pytest.mark.parametrize("subcommand,keyword",
                         [p for p in valued("int", "number", "text")
                          if not dict(table(p.values[0]))[p.values[1]]["several"]])
def test_a_list_for_a_single_valued_option_raises_type_error(subcommand, keyword, value):
    with pytest.raises(TypeError, match=rf"^{keyword}= takes one value, .*, not a {type(value).__name__}"):
        call(subcommand, keyword, value)


@pytest.mark.parametrize("subcommand,keyword", valued("flag"))
@pytest.mark.parametrize("value", [1, "yes", [True]])
def test_a_flag_takes_a_bool_only(subcommand, keyword, value):
    with pytest.raises(TypeError, match=rf"^{keyword}= is a flag: it takes True"):
        call(subcommand, keyword, value)


@pytest.mark.parametrize("value", [{"a": 1}, {2}, object(), [[2]], [2.5]])
def test_values_of_no_kind_an_option_takes_raise_type_error(value):
    with pytest.raises(TypeError, match=r"^seeds= "):  # one whole number
        gradflow.analyze(**{**SMALL, "seeds": value})
    with pytest.raises(TypeError, match=r"^lr= "):  # as an item of a list option
        gradflow.analyze(**SMALL, update="sgd", lr=[1e-3, value])


def test_the_command_line_words_are_one_per_value():
    words = gradflow._argv("analyze", {"output": "-q", "lr": [1e-4, "1e-3"], "arch": ["keel", "pre-ln"],
                                       "no_timing": True, "bias": False, "seeds": None, "init": "--depth"})
    assert words == ["--output=-q", "--lr=0.0001", "--lr=1e-3", "--arch=keel,pre-ln", "--no-timing", "--init=--depth"]
    assert gradflow._argv("sweep", {"depth": [8, 16], "width": 16, "lr": "1e-4,1e-3"}) == \
        ["--depth=8,16", "--width=16", "--lr=1e-4,1e-3"]


def test_values_of_the_right_kind_still_run(tmp_path):
    result = gradflow.analyze(**SMALL, update="sgd", lr=(1e-4, 1e-3), arch=["keel", "pre-ln"], seeds=2,
                              output=tmp_path / "r.json")
    assert [run.arch for run in result.runs] == ["keel", "pre-ln"]
    assert result.runs[0].config["learning_rates"] == [1e-4, 1e-3]
    assert (tmp_path / "r.json").read_text() == result.to_json()
    with pytest.raises(gradflow.InputError, match="--lr"):  # an empty list: the command line's own refusal
        gradflow.analyze(**SMALL, update="sgd", lr=[])
    with pytest.raises(gradflow.InputError, match="unknown option --dpeth"):  # unknown: the CLI names it
        gradflow.analyze(dpeth=3.5)
    swept = gradflow.sweep(tmp_path / "s", arch="keel", depth=(2, 3), width="16", heads=2, seq=4, shard="0/1")
    assert [cell["blocks"] for cell in swept.cells] == [2, 3]


def test_check_and_explain_keep_values_as_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gradflow.InputError, match=r"-q: cannot read the file"):
        gradflow.check("-q", "-q")  # the result path stays the positional RESULT
    with pytest.raises(gradflow.InputError, match=r'explain "-q"'):
        gradflow.explain("-q")
    with pytest.raises(gradflow.InputError, match=r'explain "--list"'):  # a figure's name, not the flag
        gradflow.explain("--list")
    assert "log10_grad" in gradflow.run("explain", "--list")[1]  # the list: the command line's flag
    with pytest.raises(TypeError, match=r"^output= takes a string .*, not False \(bool\)"):  # False too
        gradflow.analyze(**SMALL, output=False)
    with pytest.raises(TypeError, match=r"^max_rows= takes a whole number"):
        gradflow.check("a.json", "b.json", max_rows=1.5)
    with pytest.raises(TypeError, match=r"^expect= takes an expression"):
        gradflow.check("a.json", "b.json", expect=[1])
