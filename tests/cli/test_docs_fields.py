#!/usr/bin/python3
"""Every JSON key and CSV column gradflow writes has an entry in docs/ (issue 20): a `### `name``
section or a table row `| `name` |` in docs/*.md. Runs the real binary over configurations that
switch every optional figure on, collects the keys, and compares the sets. Also checks that
docs/placements.md has a row for every placement of the registry.

Usage: test_docs_fields.py GRADFLOW_BINARY DOCS_DIR
"""
import csv
import glob
import io
import json
import os
import re
import subprocess
import sys
import tempfile

from cli_testing import finish, test

BINARY = sys.argv[1] if len(sys.argv) > 1 else "build/gradflow"
DOCS = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "..", "docs")
SMALL = ["--width", "16", "--heads", "2", "--seq", "4", "-q"]
# Keys whose names are data, not fields: the stream names and the constants' names.
DATA_KEYED = {"streams", "stream_growth", "constants", "dtypes"}  # dtypes: count per dtype name


def documented_names():
    names = set()
    for path in glob.glob(os.path.join(DOCS, "*.md")):
        text = open(path).read()
        names |= set(re.findall(r"^### `([^`]+)`", text, re.M))
        names |= set(re.findall(r"^\| `([^`]+)`", text, re.M))
    return names


def canonical(name):
    """log10_singular_value_3 -> log10_singular_value_i; rms_a -> rms_NAME (stream columns)."""
    name = re.sub(r"^log10_singular_value_\d+", "log10_singular_value_i", name)
    name = re.sub(r"^(update_rms|log10_update_rel|update_loss|update_loss_share|output_update_rel|delta_loss|"
                  r"delta_loss_first_order|learning_rate|diverged_state)_\d+$", r"\1_i", name)
    name = re.sub(r"^step_rel_(w_q|w_k|w_v|w_o|w_1|w_2|w_3|norm_gain)_\d+$", "step_rel_KIND_i", name)
    return name


def json_keys(node, parent=None, out=None):
    out = set() if out is None else out
    if isinstance(node, dict):
        for key, value in node.items():
            if parent not in DATA_KEYED:
                out.add(canonical(key))
            json_keys(value, key, out)
    elif isinstance(node, list):
        for item in node:
            json_keys(item, parent, out)
    return out


def run(*args):
    proc = subprocess.run([BINARY, *args], capture_output=True, text=True)
    assert proc.returncode in (0, 1), (args, proc.stderr)
    return proc.stdout


ANALYZE = [
    ["--arch", "keel,pre-ln,resi-dual", "--depth", "2", "--seeds", "2", "--probes", "2"],
    ["--arch", "keel", "--depth", "2", "--spectrum", "2", "--exact-jacobian", "--angles", "all", "--norm", "dyt"],
    ["--arch", "plain", "--depth", "200"],  # diverged (underflow)
    ["--arch", "post-ln,deepnorm", "--depth", "2", "--update", "adam", "--lr", "1e-4,1e-3"],
    ["--arch", "pre-ln", "--depth", "2", "--ffn", "swiglu", "--update", "sgd", "--lr", "1e-3"],
    ["--arch", "pre-ln", "--depth", "2", "--ffn", "moe", "--experts", "4", "--shared-expert-hidden", "8",
     "--update", "adam", "--update-params", "all"],
]


def undocumented(found):
    return sorted(found - documented_names())


@test
def every_analyze_json_key_is_documented():
    found = set()
    for args in ANALYZE:
        found |= json_keys(json.loads(run("analyze", *SMALL, *args, "--format", "json")))
    assert "log10_singular_value_i" in found and "diverged" in found and "angles_matrix" in found
    assert "update_loss_share_i" in found and "output_update_rel" in found and "w_2" in found and "w_3" in found
    assert "experts_active" in found and "shared_expert_gate" in found, found
    missing = undocumented(found)
    assert not missing, f"JSON keys without an entry in docs/: {missing}"


