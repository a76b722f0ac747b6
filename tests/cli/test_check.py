#!/usr/bin/python3
"""`gradflow check` through the real binary (run by ctest): exit 0 on identical inputs, 1 on a
regression (naming placement, figure and layer) or a failing --expect (naming it), 2 on bad input
(naming the path).

Usage: test_check.py GRADFLOW_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from cli_testing import finish, test

BINARY = sys.argv[1] if len(sys.argv) > 1 else "build/gradflow"
SMALL = ["--depth", "4", "--width", "16", "--heads", "2", "--seq", "8", "--seeds", "2", "-q"]


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True)




def analyze(directory, name="run.json", archs="keel,pre-ln"):
    path = os.path.join(directory, name)
    proc = run("analyze", "--arch", archs, *SMALL, "-o", path)
    assert proc.returncode == 0, proc.stderr
    return path


def perturbed(path, target, edit):
    doc = json.load(open(path))
    edit(doc)
    with open(target, "w") as f:
        json.dump(doc, f)
    return target


def keel_seed(doc, seed=0):
    return next(r for r in doc["runs"] if r["arch"] == "keel")["seeds"][seed]


@test
def identical_inputs_pass():
    with tempfile.TemporaryDirectory() as tmp:
        result = analyze(tmp)
        again = analyze(tmp, "again.json")  # a fresh run: same numbers, other timing
        proc = run("check", result, "--baseline", again)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "## gradflow check: PASS" in proc.stdout and "0 regression(s)" in proc.stdout, proc.stdout


@test
def a_baseline_perturbed_beyond_tolerance_fails_naming_placement_figure_and_layer():
    with tempfile.TemporaryDirectory() as tmp:
        result = analyze(tmp)

        def edit(doc):
            keel_seed(doc)["sublayers"]["gain"][3] *= 1.5  # 0.18 decades > 0.05
            keel_seed(doc, 1)["states"]["log10_grad"][2] += 0.2
        baseline = perturbed(result, os.path.join(tmp, "base.json"), edit)
        proc = run("check", result, "--baseline", baseline)
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
        assert "## gradflow check: FAIL" in proc.stdout
        rows = [line for line in proc.stdout.splitlines() if line.startswith("| keel")]
        assert any("| gain |" in r and "sublayer 3 (ffn, block 1)" in r and "seed 0" in r for r in rows), proc.stdout
        assert any("| log10_grad |" in r and "state 2" in r and "seed 1" in r for r in rows), proc.stdout
        assert len(rows) == 2, rows
        report = json.loads(run("check", result, "--baseline", baseline, "--json").stdout)
        assert report["passed"] is False and len(report["regressions"]) == 2
        assert {(r["placement"], r["figure"], r["layer"]) for r in report["regressions"]} == {
            ("keel", "gain", "sublayer 3 (ffn, block 1)"), ("keel", "log10_grad", "state 2")}
        # A tolerances file loosens them per figure.
        tolerances = os.path.join(tmp, "tol.json")
        with open(tolerances, "w") as f:
            json.dump({"log_space": 0.3, "figures": {"gain": 0.2}}, f)
        proc = run("check", result, "--baseline", baseline, "--tolerances", tolerances)
        assert proc.returncode == 0, proc.stdout
        # Within the default tolerance: a 5% change of a linear figure is 0.021 decades.
        small = perturbed(result, os.path.join(tmp, "small.json"),
                          lambda doc: keel_seed(doc)["sublayers"]["gain"].__setitem__(3, keel_seed(doc)["sublayers"]["gain"][3] * 1.05))
        assert run("check", result, "--baseline", small).returncode == 0


@test
def malformed_or_missing_files_exit_2_with_their_path():
    with tempfile.TemporaryDirectory() as tmp:
        result = analyze(tmp)
        broken = os.path.join(tmp, "broken.json")
        with open(broken, "w") as f:
            f.write('{"schema_version": 1, "runs": [')
        missing = os.path.join(tmp, "does-not-exist.json")
        for args, path in [((result, "--baseline", broken), broken), ((broken, "--baseline", result), broken),
                           ((result, "--baseline", missing), missing), ((missing, "--baseline", result), missing),
                           ((result, "--baseline", result, "--tolerances", broken), broken)]:
            proc = run("check", *args)
            assert proc.returncode == 2, (args, proc.returncode, proc.stdout)
            assert path in proc.stderr, (args, proc.stderr)
        not_gradflow = os.path.join(tmp, "other.json")
        with open(not_gradflow, "w") as f:
            json.dump({"hello": 1}, f)
        proc = run("check", not_gradflow, "--baseline", result)
        assert proc.returncode == 2 and not_gradflow in proc.stderr, proc.stderr
        other_depth = os.path.join(tmp, "deeper.json")
        assert run("analyze", "--arch", "keel", "--depth", "5", "--width", "16", "--heads", "2", "--seq", "8", "-q",
                   "-o", other_depth).returncode == 0
        proc = run("check", other_depth, "--baseline", result)
        assert proc.returncode == 2 and "blocks is 5 in the result but 4" in proc.stderr, proc.stderr


@test
def expectations_pass_fail_and_unknown_names():
    with tempfile.TemporaryDirectory() as tmp:
        result = analyze(tmp)
        good = ["keel.log10_grad_ratio < 0.5", "keel.gain_min.value > 0.5", "keel.growth_class == bounded",
                "pre-ln.growth_exponent > 0.1"]
        args = ["check", result, "--baseline", result]
        for e in good:
            args += ["--expect", e]
        proc = run(*args)
        assert proc.returncode == 0, proc.stdout
        assert proc.stdout.count("| pass |") == 4, proc.stdout
        proc = run(*args, "--expect", "keel.log10_grad_ratio < -5")
        assert proc.returncode == 1, proc.returncode
        assert "| `keel.log10_grad_ratio < -5` |" in proc.stdout and "**FAIL**" in proc.stdout, proc.stdout
        assert "1 of 5 expectation(s) failed" in proc.stdout, proc.stdout
        for bad, name in [("kel.log10_grad_ratio < 1", '"kel"'), ("keel.log10_grad_ration < 1", '"log10_grad_ration"'),
                          ("keel.log10_grad_ratio ~ 1", "keel.log10_grad_ratio ~ 1")]:
            proc = run(*args, "--expect", bad)
            assert proc.returncode == 2 and name in proc.stderr, (bad, proc.returncode, proc.stderr)


@test
def check_works_on_sweep_documents():
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "sweep")
        proc = run("sweep", "--arch", "pre-ln,keel", "--depth", "4,8,16", "--width", "16", "--heads", "2", "--seq", "8",
                   "--seeds", "2", "-o", directory, "-q")
        assert proc.returncode == 0, proc.stderr
        summary = os.path.join(directory, "summary.json")
        proc = run("check", summary, "--baseline", summary, "--expect", "keel.growth_class == bounded",
                   "--expect", "pre-ln.growth_exponent > 0.2")
        assert proc.returncode == 0, proc.stdout + proc.stderr

        def edit(doc):
            doc["cells"][3]["rms_final"] *= 2
        baseline = perturbed(summary, os.path.join(tmp, "base.json"), edit)
        proc = run("check", summary, "--baseline", baseline)
        assert proc.returncode == 1 and "| pre-ln | B8 d16 seed 1 | rms_final |" in proc.stdout, proc.stdout


@test
def a_changed_configuration_is_a_fail_block_with_exit_2_and_advice_both_ways():
    with tempfile.TemporaryDirectory() as tmp:
        baseline = analyze(tmp, "base.json", archs="keel")
        changed = os.path.join(tmp, "gpt2.json")
        assert run("analyze", "--arch", "keel", *SMALL, "--init", "gpt2", "-o", changed).returncode == 0
        proc = run("check", changed, "--baseline", baseline)
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "init is \"gpt2\" in the result but \"xavier\" in the baseline" in proc.stderr, proc.stderr
        report = proc.stdout
        assert "## gradflow check: FAIL" in report, report
        assert "### FAIL: the result and the baseline measure different configurations" in report, report
        assert "| keel | init (`--init`) | gpt2 | xavier |" in report, report
        assert "nothing was compared" not in report, report  # the mismatch is the reason, said once
        # The advice covers an accidental change first, and an intended one only after review.
        assert "was not meant to change, rerun it with the baseline's (--init xavier)" in report, report
        assert "if the change was intended, review its figures first" in report, report
        doc = json.loads(run("check", changed, "--baseline", baseline, "--json").stdout)
        assert doc["passed"] is False and doc["mismatches"][0]["field"] == "init", doc["mismatches"]
        assert doc["not_compared"][0]["problem"] == "configuration mismatch", doc["not_compared"]


@test
def runs_with_another_optimizer_step_are_not_compared():
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, flags in (("lr3", ["--update", "adam", "--lr", "1e-3"]), ("lr4", ["--update", "adam", "--lr", "1e-4"]),
                            ("all", ["--update", "adam", "--lr", "1e-3", "--update-params", "all"]), ("none", [])):
            paths[name] = os.path.join(tmp, f"{name}.json")
            assert run("analyze", "--arch", "keel", *SMALL, *flags, "-o", paths[name]).returncode == 0
        assert run("check", paths["lr3"], "--baseline", paths["lr3"]).returncode == 0
        proc = run("check", paths["lr4"], "--baseline", paths["lr3"])
        assert proc.returncode == 2 and "learning_rates" in proc.stderr, (proc.returncode, proc.stderr)
        proc = run("check", paths["all"], "--baseline", paths["lr3"])
        assert proc.returncode == 2 and "update_params" in proc.stderr, (proc.returncode, proc.stderr)
        proc = run("check", paths["none"], "--baseline", paths["lr3"])
        assert proc.returncode == 2 and "update_step" in proc.stderr, (proc.returncode, proc.stderr)


@test
def nothing_comparable_is_a_fail_block_with_exit_2():
    with tempfile.TemporaryDirectory() as tmp:
        baseline = analyze(tmp, "keel.json", archs="keel")
        other = analyze(tmp, "pre-ln.json", archs="pre-ln")
        proc = run("check", other, "--baseline", baseline)
        assert proc.returncode == 2, (proc.returncode, proc.stdout)
        assert len(proc.stderr.strip().splitlines()) == 1 and "nothing was compared" in proc.stderr, proc.stderr
        assert "### FAIL: nothing was compared" in proc.stdout, proc.stdout
        assert "result (runs: pre-ln seed 0, pre-ln seed 1)" in proc.stdout, proc.stdout
        assert "baseline (runs: keel seed 0, keel seed 1)" in proc.stdout, proc.stdout
        doc = json.loads(run("check", other, "--baseline", baseline, "--json").stdout)
        assert doc["passed"] is False and doc["runs_compared"] == 0
        assert [p["problem"] for p in doc["not_compared"]] == ["nothing compared"], doc["not_compared"]


@test
def a_passing_report_shows_the_largest_difference_per_figure_against_its_tolerance():
    with tempfile.TemporaryDirectory() as tmp:
        result = analyze(tmp, archs="keel")

        def nudge(doc):  # within tolerance: 0.01 decades on one gain
            keel_seed(doc)["sublayers"]["gain"][3] *= 10 ** 0.01
        baseline = perturbed(result, os.path.join(tmp, "base.json"), nudge)
        proc = run("check", result, "--baseline", baseline)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "### Largest difference per figure" in proc.stdout, proc.stdout
        row = next(line for line in proc.stdout.splitlines() if line.startswith("| gain |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert abs(float(cells[1]) - 0.01) < 1e-6 and cells[2] == "0.05" and cells[3] == "20%", row
        assert "keel seed 0 sublayer 3" in cells[4], row
        doc = json.loads(run("check", result, "--baseline", baseline, "--json").stdout)
        assert abs(doc["largest_differences"]["gain"]["difference"] - 0.01) < 1e-6, doc["largest_differences"]["gain"]


@test
def max_rows_limits_the_tables_and_refuses_negatives():
    with tempfile.TemporaryDirectory() as tmp:
        result = analyze(tmp, archs="keel")
        proc = run("check", result, "--baseline", result, "--max-rows", "2")
        assert proc.returncode == 0 and "more figures (all of them with --json)" in proc.stdout, proc.stdout
        proc = run("check", result, "--baseline", result, "--max-rows", "-1")
        assert proc.returncode == 2 and proc.stdout == "" and "--max-rows -1 must be >= 0" in proc.stderr, proc.stderr


finish()
