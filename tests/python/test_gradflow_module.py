"""`import gradflow` against the CLI it binds (issue 31). Run by ctest through pytest:

    PYTHONPATH=build/python GRADFLOW_BINARY=build/gradflow /usr/bin/python3 -m pytest tests/python

The module runs the CLI's own code in-process, so every comparison here is against the binary's
output for the same options: documents byte for byte, CSV cell for cell, error messages line for
line (every input error of the fault tables that keyword arguments can express).
"""
import _thread
import importlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import pytest

try:
    import gradflow
except ImportError as error:  # a build without the module: say so, never pass silently
    pytest.exit(f"the gradflow module was not built or not found ({error}): install pybind11-dev and python3-dev, "
                "reconfigure with -DGRADFLOW_PYTHON=ON and set PYTHONPATH=build/python", returncode=1)

BINARY = os.path.abspath(os.environ.get("GRADFLOW_BINARY", "build/gradflow"))
FAULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults")
SMALL = dict(depth=2, width=16, heads=2, seq=4, no_timing=True)
SMALL_ARGS = ["--depth", "2", "--width", "16", "--heads", "2", "--seq", "4", "--no-timing"]


def cli(*args, cwd=None):
    return subprocess.run([BINARY, *args], capture_output=True, cwd=cwd)


def every_placement():
    return [p["id"] for p in gradflow.placements()]


@pytest.mark.parametrize("arch", every_placement())
def test_analyze_equals_the_cli_json_for_every_placement(arch):
    result = gradflow.analyze(arch=arch, **SMALL)
    expected = cli("analyze", "--arch", arch, *SMALL_ARGS, "--format", "json")
    assert expected.returncode == 0, expected.stderr
    assert result.to_json().encode() == expected.stdout


def test_to_pandas_equals_the_csv_cell_for_cell():
    pandas = pytest.importorskip("pandas")
    result = gradflow.analyze(arch="keel,pre-ln,resi-dual", seeds=2, probes=2, **SMALL)
    expected = cli("analyze", "--arch", "keel,pre-ln,resi-dual", "--seeds", "2", "--probes", "2", *SMALL_ARGS,
                   "--format", "csv")
    assert result.to_csv().encode() == expected.stdout
    frame = result.to_pandas()
    reference = pandas.read_csv(io.BytesIO(expected.stdout))
    assert list(frame.columns) == list(reference.columns)
    pandas.testing.assert_frame_equal(frame, reference, check_exact=True)
    assert len(frame) > 0


def test_results_as_numpy_arrays():
    import numpy
    result = gradflow.analyze(arch="keel,pre-ln", seeds=2, **SMALL)
    assert [run.arch for run in result.runs] == ["keel", "pre-ln"]
    seed = result.runs[1].seeds[1]
    assert seed.seed == 1
    assert isinstance(seed.states["rms"], numpy.ndarray) and seed.states["rms"].shape == (5,)  # S + 1 states
    assert seed.sublayers["gain"].shape == (4,)
    document = result.document["runs"][1]["seeds"][1]
    assert numpy.array_equal(seed.states["rms"], numpy.array(document["states"]["rms"]))
    assert seed.summary["growth_class"] == document["summary"]["growth_class"]


def fault_cases():
    """(case, keyword arguments) for every exit-2 case of the fault tables that analyze or sweep
    keyword arguments can express; the rest are counted by the test below."""
    sys.path.insert(0, FAULTS)
    cases, argv = [], sys.argv
    sys.argv = [argv[0], BINARY]  # the tables build their fixtures with the binary named there
    try:
        for name in sorted(os.listdir(FAULTS)):
            if name.startswith("cases_") and name.endswith(".py"):
                cases += importlib.import_module(name[:-3]).CASES
    finally:
        sys.argv = argv
    return cases


def as_keywords(args):
    """A command line as (function, keyword arguments), or None when keywords cannot say it (a
    repeated option, a positional word, a missing value, a short flag other than -o)."""
    if not args or args[0] not in ("analyze", "sweep"):
        return None
    words, keywords, i = args[1:], {}, 0
    while i < len(words):
        word = words[i]
        if word == "-o":
            word = "--output"
        if not word.startswith("--") or len(word) < 3:
            return None
        key, value = word[2:], True
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(words) and not words[i + 1].startswith("--") and words[i + 1] != "-o":
            value, i = words[i + 1], i + 1
        i += 1
        key = key.replace("-", "_")
        if key in keywords or key in ("quiet", "format") or not key.replace("_", "").isalnum():
            return None
        if value == "" or (value is True and key not in FLAGS):
            return None  # an empty value or a missing one: the command line's own spelling only
        keywords[key] = value
    if args[0] == "sweep" and "output" not in keywords:
        return None  # gradflow.sweep's output is a required argument: Python refuses the call itself
    return args[0], keywords


FLAGS = {"bias", "ideal_branch", "no_timing", "exact_jacobian", "verbose", "plan"}


