"""gradflow: signal and gradient flow in deep Transformer stacks, from Python.

The functions take the command line's options as keyword arguments (snake_case: ``--kv-heads 2``
is ``kv_heads=2``; a list option takes a list or a comma-separated string; a flag takes True) with
the command line's defaults, and run the same code in this process: the same validation, the same
one-line messages (raised as :class:`InputError`), the same numbers. A value of a kind its option
does not take (a bool for a valued option, a float for a whole number, a list for one value)
raises TypeError naming the keyword; each value is passed as --option=value, never read as an
option.

    import gradflow
    result = gradflow.analyze(arch="keel,pre-ln", depth=256, seeds=2)
    frame = result.to_pandas()           # the long table the CSV gives
    result.runs[0].seeds[0].states["rms"]  # numpy arrays, per state and per sublayer

While a run computes, the GIL is released; Ctrl-C (KeyboardInterrupt) stops it between two
sublayers, and nothing is left half-written. The reference: docs/python.md.
"""

import functools
import io
import json
import os
import sys

from . import _gradflow

__version__ = _gradflow.version
__all__ = ["analyze", "sweep", "check", "placements", "explain", "run", "InputError", "CheckReport",
           "Result", "Run", "Seed", "SweepResult", "__version__"]


class InputError(ValueError):
    """A bad option or input: the command line's one-line message (exit code 2 there)."""


# Options the functions set themselves (the output is a Python object, the progress goes to
# `progress=`), refused as keyword arguments.
_OWN = {"format": "the result renders itself: result.to_json(), result.to_csv(), result.to_pandas()",
        "quiet": "pass progress= for a callback or progress='bar' for a text bar",
        "help": "gradflow.run(SUBCOMMAND, '--help') returns the command line's help text",
        "version": "gradflow.__version__ is the version"}


def _flag(key):
    if not isinstance(key, str) or not key.replace("_", "").isalnum():
        raise InputError(f"{key!r} is not an option name; use the command line's options in snake_case, "
                         "e.g. kv_heads=2 for --kv-heads 2")
    return "--" + key.replace("_", "-")


class _Option:
    """What a subcommand's option takes, as the command line declares it (`_gradflow.options`):
    `kind` is 'flag', 'int' (a whole number), 'number' or 'text' (of each item, for a list);
    `several` is 'repeat' for a list given as one --option=VALUE per value (--lr), 'join' for one
    value of comma-separated items (--arch), '' for a single value."""

    __slots__ = ("kind", "several")

    def __init__(self, kind, several=""):
        self.kind, self.several = kind, several

    def __repr__(self):
        return f"_Option({self.kind!r}, {self.several!r})"


_KINDS = {"whole": "int", "real": "number", "text": "text"}


@functools.lru_cache(maxsize=None)
def _options(subcommand):
    """{keyword: _Option} of `gradflow SUBCOMMAND`, every long name of each option, read once per
    process from the command line's own declarations (nothing here is kept by hand)."""
    code, message, rows = _gradflow.options(subcommand)
    if code == 2:  # the command line cannot be built (a broken file in GRADFLOW_PLACEMENTS): its line
        raise InputError(message)
    if code != 0 or not rows:
        raise RuntimeError(f"gradflow {subcommand} declares no options ({message or f'exit code {code}'}); "
                           "cannot check keywords: the module and its native part do not match")
    table = {}
    for row in rows:
        if row["flag"]:
            option = _Option("flag")
        elif row["kind"] in _KINDS and row["several"] in ("", "repeat", "join"):
            option = _Option(_KINDS[row["kind"]], row["several"])
        else:
            raise RuntimeError(f"gradflow {subcommand}: option --{row['names'][0]} is of a kind this module does "
                               f"not know ({row['kind']!r}, {row['several']!r}); cannot check keywords")
        for name in row["names"]:
            table[name.replace("-", "_")] = option
    return table


_TAKES = {"flag": "True (or False or None to leave it out)",
          "int": "a whole number (an int, or its text)",
          "number": "a number (an int or a float, or its text)",
          "text": "a string (or a path, or a number)"}