@test
def every_analyze_csv_column_is_documented():
    found = set()
    for args in ANALYZE:
        header = next(csv.reader(io.StringIO(run("analyze", *SMALL, *args, "--format", "csv"))))
        for column in header:
            column = re.sub(r"^(rms|log10_grad)_(a|d|X|Y|x|h)$", r"\1_NAME", column)
            found.add(canonical(column))
    assert "rms_NAME" in found, found
    missing = undocumented(found)
    assert not missing, f"CSV columns without an entry in docs/: {missing}"


@test
def every_sweep_and_check_field_is_documented():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sweep")
        proc = subprocess.run([BINARY, "sweep", "--arch", "keel,pre-ln", "--depth", "2,4", "--width", "16",
                               "--heads", "2", "--seq", "4", "--seeds", "2", "-o", out, "-q"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        summary = json.load(open(os.path.join(out, "summary.json")))
        found = json_keys(summary) | json_keys(json.load(open(os.path.join(out, "sweep.json"))))
        header = next(csv.reader(io.StringIO(run("merge", out, "--format", "csv"))))
        found |= set(header)
        found |= json_keys(json.loads(run("sweep", "--arch", "keel,pre-ln", "--depth", "2,4", "--width", "16",
                                          "--heads", "2", "--seq", "4", "--seeds", "2", "-o", out, "--plan")))
        result = os.path.join(tmp, "r.json")
        assert subprocess.run([BINARY, "analyze", *SMALL, "--depth", "2", "--arch", "keel", "-o", result]).returncode == 0
        found |= json_keys(json.loads(run("check", result, "--baseline", result, "--json",
                                          "--expect", "keel.log10_grad_ratio < 1")))
        changed = os.path.join(tmp, "gpt2.json")  # a mismatch: the report's not_compared and mismatches
        assert subprocess.run([BINARY, "analyze", *SMALL, "--depth", "2", "--arch", "keel", "--init", "gpt2",
                               "-o", changed]).returncode == 0
        proc = subprocess.run([BINARY, "check", changed, "--baseline", result, "--json"], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        report = json.loads(proc.stdout)
        assert report["mismatches"] and report["not_compared"], report
        found |= json_keys(report)
        found |= json_keys(json.loads(run("archs", "--format", "json")))
    missing = undocumented(found)
    assert not missing, f"sweep, check or archs fields without an entry in docs/: {missing}"


@test
def every_checkpoint_field_is_documented():
    """analyze --checkpoint (issue 28): config.checkpoint, seeds[].checkpoint, the CSV's columns, and
    archs --checkpoint --format json, on a tiny GPT-2 checkpoint with the hub's mask buffers."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
    from make_checkpoints import make_checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "ck")
        make_checkpoint(directory, "gpt2", hub_buffers=True)
        args = ["--checkpoint", directory, "--seq", "6", "-q", "--update", "adam"]
        document = json.loads(run("analyze", *args, "--format", "json"))
        found = json_keys(document)
        assert {"angular_distance", "tokens_file", "ignored_tensors", "random_tokens"} <= found, found
        found |= set(next(csv.reader(io.StringIO(run("analyze", *args, "--format", "csv")))))
        found |= json_keys(json.loads(run("archs", "--checkpoint", directory, "--format", "json")))
        found = {canonical(name) for name in found}
    missing = undocumented(found)
    assert not missing, f"checkpoint fields without an entry in docs/: {missing}"


@test
def every_placement_has_a_row_in_placements_md():
    ids = {a["id"] for a in json.loads(run("archs", "--format", "json"))["architectures"]}
    text = open(os.path.join(DOCS, "placements.md")).read()
    rows = set(re.findall(r"^\| `([^`]+)`", text, re.M))
    assert ids <= rows, f"placements without a row in docs/placements.md: {sorted(ids - rows)}"


@test
def the_test_can_fail():
    assert undocumented({"rms", "no_such_field_anywhere"}) == ["no_such_field_anywhere"]


finish()
