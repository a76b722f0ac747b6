#!/usr/bin/python3
"""analyze --checkpoint and archs --checkpoint (issue 28) through the real binary, on tiny checkpoints
made by tests/reference/make_checkpoints.py: the CSV equals the JSON cell for cell, the table and
Markdown summaries, random tokens (warning, determinism, the seed), --loss probe, --update through
the CLI, byte-identical reruns, and what archs prints.

Usage: test_checkpoint_cli.py GRADFLOW_BINARY
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

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from make_checkpoints import make_checkpoint  # noqa: E402

WORK = tempfile.mkdtemp(prefix="gradflow-ckpt-cli-")
LLAMA = os.path.join(WORK, "llama")
GEMMA = os.path.join(WORK, "gemma2")
make_checkpoint(LLAMA, "llama", dtype="BF16")
make_checkpoint(GEMMA, "gemma2", dtype="F32")
TOKENS = os.path.join(WORK, "tokens.txt")
with open(TOKENS, "w") as handle:
    handle.write("1 5 9 2 60 33\n17 4 0 8\n")
TOKEN_IDS = [1, 5, 9, 2, 60, 33, 17, 4, 0, 8]


def run(*args, code=0):
    proc = subprocess.run([BINARY, *args], capture_output=True, text=True)
    assert proc.returncode == code, f"exit {proc.returncode}: {proc.stderr}"
    return proc.stdout, proc.stderr


def analyze_json(*args):
    out, err = run("analyze", *args, "-q", "--format", "json", "--no-timing")
    return json.loads(out), err


@test
def csv_equals_json_cell_for_cell():
    document, _ = analyze_json("--checkpoint", LLAMA, "--tokens", TOKENS)
    out, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    seed = document["runs"][0]["seeds"][0]
    states, sublayers = seed["states"], seed["sublayers"]
    assert len(rows) == len(states["rms"]) == 9, len(rows)
    compared = 0
    for l, row in enumerate(rows):
        for key, values in list(states.items()) + list(sublayers.items()):
            if key in ("index", "streams", "kind", "block") or key not in row:
                continue
            value = values[l] if l < len(values) else None
            cell = row[key]
            if value is None:
                assert cell == "", (key, l, cell)
            else:
                assert float(cell) == value, (key, l, cell, value)
                compared += 1
        assert float(row["loss"]) == seed["checkpoint"]["loss"]
        angular = seed["checkpoint"]["angular_distance"]
        expected = angular[l // 2] if l < 8 and l % 2 == 0 else None
        assert (row["layer_angular_distance"] == "") == (expected is None), (l, row["layer_angular_distance"])
        if expected is not None:
            assert float(row["layer_angular_distance"]) == expected
    assert compared > 100, compared
    assert rows[0]["arch"] == "pre-ln" and rows[0]["kind"] == "attn"


@test
def json_records_the_checkpoint_and_the_tokens():
    document, _ = analyze_json("--checkpoint", GEMMA, "--tokens", TOKENS)
    [run_doc] = document["runs"]
    assert run_doc["arch"] == "peri-ln", run_doc["arch"]
    described = run_doc["config"]["checkpoint"]
    assert described["model_type"] == "gemma2" and described["layers"] == 4, described
    assert described["tokens_file"] == TOKENS and described["loss"] == "lm"
    assert described["tied_embeddings"] is True
    seed = run_doc["seeds"][0]
    assert seed["checkpoint"]["tokens"] == TOKEN_IDS
    assert seed["checkpoint"]["random_tokens"] is False
    assert len(seed["checkpoint"]["angular_distance"]) == 4
    assert run_doc["config"]["seq"] == len(TOKEN_IDS)
    assert 0 < seed["checkpoint"]["loss"] < 20
    # the figures a reader plots are all there and finite
    for key in ("rms", "log10_grad", "log10_grad_rel", "token_cos", "erank"):
        assert all(v is not None and math.isfinite(v) for v in seed["states"][key]), key
    for key in ("gain", "branch_gain", "branch_rms", "stream_share", "output_share", "angle", "log10_param_grad"):
        assert all(v is not None and math.isfinite(v) for v in seed["sublayers"][key]), key
    assert abs(sum(seed["sublayers"]["output_share"]) - 1) < 1e-12


@test
def reruns_are_byte_identical():
    first, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "json", "--no-timing")
    second, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "json", "--no-timing")
    assert first == second


@test
def random_tokens_warn_and_follow_the_seed():
    out, err = run("analyze", "--checkpoint", LLAMA, "--format", "json", "--no-timing", "--seq", "12")
    assert err.count("\n") == 1 and "not text" in err and "--tokens" in err, err
    document = json.loads(out)
    checkpoint = document["runs"][0]["seeds"][0]["checkpoint"]
    assert checkpoint["random_tokens"] is True and len(checkpoint["tokens"]) == 12
    assert all(0 <= t < 61 for t in checkpoint["tokens"])
    assert document["runs"][0]["config"]["checkpoint"]["tokens_file"] is None
    again, _ = run("analyze", "--checkpoint", LLAMA, "--format", "json", "--no-timing", "--seq", "12")
    assert again == out
    other, _ = run("analyze", "--checkpoint", LLAMA, "--format", "json", "--no-timing", "--seq", "12", "--seed", "1")
    assert json.loads(other)["runs"][0]["seeds"][0]["checkpoint"]["tokens"] != checkpoint["tokens"]


@test
def probe_loss():
    document, _ = analyze_json("--checkpoint", LLAMA, "--tokens", TOKENS, "--loss", "probe")
    checkpoint = document["runs"][0]["seeds"][0]["checkpoint"]
    assert checkpoint["loss_kind"] == "probe"
    lm, _ = analyze_json("--checkpoint", LLAMA, "--tokens", TOKENS)
    assert lm["runs"][0]["seeds"][0]["states"]["rms"] == document["runs"][0]["seeds"][0]["states"]["rms"]
    assert lm["runs"][0]["seeds"][0]["states"]["log10_grad"] != document["runs"][0]["seeds"][0]["states"]["log10_grad"]


@test
def update_takes_one_step_through_the_cli():
    document, _ = analyze_json("--checkpoint", LLAMA, "--tokens", TOKENS, "--precision", "f64",
                               "--update", "sgd", "--lr", "1e-6,1e-5")
    seed = document["runs"][0]["seeds"][0]
    steps = seed["summary"]["update"]
    assert [s["learning_rate"] for s in steps] == [1e-6, 1e-5]
    for step in steps:
        assert step["delta_loss"] < 0, step
        assert abs(step["delta_loss"] / step["delta_loss_first_order"] - 1) < 1e-3, step
        assert set(step["step_rel"]) == {"w_q", "w_k", "w_v", "w_o", "w_1", "w_2", "w_3"}, step["step_rel"]
    assert seed["states"]["update_rms_1"][0] == 0.0  # the embedding is not stepped
    out, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "csv", "--update", "adam")
    header = out.splitlines()[0].split(",")
    assert "learning_rate_1" in header and "step_rel_w_3_1" in header and "loss" in header


@test
def table_and_markdown_summaries():
    out, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "table")
    assert "pre-ln" in out and "log10 ratio" in out, out
    assert out.startswith(f"checkpoint {LLAMA} (llama, 4 layers)"), out
    assert "LM loss" in out and "init" not in out.splitlines()[0], out
    out, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "markdown")
    assert "| pre-ln | 8 |" in out, out
    out, _ = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--format", "table", "--update", "adam")
    assert "step on the language-model loss" in out, out


@test
def archs_lists_what_the_checkpoint_holds():
    out, _ = run("archs", "--checkpoint", LLAMA)
    assert "model_type  llama -> placement pre-ln" in out, out
    assert "model.layers.3.mlp.down_proj.weight" in out and "BF16" in out
    out, _ = run("archs", "--checkpoint", LLAMA, "--format", "json")
    described = json.loads(out)
    assert described["model_type"] == "llama" and described["layers"] == 4
    assert described["update_rule"] == "x <- x + F(N(x))"
    names = [t["name"] for t in described["tensors"]]
    assert "model.embed_tokens.weight" in names and all(t["dtype"] == "BF16" for t in described["tensors"])
    gemma = json.loads(run("archs", "--checkpoint", GEMMA, "--format", "json")[0])
    assert gemma["placement"] == "peri-ln" and gemma["update_rule"] == "x <- x + N(F(N(x)))"


@test
def buffers_of_other_dtypes_are_skipped_not_refused():
    """Old GPT-2 saves keep their causal masks (h.N.attn.bias) as U8 or BOOL: gradflow does not read
    them, so their dtype is no error; the same dtype on a weight is."""
    from safetensors_io import load_file, save_file
    import torch
    directory = os.path.join(WORK, "gpt2-u8")
    make_checkpoint(directory, "gpt2")
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    for i in range(4):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8, dtype=torch.uint8))
        tensors[f"h.{i}.attn.masked_bias"] = torch.ones((), dtype=torch.bool)
    save_file(tensors, path)
    document, _ = analyze_json("--checkpoint", directory, "--tokens", TOKENS)
    ignored = document["runs"][0]["config"]["checkpoint"]["ignored_tensors"]
    assert "h.0.attn.bias" in ignored and "h.3.attn.masked_bias" in ignored, ignored
    tensors["h.0.ln_1.weight"] = torch.ones(32, dtype=torch.uint8)
    save_file(tensors, path)
    _, err = run("analyze", "--checkpoint", directory, "--tokens", TOKENS, "-q", code=2)
    assert "'h.0.ln_1.weight'" in err and "U8" in err, err


@test
def flags_that_shape_the_model_are_refused():
    for extra in (["--width", "64"], ["--arch", "keel"], ["--config", "gpt2"], ["--seeds", "2"],
                  ["--probes", "4"], ["--verbose"],
                  ["--angles", "all"], ["--alpha", "2"], ["--update-params", "all", "--update", "adam"]):
        _, err = run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "-o", os.path.join(WORK, "x.json"),
                     *extra, code=2)
        assert err.count("\n") == 1 and extra[0] in err, (extra, err)
        assert not os.path.exists(os.path.join(WORK, "x.json"))
    _, err = run("analyze", "--tokens", TOKENS, "-q", code=2)
    assert "--checkpoint" in err, err


@test
def threads_split_the_ops_of_a_llama_checkpoint():
    # Issue 47: a Llama checkpoint runs through the placement graph and the ops, on --threads threads
    # (the figures the same bits; tests/cli/test_thread_counts.py compares every count).
    path = os.path.join(WORK, "threads.json")
    run("analyze", "--checkpoint", LLAMA, "--tokens", TOKENS, "-q", "--threads", "2", "-o", path)
    with open(path) as file:
        document = json.load(file)
    assert document["threads"] == 2, document.get("threads")


finish()
