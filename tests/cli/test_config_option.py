#!/usr/bin/python3
"""analyze --config (issue 19) through the real binary: a shipped config found by name, flags
overriding it, where every value came from in the JSON, the notes on stderr, -v's unused keys, and
no config_file object without --config.

Usage: test_config_option.py GRADFLOW_BINARY
"""
import json
import os
import subprocess
import sys

from cli_testing import finish, test

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "configs")
# Small sizes over the file's own, so that each run takes a moment.
SMALL = ["--depth", "2", "--width", "32", "--heads", "2", "--seq", "4", "-q", "--format", "json", "--no-timing"]


def analyze(*args):
    proc = subprocess.run([BINARY, "analyze", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@test
def gpt2_by_name_flags_override_and_sources():
    document, stderr = analyze("--config", "gpt2", *SMALL)
    [run] = document["runs"]
    config = run["config"]
    assert run["arch"] == "pre-ln", run["arch"]
    assert (config["width"], config["blocks"], config["heads"], config["seq"]) == (32, 2, 2, 4), config
    assert config["norm"] == "layer" and config["init"] == "gpt2" and config["ffn_hidden"] == 128, config
    source = config["config_file"]
    assert source["path"] == "data/configs/gpt2.json" and source["model_type"] == "gpt2", source
    sources = source["sources"]
    assert sources["arch"] == "config.json:model_type (gpt2 -> pre-ln)", sources
    assert sources["width"] == "--width" and sources["blocks"] == "--depth" and sources["seq"] == "--seq", sources
    assert sources["norm"] == "model_type gpt2" and sources["probes"] == "default", sources
    assert sources["head_dim"] == "derived (--width/--heads)", sources
    assert config["ffn"] == "gelu_tanh" and sources["ffn"] == "config.json:activation_function", config
    assert "tanh approximation" not in stderr, stderr
    assert "keys not used" not in stderr, stderr


@test
def arch_given_replaces_the_family_placement():
    document, _ = analyze("--config", os.path.join(CONFIGS, "gpt2.json"), "--arch", "keel,post-ln", *SMALL)
    assert [run["arch"] for run in document["runs"]] == ["keel", "post-ln"]
    for run in document["runs"]:
        assert run["config"]["config_file"]["sources"]["arch"] == "--arch"
        assert run["config"]["config_file"]["path"].endswith("data/configs/gpt2.json")


@test
def verbose_lists_the_unused_keys_once():
    _, stderr = analyze("--config", "gpt2", *SMALL, "-v")
    lines = [line for line in stderr.splitlines() if "keys not used" in line]
    assert len(lines) == 1, stderr
    assert "n_ctx" in lines[0] and "vocab_size" in lines[0] and "n_embd" not in lines[0], lines[0]


@test
def seq_stays_64_without_the_flag():
    """The file's context length (max_position_embeddings 131072) is only an upper bound: T stays 64."""
    document, _ = analyze("--config", "llama-3.2-1b", "--depth", "1", "--width", "64", "--heads", "4",
                          "--kv-heads", "2", "--ffn-hidden", "128", "-q", "--format", "json", "--no-timing")
    config = document["runs"][0]["config"]
    assert config["seq"] == 64 and config["config_file"]["sources"]["seq"] == "default", config
    assert config["rope_theta"] == 500000.0 and config["ffn"] == "swiglu", config


@test
def no_config_file_without_config():
    document, _ = analyze("--arch", "keel", *SMALL)
    assert "config_file" not in document["runs"][0]["config"]


finish()
