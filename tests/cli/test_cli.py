#!/usr/bin/python3
"""gradflow's command-line behaviour, tested through the real binary (run by ctest).

Usage: test_cli.py GRADFLOW_BINARY
"""
import csv
import io
import json
import math
import os
import subprocess
import sys
import tempfile

from cli_testing import finish, test

BINARY = sys.argv[1] if len(sys.argv) > 1 else "build/gradflow"


def run(*args, check=True):
    proc = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"gradflow {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def without_timing(doc):
    """The document with its timing fields removed: everything else must be bit-identical."""
    doc = json.loads(json.dumps(doc))
    doc.pop("timing", None)
    doc.pop("threads", None)
    for run_ in doc["runs"]:
        for seed in run_["seeds"]:
            seed.pop("timing", None)
    return doc




@test
def post_ln_depth_1024_float32_has_finite_log10_grad_and_valid_json():
    out = run("analyze", "--arch", "post-ln", "--depth", "1024", "-q").stdout
    doc = json.loads(out)  # raises on invalid JSON
    seed = doc["runs"][0]["seeds"][0]
    grads = seed["states"]["log10_grad"]
    assert len(grads) == 2049, len(grads)
    assert all(g is not None and math.isfinite(g) for g in grads), "non-finite log10_grad"
    assert doc["runs"][0]["config"]["precision"] == "f32"
    assert seed["summary"]["diverged"] is None
    # The skip path's product shrinks far below float32's range (about 1e-38 to 1e-45); it is kept in logs.
    log10_skip_product = sum(math.log10(g) for g in seed["sublayers"]["skip_gain"])
    assert log10_skip_product < -100, log10_skip_product


@test
def same_seed_same_numbers_across_runs_and_thread_counts():
    args = ["analyze", "--arch", "keel,post-ln", "--depth", "16", "--width", "64", "--seq", "16", "--seeds", "3", "-q"]
    first = json.loads(run(*args, "--threads", "1").stdout)
    second = json.loads(run(*args, "--threads", "2").stdout)
    third = json.loads(run(*args, "--threads", "2").stdout)
    assert without_timing(first) == without_timing(second), "threads 1 vs 2 differ"
    assert without_timing(second) == without_timing(third), "two runs differ"
    single = json.loads(run("analyze", "--arch", "keel", "--depth", "16", "--width", "64", "--seq", "16", "--seed", "2", "-q").stdout)
    assert single["runs"][0]["seeds"][0]["states"] == first["runs"][0]["seeds"][2]["states"], "--seed 2 differs from seed 2 of --seeds 3"


@test
def json_document_is_self_describing():
    doc = json.loads(run("analyze", "--arch", "deepnorm", "--depth", "4", "--width", "32", "--seq", "8", "-q").stdout)
    assert doc["schema_version"] == 1 and doc["tool"]["name"] == "gradflow"
    config = doc["runs"][0]["config"]
    for key in ["blocks", "sublayers", "width", "heads", "seq", "block", "norm", "init", "precision", "probes", "seeds"]:
        assert key in config, key
    assert config["sublayers"] == 8 and config["blocks"] == 4
    assert math.isclose(config["constants"]["alpha"]["value"], 8 ** 0.25)
    assert config["constants"]["alpha"]["unit"] == "blocks"
    sub = doc["runs"][0]["seeds"][0]["sublayers"]
    assert sub["kind"][:2] == ["attn", "ffn"] and len(sub["gain"]) == 8


@test
def csv_is_tidy_one_row_per_state():
    out = run("analyze", "--arch", "pre-ln,keel", "--depth", "3", "--width", "16", "--seq", "4", "--seeds", "2",
              "--format", "csv", "-q").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 * 2 * 7, len(rows)
    header = list(rows[0].keys())
    for column in ["arch", "blocks", "sublayers", "seed", "index", "kind", "rms", "log10_grad", "gain", "skip_gain"]:
        assert column in header, column
    last = [r for r in rows if r["index"] == "6"]
    assert all(r["gain"] == "" and r["kind"] == "" for r in last), "sublayer columns must be empty on the last state"
    assert all(float(r["rms"]) > 0 for r in rows)


