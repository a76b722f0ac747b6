"""Keyword arguments type-checked against the options they name, and never read as options
themselves (issue 51, item 9 and acceptance 5). Run with the rest of tests/python by ctest:

    PYTHONPATH=build/python GRADFLOW_BINARY=build/gradflow /usr/bin/python3 -m pytest tests/python

What each option takes (a flag, a whole number, a number, text; one value or a list) is read by the
module from the subcommand's --help, and the cases below are generated from that same table, so a
new option is covered without a line here; the table itself is checked against the binary's help.
"""
import os
import re
import shutil
import subprocess

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


@pytest.fixture(autouse=True)
def in_a_temporary_directory(tmp_path, monkeypatch):
    """Every case runs in its own directory: a value taken as a file name (or a module that does
    not refuse what it should) writes there, not where pytest was started."""
    monkeypatch.chdir(tmp_path)


def options_of(subcommand, *kinds):
    """(keyword, option) of `subcommand`'s options of the given kinds, those Python refuses left out."""
    refused = set(gradflow._OWN) | ({"plan"} if subcommand == "sweep" else set())
    return [(key, option) for key, option in gradflow._options(subcommand).items()
            if key not in refused and option.kind in kinds]


def call(subcommand, keyword, value):
    """`subcommand` on a small model with keyword=value in place of the small model's own."""
    if subcommand == "analyze":
        return gradflow.analyze(**{**{k: v for k, v in SMALL.items() if k != keyword}, keyword: value})
    options = {**{k: v for k, v in SWEEP_SMALL.items() if k != keyword}, keyword: value}
    return gradflow.sweep(options.pop("output", "out"), **options)


def valued(*kinds):
    return [pytest.param(sub, key, id=f"{sub}-{key}") for sub in SUBCOMMANDS for key, _ in options_of(sub, *kinds)]


def test_the_option_table_is_the_binarys():
    """Every option the binary's help lists is in the table read from it, and the kinds of a few
    are the ones the C++ declares (the regexes read CLI11's help layout)."""
    for subcommand in ("analyze", "sweep", "check", "archs", "merge", "explain"):
        text = subprocess.run([BINARY, subcommand, "--help"], capture_output=True, text=True, check=True).stdout
        listed = {name.replace("-", "_") for name in re.findall(r"^  (?:-\w,)?--([\w-]+)", text, re.MULTILINE)}
        assert listed and set(gradflow._options(subcommand)) == listed, subcommand
    analyze, sweep = gradflow._options("analyze"), gradflow._options("sweep")
    kinds = {key: (option.kind, option.repeated, option.joined) for key, option in analyze.items()}
    assert kinds["depth"] == ("int", False, False)
    assert kinds["seed"] == ("int", False, False)  # UINT
    assert kinds["no_timing"] == ("flag", False, False)
    assert kinds["lr"] == ("number", True, True)  # a CLI11 list: one --lr=VALUE per value
    assert kinds["arch"] == ("text", False, True)  # comma-separated in one value
    assert kinds["output"] == ("text", False, False)
    assert kinds["num_fracs"][0] == "number" and kinds["keel_variant"][0] == "text"  # declared by the registry
    assert (sweep["depth"].kind, sweep["depth"].joined) == ("text", True)
    assert gradflow._options("check")["expect"].repeated
    gradflow._options.cache_clear()
    gradflow._options("analyze"), gradflow._options("analyze")
    assert gradflow._options.cache_info().misses == 1  # read once per process


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


@pytest.mark.parametrize("value", ["-q", "--depth", "--"])
@pytest.mark.parametrize("subcommand,keyword", valued("int", "number", "text"))
def test_a_value_starting_with_a_dash_is_that_options_value(subcommand, keyword, value, tmp_path, monkeypatch):
    """A value that looks like an option never changes which options are parsed: the call does
    what the command line does with the value attached to its option (--option=VALUE): the same
    refusal, which names the option, or the same run (a file or directory of that name, for -o)."""
    monkeypatch.chdir(tmp_path)
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


@pytest.mark.parametrize("value", [2.5, 2.0])
@pytest.mark.parametrize("subcommand,keyword", valued("int"))
def test_a_float_for_an_integer_option_raises_type_error(subcommand, keyword, value):
    with pytest.raises(TypeError, match=rf"^{keyword}= takes a whole number .*, not {value} \(float\)"):
        call(subcommand, keyword, value)


@pytest.mark.parametrize("value", [[2, 4], ("a", "b")])
@pytest.mark.parametrize("subcommand,keyword",
                         [p for p in valued("int", "number", "text")
                          if not gradflow._options(p.values[0])[p.values[1]].several])
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
    with pytest.raises(TypeError, match=r"^max_rows= takes a whole number"):
        gradflow.check("a.json", "b.json", max_rows=1.5)
    with pytest.raises(TypeError, match=r"^expect= takes an expression"):
        gradflow.check("a.json", "b.json", expect=[1])