def test_every_input_error_of_the_fault_tables_raises_input_error_with_the_cli_message():
    """analyze and sweep through keyword arguments where they can say the command line; every other
    case (other subcommands, repeated options, missing values) through gradflow.run(*args). Skipped:
    cases that need an environment variable (the placement registry reads GRADFLOW_PLACEMENTS once
    per process), a resource limit or stdin, which are the process's, not a call's."""
    as_keyword_arguments, as_words, skipped = 0, 0, 0
    for case in fault_cases():
        if case.exit != 2 or case.env or case.preexec or case.stdin or not case.args:
            skipped += 1
            continue
        with tempfile.TemporaryDirectory(prefix="gradflow-py-fault-") as directory:
            for name, content in case.files.items():
                path = os.path.join(directory, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb" if isinstance(content, bytes) else "w") as file:
                    file.write(content)
            if case.setup is not None:  # FIFOs, sparse files, held locks (fault_table.Case.setup)
                case.setup(directory)
            args = [str(a).replace("{dir}", directory) for a in case.args]
            expected = cli(*args, cwd=directory).stderr.decode(errors="replace").strip()
            call = as_keywords(args)
            before = os.getcwd()
            os.chdir(directory)
            try:
                with pytest.raises(gradflow.InputError) as raised:
                    if call is None:
                        gradflow.run(*args)
                    elif call[0] == "sweep":
                        keywords = dict(call[1])
                        gradflow.sweep(keywords.pop("output"), **keywords)
                    else:
                        gradflow.analyze(**call[1])
            finally:
                os.chdir(before)
            assert str(raised.value) == expected, (case.name, args)
            assert isinstance(raised.value, ValueError)
            as_words += call is None
            as_keyword_arguments += call is not None
    print(f"fault-table input errors raising InputError with the CLI's line: {as_keyword_arguments} through "
          f"keyword arguments, {as_words} through gradflow.run; {skipped} skipped (environment, limits, stdin, "
          "other exit codes)")
    assert as_keyword_arguments >= 150 and as_words >= 150, (as_keyword_arguments, as_words)


def test_every_subcommand_is_reachable_and_input_errors_raise():
    assert "keel" in every_placement()
    assert "log10_grad" in gradflow.explain("log10_grad")
    with pytest.raises(gradflow.InputError, match="unknown option --dpeth; did you mean --depth"):
        gradflow.analyze(dpeth=3)
    with pytest.raises(gradflow.InputError, match="format= is not taken from Python"):
        gradflow.analyze(format="csv")
    with pytest.raises(gradflow.InputError, match="progress=3 must be a callable"):
        gradflow.analyze(progress=3, **SMALL)
    code, text = gradflow.run("archs", "--arch", "keel")
    assert code == 0 and text.startswith("keel")


def test_check_and_sweep_through_python(tmp_path):
    result = gradflow.analyze(arch="keel", **SMALL)
    assert gradflow.check(result, result).passed
    other = gradflow.analyze(arch="keel", init="gpt2", **SMALL)
    with pytest.raises(gradflow.InputError):  # another configuration: the check refuses to compare (exit 2)
        gradflow.check(other, result)
    report = gradflow.check(result, result, expect="keel.log10_grad_ratio > 5")
    assert not report.passed and report.report["expectations"]
    swept = gradflow.sweep(tmp_path / "s", arch="keel,pre-ln", depth=[2, 4], width=16, heads=2, seq=4, seeds=2)
    local = cli("sweep", "--arch", "keel,pre-ln", "--depth", "2,4", "--width", "16", "--heads", "2", "--seq", "4",
                "--seeds", "2", "-o", str(tmp_path / "cli"), "-q")
    assert local.returncode == 0
    assert swept.to_json() == (tmp_path / "cli" / "summary.json").read_text()
    assert [fit["arch"] for fit in swept.fits] == ["keel", "pre-ln"]
    assert swept.to_csv() == cli("merge", str(tmp_path / "cli"), "--format", "csv").stdout.decode()


def test_progress_callback_reaches_the_end_on_the_calling_thread():
    seen = []
    caller = threading.get_ident()
    gradflow.analyze(arch="keel", depth=64, progress=lambda done, total: seen.append((done, total,
                                                                                        threading.get_ident())))
    assert seen and all(ident == caller for _, _, ident in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    assert seen[-1][0] == seen[-1][1]


def test_an_exception_in_the_progress_callback_stops_the_run():
    def stop(done, total):
        raise RuntimeError("stop here")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stop here"):
        gradflow.analyze(arch="keel", depth=4096, progress=stop)
    assert time.monotonic() - start < 5


def test_the_gil_is_released_while_computing():
    ticks = []
    worker = threading.Thread(target=lambda: gradflow.analyze(arch="keel", depth=256))
    worker.start()
    while worker.is_alive():
        ticks.append(time.monotonic())
        time.sleep(0.001)
    worker.join()
    assert len(ticks) > 50  # the main thread ran while the analysis computed


def test_keyboard_interrupt_stops_a_depth_8192_run_within_a_second(tmp_path):
    output = tmp_path / "out.json"
    sent = []
    timer = threading.Timer(1.0, lambda: (sent.append(time.monotonic()), _thread.interrupt_main()))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            gradflow.analyze(arch="keel", depth=8192, output=str(output))
        stopped = time.monotonic()
    finally:
        timer.cancel()
    assert sent, "the run ended before the interrupt was sent"
    print(f"KeyboardInterrupt raised {stopped - sent[0]:.3f} s after it was sent")
    assert stopped - sent[0] < 1.0
    assert list(tmp_path.iterdir()) == [], "nothing half-written"
    # and the module still works afterwards
    assert gradflow.analyze(arch="keel", **SMALL).runs[0].arch == "keel"


def rss_bytes():
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * resource.getpagesize()


def test_200_calls_grow_rss_by_less_than_10_mb():
    for _ in range(20):  # warm-up: allocator pools, the registry, imported modules
        gradflow.analyze(arch="keel", **SMALL).to_json()
    before = rss_bytes()
    for _ in range(200):
        result = gradflow.analyze(arch="keel", **SMALL)
        result.to_json()
        del result
    grown = rss_bytes() - before
    print(f"RSS grew {grown / 2**20:.2f} MB over 200 calls")
    assert grown < 10 * 2**20


def test_the_readme_example_draws_the_growth_plot(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    readme = open(os.path.join(os.path.dirname(FAULTS), "..", "README.md")).read()
    block = readme.split("<!-- python-example: run by tests/python -->\n```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 10
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    assert (tmp_path / "growth.png").stat().st_size > 10000


def test_two_threads_wait_for_each_other_and_a_nested_call_is_refused():
    results, errors = [], []
    worker = threading.Thread(target=lambda: results.append(gradflow.analyze(arch="keel", depth=512)))
    worker.start()
    time.sleep(0.2)
    start = time.monotonic()
    assert "keel" in [p["id"] for p in gradflow.placements()]  # waits for the analysis, then runs
    worker.join(timeout=120)
    assert not worker.is_alive() and results, "the two calls deadlocked"
    print(f"the second thread's call waited {time.monotonic() - start:.2f} s")

    def nested(done, total):
        try:
            gradflow.explain("rms")
        except RuntimeError as error:
            errors.append(str(error))
            raise
    with pytest.raises(RuntimeError, match="cannot be called while it runs a command"):
        gradflow.analyze(arch="keel", depth=64, progress=nested)
    assert errors


def test_run_returns_what_the_cli_prints():
    code, text = gradflow.run("analyze", "--arch", "keel", *SMALL_ARGS, "--format", "csv")
    assert code == 0 and text.encode() == cli("analyze", "--arch", "keel", *SMALL_ARGS, "--format", "csv").stdout
    code, text = gradflow.run("analyze", "--help")
    assert code == 0 and "--depth" in text


def test_numpy_values_and_refused_keywords():
    import numpy
    result = gradflow.analyze(arch="keel", depth=numpy.int64(2), width=16, heads=2, seq=4,
                              lr=numpy.array([1e-4, 1e-3]), update="sgd", no_timing=True)
    assert result.runs[0].config["blocks"] == 2
    assert result.runs[0].config["learning_rates"] == [1e-4, 1e-3]
    flagged = gradflow.analyze(arch="keel", ideal_branch=numpy.True_, **SMALL)
    assert flagged.runs[0].config["branch"] == "rotation"  # --ideal-branch given
    for keyword in ("format", "quiet", "help", "version"):
        with pytest.raises(gradflow.InputError, match=f"{keyword}= is not taken from Python"):
            gradflow.analyze(**{keyword: True})
    with pytest.raises(gradflow.InputError, match="plan= is not taken"):
        gradflow.sweep("unused", arch="keel", depth=[2], plan=True)


def test_a_placement_file_named_in_every_call_does_not_grow_rss_and_is_reread(tmp_path):
    path = tmp_path / "mine.toml"
    source = open(os.path.join(os.path.dirname(FAULTS), "..", "data", "placements", "builtins", "pre-ln.toml")).read()
    path.write_text(source.replace('id = "pre-ln"', 'id = "mine"', 1))
    first = gradflow.analyze(arch=str(path), **SMALL).to_json()
    for _ in range(20):
        gradflow.analyze(arch=str(path), **SMALL)
    before = rss_bytes()
    for _ in range(200):
        gradflow.analyze(arch=str(path), **SMALL)
    grown = rss_bytes() - before
    print(f"RSS grew {grown / 2**20:.2f} MB over 200 calls naming a placement file")
    assert grown < 10 * 2**20
    assert gradflow.analyze(arch=str(path), **SMALL).to_json() == first
    path.write_text(path.read_text().replace('id = "mine"', 'id = "mine2"', 1))  # edited: read again
    assert gradflow.analyze(arch=str(path), **SMALL).runs[0].arch == "mine2"