@test
def csv_update_columns_repeat_the_json_update_figures():
    args = ["analyze", "--arch", "pre-ln,post-ln", "--depth", "2", "--width", "16", "--seq", "4", "--seeds", "2",
            "--update", "adam", "--lr", "1e-4,1e-2", "--update-params", "all", "-q"]
    doc = json.loads(run(*args, "--format", "json").stdout)
    rows = list(csv.DictReader(io.StringIO(run(*args, "--format", "csv").stdout)))
    assert len(rows) == 2 * 2 * 5, len(rows)
    checked = 0
    for row in rows:
        seed = next(s for r in doc["runs"] if r["arch"] == row["arch"] for s in r["seeds"] if s["seed"] == int(row["seed"]))
        for i, step in enumerate(seed["summary"]["update"], start=1):
            assert float(row[f"learning_rate_{i}"]) == step["learning_rate"]
            for name in ("output_update_rel", "delta_loss", "delta_loss_first_order"):
                assert float(row[f"{name}_{i}"]) == step[name], (name, i)
            for kind in ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2", "norm_gain"):
                assert float(row[f"step_rel_{kind}_{i}"]) == step["step_rel"][kind], (kind, i)
                checked += 1
            assert row[f"diverged_state_{i}"] == "" and step["diverged_state"] is None
    assert checked == len(rows) * 2 * 7, checked
    assert {r["learning_rate_1"] for r in rows} == {"0.0001"}, "learning_rate_1 is the first --lr"


def expect_bad_input(args, *needles):
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "out.json")
        proc = run(*args, "-o", target, check=False)
        assert proc.returncode == 2, f"{args}: exit {proc.returncode}, stderr {proc.stderr!r}"
        assert proc.stdout == "", f"{args}: wrote to stdout"
        for needle in needles:
            assert needle in proc.stderr, f"{args}: {needle!r} not in {proc.stderr!r}"
        assert os.listdir(directory) == [], f"{args}: left files {os.listdir(directory)}"
        assert len(proc.stderr.strip().splitlines()) == 1, f"{args}: error is not one line: {proc.stderr!r}"


@test
def bad_input_names_the_value_and_the_fix_and_writes_nothing():
    expect_bad_input(["analyze", "--depth", "0"], "--depth 0", "try --depth")
    expect_bad_input(["analyze", "--width", "250", "--heads", "4"], "--width 250", "--heads 4", "try --heads 5 or --width 248")
    expect_bad_input(["analyze", "--arch", "kel"], '"kel"', 'did you mean "keel"')
    expect_bad_input(["analyze", "--arch", "post-ln,pre_ln"], 'did you mean "pre-ln"')
    expect_bad_input(["analyze", "--arch", "keel", "--alpha", "-1"], "--alpha -1", "must be positive")
    expect_bad_input(["analyze", "--arch", "pre-ln", "--alpha", "2"], "--alpha 2 does not apply")
    # 10^7 blocks is inside the depth limit (2^24) and far beyond memory: refused by the estimate.
    expect_bad_input(["analyze", "--depth", "10000000", "--width", "1024"], "GB", "reduce --depth")
    expect_bad_input(["analyze", "--depth", "40000000", "--width", "1024"], "--depth 40000000", "16777216")
    expect_bad_input(["analyze", "--norm", "batch"], "--norm")


@test
def placement_options_given_for_other_placements_warn():
    proc = run("analyze", "--arch", "keel", "--depth", "1", "--width", "16", "--seq", "4", "--mix-ratio", "0.5",
               "--rezero-alpha", "0.1", "-q")
    assert "--mix-ratio applies to mix-ln only" in proc.stderr, proc.stderr
    assert "--rezero-alpha applies to rezero only" in proc.stderr, proc.stderr
    json.loads(proc.stdout)
    quiet = run("analyze", "--arch", "mix-ln,rezero", "--depth", "1", "--width", "16", "--seq", "4", "--mix-ratio", "0.5",
                "--rezero-alpha", "0.1", "-q")
    assert "warning" not in quiet.stderr, quiet.stderr


@test
def unwritable_output_path_fails_before_any_work():
    proc = run("analyze", "--depth", "2", "-o", "/nonexistent-dir/out.json", check=False)
    assert proc.returncode == 2 and "/nonexistent-dir/out.json" in proc.stderr and "not writable" in proc.stderr, proc.stderr


