#!/usr/bin/python3
"""`gradflow sweep --config` (issue 33) through the real binary: each cell holds the figures of
`analyze --config` at its depth, a bad file or a flag that conflicts with the file is refused in one
line (exit 2, nothing created), and a sweep directory resumed with another config.json, or with a
file that now sets another value (the FFN width included), is refused.

Usage: test_sweep_config.py GRADFLOW_BINARY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from cli_testing import finish, test

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "configs")
GPT2 = os.path.join(CONFIGS, "gpt2.json")
# Small sizes over a file's own, for the tests that are about the directory, not the figures.
SMALL = ["--width", "48", "--heads", "4", "--seq", "8", "-q"]


def run(subcommand, *args):
    return subprocess.run([BINARY, subcommand, *args], capture_output=True, text=True)


def refused(proc, *words):
    """Exit 2 and one line on stderr naming every word."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {proc.stderr}"
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]


def load(path):
    with open(path) as f:
        return json.load(f)


def snapshot(directory):
    """Every file under `directory` with its bytes."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                files[os.path.relpath(os.path.join(root, name), directory)] = f.read()
    return files


def llama_like(path, intermediate_size):
    """A tiny Llama-family config.json (gated FFN, GQA, RoPE), its FFN width as given."""
    with open(path, "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "num_hidden_layers": 2, "intermediate_size": intermediate_size, "hidden_act": "silu",
                   "rms_norm_eps": 1e-5, "rope_theta": 10000.0}, f)


@test
def cells_hold_analyze_figures_at_each_depth():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sweep")
        proc = run("sweep", "--config", GPT2, "--depth", "2,4", "-o", out, "-q")
        assert proc.returncode == 0, proc.stderr
        manifest = load(os.path.join(out, "sweep.json"))
        # The file's model, its family's placement and its width (n_embd), not the defaults.
        assert manifest["grid"]["archs"] == ["pre-ln"] and manifest["grid"]["widths"] == [768], manifest["grid"]
        assert manifest["model"]["heads"] == 12 and manifest["model"]["norm"] == "layer", manifest["model"]
        assert manifest["config_file"]["path"] == GPT2 and manifest["config_file"]["model_type"] == "gpt2"
        assert manifest["config_file"]["sources"]["blocks"] == "--depth", manifest["config_file"]
        assert load(os.path.join(out, "summary.json"))["config_file"] == manifest["config_file"]
        for depth in (2, 4):
            cell = load(os.path.join(out, "cells", f"pre-ln_B{depth}_d768_s0.json"))
            proc = run("analyze", "--config", GPT2, "--depth", str(depth), "--format", "json", "--no-timing", "-q")
            assert proc.returncode == 0, proc.stderr
            alone = json.loads(proc.stdout)
            [cell_run], [alone_run] = cell["runs"], alone["runs"]
            alone_config = dict(alone_run["config"])
            assert alone_config.pop("config_file")["sources"]["blocks"] == "--depth"
            assert cell_run["config"] == alone_config, f"depth {depth}: configurations differ"
            assert cell_run["seeds"] == alone_run["seeds"], f"depth {depth}: figures differ"
            assert cell_run["aggregate"] == alone_run["aggregate"], f"depth {depth}: aggregates differ"


@test
def flags_override_the_file_and_plan_names_its_cells():
    """--width lists the grid's widths over the file's (analyze's rule: a flag given wins); --arch
    replaces the family's placement; --plan sees the same grid."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sweep")
        proc = run("sweep", "--config", "gpt2", "--arch", "keel", "--depth", "2,3", "--width", "48,96", "--heads", "4",
                   "--seq", "8", "-q",
                   "-o", out, "--plan")
        assert proc.returncode == 0, proc.stderr
        assert not os.path.exists(out), "--plan created the directory"
        files = [cell["file"] for cell in json.loads(proc.stdout)["cells"]]
        assert files == ["cells/keel_B2_d48_s0.json", "cells/keel_B2_d96_s0.json", "cells/keel_B3_d48_s0.json",
                         "cells/keel_B3_d96_s0.json"], files
        proc = run("sweep", "--config", "gpt2", "--arch", "keel", "--depth", "2,3", "--width", "48,96", "--heads", "4",
                   "--seq", "8", "-q",
                   "-o", out)
        assert proc.returncode == 0, proc.stderr
        manifest = load(os.path.join(out, "sweep.json"))
        sources = manifest["config_file"]["sources"]
        assert sources["width"] == "--width" and sources["arch"] == "--arch" and sources["heads"] == "--heads"
        assert manifest["model"]["init"] == "gpt2" and manifest["model"]["heads"] == 4, manifest["model"]


@test
def a_bad_file_or_a_conflicting_flag_is_one_line_and_writes_nothing():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sweep")
        broken = os.path.join(tmp, "broken.json")
        with open(broken, "w") as f:
            f.write('{"model_type": "llama", "hidden_size": 32,\n')
        refused(run("sweep", "--config", broken, "--depth", "2,4", "-o", out), broken, "not valid JSON")
        unknown = os.path.join(tmp, "unknown.json")
        with open(unknown, "w") as f:
            json.dump({"model_type": "mamba", "hidden_size": 32}, f)
        refused(run("sweep", "--config", unknown, "--depth", "2,4", "-o", out), "mamba", "--arch")
        refused(run("sweep", "--config", os.path.join(tmp, "missing.json"), "--depth", "2", "-o", out),
                "missing.json", "no such file")
        # gpt2's 12 heads do not divide --width 100; its 12 heads are not divisible into 5 KV heads.
        refused(run("sweep", "--config", "gpt2", "--depth", "2,4", "--width", "100", "-o", out), "--width 100", "--heads 12")
        refused(run("sweep", "--config", "gpt2", "--depth", "2,4", "--kv-heads", "5", "-o", out), "--kv-heads 5")
        refused(run("sweep", "--depth", "2,4", "-o", out), "--arch is required", "--config")
        assert not os.path.exists(out), f"a refused sweep wrote {os.listdir(out)}"


@test
def a_resumed_sweep_with_another_config_is_refused():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sweep")
        first = ["--depth", "2,3", *SMALL, "-o", out]
        assert run("sweep", "--config", "gpt2", *first).returncode == 0
        before = snapshot(out)

        again = run("sweep", "--config", "gpt2", *first, "-v")  # the same file resumes
        assert again.returncode == 0, again.stderr
        assert again.stderr.count("skipped") == 2 and "computed" not in again.stderr, again.stderr

        # Another family's file: its values differ (here the norm).
        refused(run("sweep", "--config", "qwen2.5-0.5b", "--arch", "pre-ln", *first), "another model configuration",
                "--config")
        # Another file with the same values, and no file at all: refused by the file recorded.
        copy = os.path.join(tmp, "gpt2-copy.json")
        shutil.copy(GPT2, copy)
        refused(run("sweep", "--config", copy, *first), "--config data/configs/gpt2.json", copy)
        refused(run("sweep", "--arch", "pre-ln", "--norm", "layer", "--init", "gpt2", "--norm-eps", "1e-05", "--bias",
                    "--ffn", "gelu_tanh", *first), "no --config")
        assert snapshot(out) == before, "a refused resume changed the directory"

    with tempfile.TemporaryDirectory() as tmp:
        # The same path, edited: only intermediate_size (the FFN width, fixed for every cell) changed.
        config, out = os.path.join(tmp, "model.json"), os.path.join(tmp, "sweep")
        llama_like(config, 64)
        assert run("sweep", "--config", config, "--depth", "2,3", "--seq", "8", "-q", "-o", out).returncode == 0
        before = snapshot(out)
        llama_like(config, 96)
        refused(run("sweep", "--config", config, "--depth", "2,3", "--seq", "8", "-q", "-o", out),
                "ffn_hidden 64 there, 96 in this run")
        assert snapshot(out) == before, "a refused resume changed the directory"
        assert load(os.path.join(out, "sweep.json"))["model"].get("ffn_hidden") == 64


@test
def help_states_the_option():
    proc = run("sweep", "--help")
    assert proc.returncode == 0 and "--config" in proc.stdout and "config.json" in proc.stdout, proc.stdout


finish()
