"""Signals during analyze and sweep (issue 21): SIGINT and SIGTERM end the run with exit 130 and 143
and leave no temporary or partial file; after SIGKILL (which no handler sees) only the documented
leftovers remain (analyze: -o's FILE.tmp.PID.HEX; sweep: finished cells and cells/*.tmp.PID.HEX),
and the sweep resumes to the same summary as an uninterrupted run, removing the stale temporaries."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from cli_testing import finish, test  # noqa: E402

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
ANALYZE = ["analyze", "--arch", "keel", "--depth", "1024", "-o", "out.json", "-q"]
SWEEP = ["sweep", "--arch", "keel", "--depth", "96,192,384", "--seeds", "2", "--width", "128", "-o", "sw", "-q"]


def wait_for(condition, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start(args, directory):
    return subprocess.Popen([BINARY, *args], cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def listing(directory):
    return sorted(os.path.relpath(p, directory) for p in glob.glob(os.path.join(directory, "**"), recursive=True)
                  if os.path.isfile(p))


def analyze_interrupted(signal_number, expected_exit):
    with tempfile.TemporaryDirectory() as directory:
        process = start(ANALYZE, directory)
        # progress: the temporary output exists once the arguments are checked and the run has begun
        wait_for(lambda: glob.glob(os.path.join(directory, "out.json.tmp.*")), "the run to start")
        time.sleep(0.3)
        process.send_signal(signal_number)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == expected_exit, f"exit {process.returncode}, expected {expected_exit}: {stderr!r}"
        assert listing(directory) == [], f"left behind: {listing(directory)}"
        assert process.poll() is not None


@test
def analyze_sigint_exits_130_and_leaves_nothing():
    analyze_interrupted(signal.SIGINT, 130)


@test
def analyze_sigterm_exits_143_and_leaves_nothing():
    analyze_interrupted(signal.SIGTERM, 143)


@test
def analyze_sigkill_leaves_only_the_temporary_file():
    with tempfile.TemporaryDirectory() as directory:
        process = start(ANALYZE, directory)
        wait_for(lambda: glob.glob(os.path.join(directory, "out.json.tmp.*")), "the run to start")
        process.kill()
        process.communicate(timeout=30)
        left = listing(directory)
        assert len(left) == 1 and left[0].startswith(f"out.json.tmp.{process.pid}."), left


def reference_summary():
    with tempfile.TemporaryDirectory() as directory:
        subprocess.run([BINARY, *SWEEP], cwd=directory, check=True, capture_output=True)
        return open(os.path.join(directory, "sw", "summary.json"), "rb").read()


REFERENCE = reference_summary()


def sweep_interrupted(stop):
    """Starts the sweep, stops it after its first cell with stop(process), checks what is left,
    resumes it and compares the summary with an uninterrupted run's. Returns the exit code."""
    with tempfile.TemporaryDirectory() as directory:
        cells = os.path.join(directory, "sw", "cells")
        process = start(SWEEP, directory)
        wait_for(lambda: glob.glob(os.path.join(cells, "*_s*.json")), "the first cell")
        stop(process)
        process.communicate(timeout=30)
        finished = [p for p in glob.glob(os.path.join(cells, "*")) if ".tmp." not in p]
        assert 0 < len(finished) < 6, f"{len(finished)} cells finished: the signal came too late"
        for path in finished:
            json.load(open(path))  # every cell present is whole
        temporaries = glob.glob(os.path.join(cells, "*.tmp.*"))
        if process.returncode >= 0:  # a handled signal: no temporary at all
            assert temporaries == [], f"left behind: {temporaries}"
        else:  # SIGKILL: only this process's temporaries
            assert all(f".tmp.{process.pid}." in p for p in temporaries), temporaries
        assert not os.path.exists(os.path.join(directory, "sw", "summary.json"))
        resumed = subprocess.run([BINARY, *SWEEP], cwd=directory, capture_output=True)
        assert resumed.returncode == 0, resumed.stderr
        assert glob.glob(os.path.join(cells, "*.tmp.*")) == [], "the resume kept stale temporaries"
        assert open(os.path.join(directory, "sw", "summary.json"), "rb").read() == REFERENCE, "resumed summary differs"
        return process.returncode


@test
def sweep_sigint_exits_130_keeps_whole_cells_and_resumes():
    assert sweep_interrupted(lambda p: p.send_signal(signal.SIGINT)) == 130


@test
def sweep_sigterm_exits_143_keeps_whole_cells_and_resumes():
    assert sweep_interrupted(lambda p: p.send_signal(signal.SIGTERM)) == 143


@test
def sweep_sigkill_leaves_whole_cells_and_resumes():
    assert sweep_interrupted(lambda p: p.kill()) == -signal.SIGKILL


finish()