def _word(key, kind, value):
    """One value of option `key`, checked against its kind, as the command line's text."""
    if isinstance(value, os.PathLike) and kind == "text":
        return os.fspath(value)
    if isinstance(value, str):
        return value
    fits = {"int": (int,), "number": (int, float), "text": (int, float)}[kind]
    if isinstance(value, bool) or not isinstance(value, fits):
        raise TypeError(f"{key}= takes {_TAKES[kind]}, not {_shown(value)} ({type(value).__name__})")
    return str(value)


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _argv(subcommand, options):
    """Keyword arguments -> command-line words, in the given order, each value type-checked against
    what its option takes (`_options`: a bool for a valued option, a float for a whole number or a
    list for a single value is a TypeError naming the keyword) and written as one word,
    --option=value (one --option=value per value for a list option), so that no value, whatever
    it starts with, is read as an option."""
    known = _options(subcommand)
    words = []
    for key, value in options.items():
        if key in _OWN:
            raise InputError(f"{key}= is not taken from Python: {_OWN[key]}")
        flag = _flag(key)
        if hasattr(value, "tolist"):  # numpy scalars and arrays: their Python values
            value = value.tolist()
        if value is None:
            continue
        option = known.get(key)
        if option is None:  # not an option of this subcommand: the command line names it ("did you mean")
            if value is not False:
                words.append(flag if value is True else f"{flag}={value}")
            continue
        if option.kind == "flag":
            if not isinstance(value, bool):
                raise TypeError(f"{key}= is a flag: it takes {_TAKES['flag']}, not {_shown(value)} "
                                f"({type(value).__name__})")
            if value:
                words.append(flag)
            continue
        if isinstance(value, (list, tuple)):
            if not option.several:
                raise TypeError(f"{key}= takes one value, {_TAKES[option.kind]}, not a {type(value).__name__}")
            items = [_word(key, option.kind, item) for item in value]
            if option.several == "repeat" and items:
                words += [f"{flag}={item}" for item in items]
            else:  # an empty list is an empty value, which the command line refuses with its own message
                words.append(f"{flag}={','.join(items)}")
            continue
        words.append(f"{flag}={_word(key, option.kind, value)}")
    return words


class _Bar:
    """progress='bar': a text bar on stderr, redrawn at most ten times a second."""

    def __init__(self, label):
        import time
        self.label, self.time, self.last = label, time, 0.0

    def __call__(self, done, total):
        now = self.time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        width = 30
        filled = int(width * done / total) if total else width
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {100 * done / total:5.1f}%")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _progress(progress, label):
    if progress == "bar":
        return _Bar(label)
    if progress is not None and not callable(progress):
        raise InputError(f"progress={progress!r} must be a callable progress(done, total) or 'bar'")
    return progress


def run(*args, progress=None):
    """Runs one gradflow command line (the words after `gradflow`) in this process and returns
    (exit code, stdout text); an exit code 2 raises InputError with the command's message."""
    outcome = _gradflow.run([str(arg) for arg in args], _progress(progress, "gradflow"))
    if outcome.code == 2:
        raise InputError(outcome.message)
    if outcome.code not in (0, 1):
        raise RuntimeError(outcome.message or f"gradflow exited with {outcome.code}")
    return outcome.code, outcome.stdout


class Seed:
    """One seed's figures: `states` and `sublayers` as numpy arrays (one entry per state x_0..x_S,
    or per sublayer 1..S; None where the JSON holds null, as NaN), `summary` as a dict."""

    def __init__(self, document):
        import numpy
        self.seed = document["seed"]
        self.document = document

        def arrays(table):
            out = {}
            for key, value in table.items():
                if isinstance(value, list) and all(isinstance(v, (int, float)) or v is None for v in value):
                    out[key] = numpy.array([numpy.nan if v is None else v for v in value], dtype=float)
                else:
                    out[key] = value
            return out

        self.states = arrays(document.get("states", {}))
        self.sublayers = arrays(document.get("sublayers", {}))
        self.summary = document.get("summary", {})

    def __repr__(self):
        return f"<gradflow.Seed {self.seed}: {len(self.states.get('rms', []))} states>"


class Run:
    """One placement's run: its `arch`, `config` (dict) and `seeds` (list of Seed)."""

    def __init__(self, document):
        self.arch = document["arch"]
        self.config = document["config"]
        self.seeds = [Seed(seed) for seed in document["seeds"]]
        self.aggregate = document.get("aggregate")
        self.document = document

    def __repr__(self):
        return f"<gradflow.Run {self.arch}: {len(self.seeds)} seed(s)>"


class Result:
    """An analyze result: `runs` (list of Run), `to_json()` (the CLI's document, byte for byte),
    `to_csv()`, `to_pandas()` (the CSV's long table) and `plot()`."""

    def __init__(self, report):
        self._report = report
        self._document = None

    def to_json(self):
        return self._report.json()

    def to_csv(self):
        return self._report.csv()

    @property
    def document(self):
        if self._document is None:
            self._document = json.loads(self.to_json())
        return self._document

    @property
    def runs(self):
        return [Run(run) for run in self.document["runs"]]

    def to_pandas(self):
        try:
            import pandas
        except ImportError:
            raise ImportError("to_pandas() needs pandas (apt-get install python3-pandas, or pip install "
                              "pandas); to_csv() and to_json() do not") from None
        return pandas.read_csv(io.StringIO(self.to_csv()))

    def plot(self, figure="growth", ax=None):
        """Draws rms(x_l) ('growth') or log10 |grad| ('grad') against the state index, one line per
        placement and seed; returns the matplotlib Axes."""
        key = {"growth": "rms", "grad": "log10_grad"}.get(figure)
        if key is None:
            raise InputError(f"plot figure {figure!r} is not one of: growth, grad")
        if ax is None:
            import matplotlib.pyplot as plt
            ax = plt.figure().gca()
        for run in self.runs:
            for seed in run.seeds:
                ax.plot(seed.states["index"], seed.states[key], label=f"{run.arch} seed {seed.seed}")
        ax.set_xlabel("state l (sublayers)")
        ax.set_ylabel("rms(x_l)" if figure == "growth" else "log10 |dL/dx_l|")
        if figure == "growth":
            ax.set_yscale("log")
        ax.legend()
        return ax

    def __repr__(self):
        return f"<gradflow.Result: {', '.join(run.arch for run in self.runs)}>"


