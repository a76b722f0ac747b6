#!/usr/bin/python3
"""What a new user meets first (issue 20), through the real binary: the table on a terminal, JSON
when piped, the format -o's extension names; underflow reported like overflow; provenance and
--no-timing; an estimate before a long run; `explain` and --help pointing at docs/.

Usage: test_first_run.py GRADFLOW_BINARY
"""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

from cli_testing import finish, test

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
SMALL = ["--arch", "keel", "--depth", "2", "--width", "16", "--heads", "2", "--seq", "4", "-q"]


def run(*args, **kwargs):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, **kwargs)


def run_on_terminal(args):
    """Runs gradflow with stdout and stderr on one pseudo-terminal: (exit code, what it printed)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([BINARY, *args], stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError(f"gradflow {' '.join(args)} printed nothing for 120 s")
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return proc.wait(), b"".join(chunks).decode(errors="replace")


@test
def the_main_job_prints_the_table_on_a_terminal():
    code, text = run_on_terminal(["analyze", "--arch", "keel", "--depth", "1024"])
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).replace("\r", "")
    lines = [line for line in plain.split("\n") if line.strip()]
    assert code == 0, text[-500:]
    assert len(lines) <= 40, f"{len(lines)} lines on the terminal: {plain[:300]!r}"
    assert any(line.startswith("keel ") for line in lines), plain
    assert "growth p" in plain and "{" not in plain, plain[:300]


@test
def the_main_job_prints_json_when_piped():
    proc = run("analyze", "--arch", "keel", "--depth", "1024")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["runs"][0]["config"]["blocks"] == 1024


@test
def format_follows_the_extension_of_o():
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in [("r.csv", lambda t: t.startswith("arch,blocks,sublayers,")),
                            ("r.md", lambda t: t.lstrip().startswith("|") or "| arch" in t),
                            ("r.json", lambda t: json.loads(t)["command"] == "analyze"),
                            ("r.out", lambda t: json.loads(t)["command"] == "analyze")]:
            path = os.path.join(tmp, name)
            proc = run("analyze", *SMALL, "-o", path)
            assert proc.returncode == 0 and proc.stdout == "", proc.stderr
            text = open(path).read()
            assert check(text), f"-o {name} wrote {text[:120]!r}"


@test
def format_flag_wins_over_the_terminal():
    code, text = run_on_terminal(["analyze", *SMALL, "--format", "json"])
    assert code == 0
    json.loads(text)
    code, text = run_on_terminal(["analyze", *SMALL, "--format", "csv"])
    assert code == 0 and text.startswith("arch,blocks"), text[:100]


@test
def plain_underflows_and_is_reported_like_an_overflow():
    proc = run("analyze", "--arch", "plain", "--depth", "1024", "-q")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"warning: plain seed 0 diverged at sublayer \d+ \(underflow\)", proc.stderr), proc.stderr
    summary = json.loads(proc.stdout)["runs"][0]["seeds"][0]["summary"]
    assert summary["diverged"]["phase"] == "underflow", summary["diverged"]
    rms = json.loads(proc.stdout)["runs"][0]["seeds"][0]["states"]["rms"]
    first_zero = next(i for i, r in enumerate(rms) if r == 0)
    assert summary["diverged"]["sublayer"] < first_zero, (summary["diverged"], first_zero)
    assert summary["growth_class"] == "vanishing", summary["growth_class"]


@test
def plain_at_depth_64_is_vanishing_not_bounded():
    proc = run("analyze", "--arch", "plain,keel", "--depth", "64", "-q")
    assert proc.returncode == 0, proc.stderr
    classes = {r["arch"]: r["seeds"][0]["summary"]["growth_class"] for r in json.loads(proc.stdout)["runs"]}
    assert classes == {"plain": "vanishing", "keel": "bounded"}, classes
    table = run("analyze", "--arch", "plain", "--depth", "64", "-q", "--format", "table").stdout
    assert "vanishing" in table, table


@test
def no_timing_output_is_byte_identical_across_runs():
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"{i}.json") for i in range(2)]
        for path, threads in zip(paths, ["1", "2"]):
            proc = run("analyze", "--arch", "keel,pre-ln", "--depth", "8", "--seeds", "2", "--no-timing",
                       "--threads", threads, "-q", "-o", path)
            assert proc.returncode == 0, proc.stderr
        first, second = (open(p, "rb").read() for p in paths)
        assert first == second, "--no-timing runs differ"
        doc = json.loads(first)
        assert "timing" not in doc and "threads" not in doc
        assert all("timing" not in seed for run_ in doc["runs"] for seed in run_["seeds"])


@test
def provenance_names_version_commit_compiler_and_kernels():
    tool = json.loads(run("analyze", *SMALL).stdout)["tool"]
    assert tool["name"] == "gradflow" and re.fullmatch(r"\d+\.\d+\.\d+", tool["version"]), tool
    assert re.fullmatch(r"[0-9a-f]{40}", tool["commit"]), f"built from a checkout, but commit is {tool['commit']!r}"
    assert tool["compiler"] and tool["kernels"] in ("avx512", "portable"), tool
    assert tool["float64_products"] in ("openblas", "eigen"), tool
    # GRADFLOW_KERNELS=products runs the float32 products on the library's path: the JSON says so.
    library = json.loads(run("analyze", *SMALL, env={**os.environ, "GRADFLOW_KERNELS": "products"}).stdout)["tool"]
    assert library["kernels"] == "portable", library


@test
def a_long_run_prints_an_estimate_first():
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([BINARY, "analyze", "--seeds", "3000", "-q"], cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            assert ready, "no estimate within 60 s"
            line = proc.stderr.readline().decode()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert re.search(r"3000 run\(s\) of 128 sublayers will take about [\d.]+ (min|h)", line), line
        assert os.listdir(tmp) == [], os.listdir(tmp)


@test
def a_short_run_prints_no_estimate():
    proc = run("analyze", *SMALL)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@test
def explain_prints_a_definition_and_its_unit():
    proc = run("explain", "log10_grad_rel")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("### `log10_grad_rel`") and "Unit: decades" in proc.stdout, proc.stdout
    listing = run("explain", "--list").stdout.split()
    assert {"rms", "gain", "growth_class", "diverged", "commit"} <= set(listing), listing[:20]


@test
def help_points_to_docs_not_to_shared_spec():
    for args in [["--help"], ["analyze", "--help"]]:
        text = run(*args).stdout
        assert "shared/spec" not in text, args
    assert "docs/" in run("--help").stdout


finish()
