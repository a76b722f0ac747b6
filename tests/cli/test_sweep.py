#!/usr/bin/python3
"""`gradflow sweep` and `gradflow merge` through the real binary (run by ctest): an interrupted
sweep resumes byte-identically without recomputing finished cells, three shards merge to the
unsharded bytes, disagreeing shards are refused.

Usage: test_sweep.py GRADFLOW_BINARY
"""
import csv
import glob
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from cli_testing import finish, test

BINARY = sys.argv[1] if len(sys.argv) > 1 else "build/gradflow"
# Small but long enough (a few seconds on one core) to be killed midway.
GRID = ["--arch", "pre-ln,keel", "--depth", "16,32,64,128,256", "--width", "64", "--heads", "2", "--seq", "32", "--seeds", "3"]
TOTAL_CELLS = 2 * 5 * 3
TINY = ["--arch", "pre-ln,post-ln,keel", "--depth", "4,8,16", "--width", "16", "--heads", "2", "--seq", "8", "--seeds", "3"]


def run(*args, check=True):
    proc = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"gradflow {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc




def cell_files(directory):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "cells", "*.json")))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def assert_same_results(a, b):
    assert cell_files(a) == cell_files(b), f"cell sets differ: {cell_files(a)} vs {cell_files(b)}"
    for name in cell_files(a):
        assert read(os.path.join(a, "cells", name)) == read(os.path.join(b, "cells", name)), f"cell {name} differs"
    assert read(os.path.join(a, "summary.json")) == read(os.path.join(b, "summary.json")), "summary.json differs"