@test
def output_file_is_written_whole():
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "result.json")
        run("analyze", "--depth", "2", "--width", "16", "--seq", "4", "-o", target, "-q")
        assert os.listdir(directory) == ["result.json"]
        json.load(open(target))


@test
def help_states_defaults_and_units():
    text = run("analyze", "--help").stdout
    for needle in ["--depth INT=64", "blocks", "--width INT=256", "--heads INT=4", "--seq INT=64", "=xavier", "=rms", "=f32"]:
        assert needle in text, needle


@test
def archs_lists_placements_with_citations():
    doc = json.loads(run("archs", "--format", "json", "--depth", "8").stdout)
    ids = [a["id"] for a in doc["architectures"]]
    for required in ["post-ln", "pre-ln", "deepnorm", "keel"]:
        assert required in ids, required
    assert all("arXiv" in a["citation"] for a in doc["architectures"])
    keel = next(a for a in doc["architectures"] if a["id"] == "keel")
    assert keel["constants"][0]["value"] == 16 and keel["constants"][0]["unit"] == "sublayers"


@test
def export_weights_writes_safetensors():
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "w.safetensors")
        run("analyze", "--arch", "keel", "--depth", "2", "--width", "8", "--heads", "2", "--seq", "3",
            "--precision", "f64", "--export-weights", target, "-q")
        data = open(target, "rb").read()
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        assert header["input"]["shape"] == [3, 8] and header["input"]["dtype"] == "F64"
        assert header["sublayer.0000.W_Q"]["shape"] == [8, 8]
        assert header["sublayer.0001.W_1"]["shape"] == [8, 32]
        assert header["__metadata__"]["arch"] == "keel"


@test
def table_fits_in_120_columns_one_row_per_placement():
    archs = json.loads(run("archs", "--format", "json", "--depth", "4").stdout)["architectures"]
    out = run("analyze", "--arch", "all", "--depth", "4", "--width", "16", "--heads", "2", "--seq", "4",
              "--format", "table").stdout
    lines = out.splitlines()
    assert "\033" not in out, "colour in piped output"
    too_wide = [line for line in lines if len(line) > 120]
    assert not too_wide, f"lines over 120 columns: {too_wide}"
    rows = [line.split()[0] for line in lines[2:2 + len(archs)]]
    assert rows == [a["id"] for a in archs], f"table rows {rows}"
    assert lines[1].split()[:3] == ["arch", "S", "log10"], lines[1]


def run_on_terminal_stdout(*args):
    """gradflow with stdout (and stderr) on a pseudo-terminal: what a person sees."""
    import pty
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([BINARY, *args], stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO once the child has exited and closed the pty
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait()
    os.close(controller)
    assert proc.returncode == 0, f"gradflow {' '.join(args)} exited {proc.returncode}"
    return b"".join(chunks).decode()


@test
def table_is_coloured_only_on_a_terminal():
    args = ["analyze", "--arch", "post-ln,keel", "--depth", "2", "--width", "16", "--heads", "2", "--seq", "4",
            "--format", "table"]
    on_terminal = run_on_terminal_stdout(*args)
    assert "\033[1march\033[0m" in on_terminal, f"no bold header on a terminal: {on_terminal[:300]!r}"
    piped = run(*args).stdout
    assert "\033" not in piped, "colour in piped output"
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "table.txt")
        run_on_terminal_stdout(*args, "-o", target)
        assert "\033" not in open(target).read(), "colour in a file written with -o"


@test
def markdown_is_a_table_with_one_row_per_placement():
    out = run("analyze", "--arch", "pre-ln,keel", "--depth", "4", "--width", "16", "--heads", "2", "--seq", "4",
              "--seeds", "2", "--format", "markdown", "-q").stdout
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) == 4, rows
    assert rows[1].startswith("| --- | ---: |"), rows[1]
    assert rows[2].startswith("| pre-ln | 8 | ") and rows[3].startswith("| keel | 8 | "), rows
    assert all(row.count("|") == rows[0].count("|") for row in rows), rows


finish()