def analyze(progress=None, **options):
    """`gradflow analyze` with the command line's options as keyword arguments (arch="keel",
    depth=1024, seeds=4, config="llama-3.2-1b", update="adam", lr=[1e-4, 1e-3], checkpoint=DIR,
    no_timing=True, threads=2, ...). progress: None, a callable progress(done, total) called on
    this thread, or 'bar'. Returns a Result; a bad option raises InputError."""
    outcome = _gradflow.run(["analyze", *_argv("analyze", options), "-q"], _progress(progress, "gradflow analyze"),
                            True)
    if outcome.code == 2:
        raise InputError(outcome.message)
    if outcome.code != 0 or outcome.report is None:
        raise RuntimeError(outcome.message or f"gradflow analyze ended with {outcome.code}")
    return Result(outcome.report)


class SweepResult:
    """A sweep's directory: `document` (summary.json), `to_json()` (its bytes), `fits`, `cells`,
    `to_pandas()` (the sweep CSV of `gradflow merge --format csv`)."""

    def __init__(self, directory):
        self.directory = directory
        with open(f"{directory}/summary.json") as file:
            self._text = file.read()
        self.document = json.loads(self._text)
        self.fits = self.document["summary"]["fits"]
        self.cells = self.document["cells"]

    def to_json(self):
        return self._text

    def to_csv(self):
        return run("merge", self.directory, "--format", "csv")[1]

    def to_pandas(self):
        try:
            import pandas
        except ImportError:
            raise ImportError("to_pandas() needs pandas (apt-get install python3-pandas)") from None
        return pandas.read_csv(io.StringIO(self.to_csv()))


def sweep(output, progress=None, **options):
    """`gradflow sweep -o OUTPUT` with the command line's options as keyword arguments (arch=...,
    depth=[8, 16, 32], seeds=4, jobs=2, shard="0/2", ...). Returns a SweepResult for an unsharded
    sweep, None for a shard (merge the shards with gradflow.run('merge', ...))."""
    if "plan" in options:
        raise InputError("plan= is not taken by gradflow.sweep: gradflow.run('sweep', ..., '--plan') returns the "
                         "plan's JSON text")
    words = _argv("sweep", {"output": output, **options})
    sharded = any(word.startswith("--shard=") and word != "--shard=0/1" for word in words)
    outcome = _gradflow.run(["sweep", *words, "-q"], _progress(progress, "gradflow sweep"))
    if outcome.code == 2:
        raise InputError(outcome.message)
    if outcome.code != 0:
        raise RuntimeError(outcome.message or f"gradflow sweep ended with {outcome.code}")
    return None if sharded else SweepResult(os.fspath(output) if isinstance(output, os.PathLike) else str(output))


class CheckReport:
    """`gradflow check`'s report: `passed` (bool) and `report` (its JSON report as a dict)."""

    def __init__(self, passed, report):
        self.passed, self.report = passed, report

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return f"<gradflow.CheckReport: {'PASS' if self.passed else 'FAIL'}>"


def _path(value):
    """A result given as a path, or as a Result/SweepResult (written to a temporary file)."""
    if isinstance(value, (Result, SweepResult)):
        import tempfile
        file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        file.write(value.to_json())
        file.close()
        return file.name, True
    return str(value), False


def check(result, baseline, expect=None, **options):
    """`gradflow check RESULT --baseline BASELINE` (tolerances=FILE, expect=["keel.log10_grad_ratio < 0.1"]);
    result and baseline are paths or Results. Returns a CheckReport (passed False for a regression)."""
    expectations = [expect] if isinstance(expect, str) else list(expect or [])
    for item in expectations:
        if not isinstance(item, str):
            raise TypeError(f"expect= takes an expression such as 'keel.log10_grad_ratio < 0.1' or a list of them, "
                            f"not {_shown(item)} ({type(item).__name__})")
    words = _argv("check", options)
    paths = []
    try:
        paths.append(_path(result))
        paths.append(_path(baseline))
        words = ["check", f"--baseline={paths[1][0]}", *words, *[f"--expect={item}" for item in expectations],
                 "--json", "--", paths[0][0]]
        code, text = run(*words)
        return CheckReport(code == 0, json.loads(text))
    finally:
        for path, temporary in paths:
            if temporary:
                os.remove(path)


def placements():
    """Every placement `gradflow archs --format json` lists, as dicts."""
    return json.loads(run("archs", "--format", "json")[1])["architectures"]


def explain(figure):
    """The reference text of a figure or placement (gradflow explain FIGURE)."""
    return run("explain", "--", str(figure))[1]