@test
def sigkilled_sweep_resumes_byte_identical_without_recomputing_finished_cells():
    with tempfile.TemporaryDirectory() as tmp:
        reference, interrupted = os.path.join(tmp, "reference"), os.path.join(tmp, "interrupted")
        run("sweep", *GRID, "-o", reference, "--jobs", "2", "-q")
        assert len(cell_files(reference)) == TOTAL_CELLS

        proc = subprocess.Popen([BINARY, "sweep", *GRID, "-o", interrupted, "--jobs", "1", "-q"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while len(cell_files(interrupted)) < TOTAL_CELLS // 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = cell_files(interrupted)
        assert proc.returncode == -signal.SIGKILL, f"the sweep ended by itself (exit {proc.returncode}) before the kill"
        assert 0 < len(finished) < TOTAL_CELLS, f"{len(finished)} cells finished before the kill"
        assert not os.path.exists(os.path.join(interrupted, "summary.json"))
        for name in finished:  # every file present is complete and valid: written atomically
            json.loads(read(os.path.join(interrupted, "cells", name)))
        before = {n: (os.stat(os.path.join(interrupted, "cells", n)).st_ino,
                      os.stat(os.path.join(interrupted, "cells", n)).st_mtime_ns) for n in finished}

        resumed = run("sweep", *GRID, "-o", interrupted, "--jobs", "2", "-v")
        skipped = {line.split()[3] for line in resumed.stderr.splitlines() if " skipped " in line}
        computed = {line.split()[3] for line in resumed.stderr.splitlines() if " computed " in line}
        assert skipped == set(finished), f"skipped {sorted(skipped)} but {sorted(finished)} had finished"
        assert computed == set(cell_files(reference)) - set(finished), "recomputed a finished cell or missed one"
        after = {n: (os.stat(os.path.join(interrupted, "cells", n)).st_ino,
                     os.stat(os.path.join(interrupted, "cells", n)).st_mtime_ns) for n in finished}
        assert before == after, "a finished cell file was rewritten"
        assert_same_results(reference, interrupted)
        print(f"     killed after {len(finished)} of {TOTAL_CELLS} cells; resumed, skipped those, same bytes")


@test
def three_shards_merge_to_the_unsharded_bytes():
    with tempfile.TemporaryDirectory() as tmp:
        whole = os.path.join(tmp, "whole")
        run("sweep", *TINY, "-o", whole, "-q")
        shards = [os.path.join(tmp, f"shard{i}") for i in range(3)]
        counts = []
        for i, directory in enumerate(shards):
            run("sweep", *TINY, "-o", directory, "--shard", f"{i}/3", "-q")
            assert not os.path.exists(os.path.join(directory, "summary.json")), "a shard wrote a summary"
            counts.append(len(cell_files(directory)))
        assert counts == [9, 9, 9], counts
        merged = os.path.join(tmp, "merged.json")
        run("merge", *shards, "-o", merged)
        assert read(merged) == read(os.path.join(whole, "summary.json")), "merged document differs from the unsharded summary"
        for directory in shards:
            for name in cell_files(directory):
                assert read(os.path.join(directory, "cells", name)) == read(os.path.join(whole, "cells", name)), name
        # Shards may also share one directory (a job array writing to one place).
        shared = os.path.join(tmp, "shared")
        for i in range(3):
            run("sweep", *TINY, "-o", shared, "--shard", f"{i}/3", "--jobs", "2", "-q")
        run("merge", shared, "-o", merged)
        assert read(merged) == read(os.path.join(whole, "summary.json"))
        doc = json.loads(read(merged))
        order = [(c["arch"], c["blocks"], c["seed"]) for c in doc["cells"]]
        assert order[:4] == [("pre-ln", 4, 0), ("pre-ln", 4, 1), ("pre-ln", 4, 2), ("pre-ln", 8, 0)], order[:4]
        fits = {f["arch"]: f for f in doc["summary"]["fits"]}
        assert fits["pre-ln"]["growth_exponent"]["ci95_low"] <= fits["pre-ln"]["growth_exponent"]["value"] \
            <= fits["pre-ln"]["growth_exponent"]["ci95_high"]
        assert fits["keel"]["growth_class"] == "bounded", fits["keel"]
        rows = list(csv.DictReader(io.StringIO(run("merge", *shards, "--format", "csv").stdout)))
        assert len(rows) == 27 and rows[0]["arch"] == "pre-ln" and float(rows[0]["rms_final"]) > 0


@test
def merge_refuses_disagreeing_or_incomplete_shards():
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        run("sweep", *TINY, "-o", a, "--shard", "0/2", "-q")
        other = [x if x != "8" else "12" for x in TINY]  # --seq 12
        run("sweep", *other, "-o", b, "--shard", "1/2", "-q")
        proc = run("merge", a, b, "-o", os.path.join(tmp, "m.json"), check=False)
        assert proc.returncode == 2, proc.returncode
        assert "model.seq: 8 vs 12" in proc.stderr, proc.stderr
        assert not os.path.exists(os.path.join(tmp, "m.json"))
        proc = run("merge", a, "-o", os.path.join(tmp, "m.json"), check=False)
        assert proc.returncode == 2 and "cells are missing" in proc.stderr, proc.stderr
        proc = run("merge", os.path.join(tmp, "nowhere"), check=False)
        assert proc.returncode == 2 and os.path.join(tmp, "nowhere", "sweep.json") in proc.stderr, proc.stderr
        # A different model into an existing sweep directory is refused before any work.
        proc = run("sweep", *other, "-o", a, check=False)
        assert proc.returncode == 2 and "seq" in proc.stderr, proc.stderr
        # So is another optimizer step or learning rate (--update, --lr are part of the model):
        # resuming must not reuse cells measured with another step.
        u = os.path.join(tmp, "u")
        run("sweep", *TINY, "-o", u, "--update", "adam", "--lr", "1e-3", "-q")
        for changed in (["--update", "adam", "--lr", "1e-4"], ["--update", "sgd", "--lr", "1e-3"], []):
            proc = run("sweep", *TINY, "-o", u, *changed, "-q", check=False)
            assert proc.returncode == 2, (changed, proc.returncode, proc.stderr)
            assert ("learning_rates" in proc.stderr or "update_step" in proc.stderr), (changed, proc.stderr)
        # And so is another value of a placement's option (mix-ln's ratio, rezero's branch weight).
        for option, first, second in (("--mix-ratio", "0.25", "0.5"), ("--rezero-alpha", "0", "0.1")):
            directory = os.path.join(tmp, option.strip("-"))
            tiny = ["--arch", "mix-ln" if option == "--mix-ratio" else "rezero", *TINY[2:]]
            run("sweep", *tiny, "-o", directory, option, first, "-q")
            proc = run("sweep", *tiny, "-o", directory, option, second, "-q", check=False)
            assert proc.returncode == 2 and option.strip("-").replace("-", "_") in proc.stderr, (option, proc.stderr)
        summary = json.loads(read(os.path.join(u, "summary.json")))
        assert all(len(cell["output_update_rel"]) == 1 for cell in summary["cells"]), summary["cells"][0]
        assert summary["summary"]["fits"][0]["output_update_rel_exponent"][0]["learning_rate"] == 1e-3


@test
def a_corrupt_or_foreign_cell_is_recomputed_and_jobs_do_not_change_bytes():
    with tempfile.TemporaryDirectory() as tmp:
        one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
        run("sweep", *TINY, "-o", one, "--jobs", "1", "-q")
        run("sweep", *TINY, "-o", two, "--jobs", "2", "-q")
        assert_same_results(one, two)
        victim = os.path.join(two, "cells", "keel_B8_d16_s1.json")
        with open(victim, "w") as f:
            f.write('{"schema_version": 1, "runs": [')  # a truncated file from some other tool
        proc = run("sweep", *TINY, "-o", two, "-v")
        assert "recomputing keel_B8_d16_s1.json" in proc.stderr, proc.stderr
        assert_same_results(one, two)


@test
def sweep_help_says_shards_are_zero_based_and_bad_shards_are_refused():
    out = run("sweep", "--help").stdout
    assert "0-based" in out and "--jobs" in out and "--norm" in out, out
    proc = run("sweep", *TINY, "-o", "/tmp/unused-gradflow-sweep", "--shard", "3/3", check=False)
    assert proc.returncode == 2 and "0-based" in proc.stderr, proc.stderr


finish()
