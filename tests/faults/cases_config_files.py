#!/usr/bin/python3
"""Malformed or incomplete config.json files for `analyze --config` (issue 19): each exits 2 with one
stderr line naming the key at fault (or the parse error's line and column), prints nothing on
stdout and writes nothing. The files are made here from the shipped Llama 3.2 1B and GPT-2 configs.

Usage: cases_config_files.py GRADFLOW_BINARY
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "configs")
with open(os.path.join(CONFIGS, "llama-3.2-1b.json")) as handle:
    LLAMA = json.load(handle)
with open(os.path.join(CONFIGS, "gpt2.json")) as handle:
    GPT2 = json.load(handle)
LLAMA_TEXT = json.dumps(LLAMA, indent=2)


def edited(base, **changes):
    """The base config with keys changed (a value of None removes the key), as JSON text."""
    config = dict(base)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return json.dumps(config, indent=2)


def case(name, text, message, extra=()):
    return Case(name, ["analyze", "--config", "c.json", *extra, "-q", "-o", "out.json"], message, files={"c.json": text})


CASES = [
    # ---- not JSON, or not an object: the parse error's line and column
    case("missing comma", LLAMA_TEXT.replace('"attention_bias": false,', '"attention_bias": false'),
         r"c\.json: not valid JSON: parse error at line 6, column \d+"),
    case("truncated file", LLAMA_TEXT[:200], r"c\.json: not valid JSON: parse error at line \d+, column \d+"),
    case("empty file", "", r"c\.json: not valid JSON: parse error at line 1, column 1"),
    case("top level array", "[1, 2]", r"c\.json: a config\.json holds one JSON object, not array"),
    # ---- incomplete: the missing key by name
    case("no hidden_size", edited(LLAMA, hidden_size=None), r"c\.json: hidden_size is missing"),
    case("no model_type", edited(LLAMA, model_type=None), r"c\.json: model_type is missing"),
    case("no intermediate_size", edited(LLAMA, intermediate_size=None), r"c\.json: intermediate_size is missing"),
    case("gpt2 without n_layer", edited(GPT2, n_layer=None), r"c\.json: n_layer is missing"),
    # ---- wrong types and impossible values: the key by name
    case("hidden_size a string", edited(LLAMA, hidden_size="2048"),
         r"c\.json: hidden_size must be an integer in \[1, \d+\], not \"2048\""),
    case("zero layers", edited(LLAMA, num_hidden_layers=0), r"c\.json: num_hidden_layers must be an integer in \[1,"),
    case("heads do not divide hidden_size", edited(LLAMA, num_attention_heads=30),
         r"c\.json: num_attention_heads 30 does not divide hidden_size 2048"),
    case("kv heads do not divide heads", edited(LLAMA, num_key_value_heads=5),
         r"c\.json: num_key_value_heads 5 does not divide num_attention_heads 32"),
    case("negative rms_norm_eps", edited(LLAMA, rms_norm_eps=-1e-5),
         r"c\.json: rms_norm_eps must be a number in \(0, 1\), not -1e-05"),
    case("zero initializer_range", edited(LLAMA, initializer_range=0),
         r"c\.json: initializer_range must be a positive number, not 0"),
    case("negative rope_theta", edited(LLAMA, rope_theta=-500000.0), r"c\.json: rope_theta must be a number above 1, not -500000\.0"),
    case("attention_bias a string", edited(LLAMA, attention_bias="no"),
         r"c\.json: attention_bias must be true or false, not \"no\""),
    case("relu FFN", edited(LLAMA, hidden_act="relu"), r"c\.json: hidden_act \"relu\" has no gradflow FFN"),
    case("unknown model_type without --arch", edited(LLAMA, model_type="bert"),
         r"c\.json: model_type \"bert\" is not a family gradflow knows \(gpt2, llama.*give --arch"),
    # ---- the file itself
    Case("no such config", ["analyze", "--config", "llama-9b", "-q", "-o", "out.json"],
         r"--config llama-9b: no such file, and no shipped config of that name \(gemma-2-2b, gpt2, llama-3\.2-1b"),
    Case("config is a directory", ["analyze", "--config", "sub", "-q", "-o", "out.json"],
         r"--config sub is a directory", files={"sub/x": ""}),
    # ---- a flag contradicting the file is the flag's error
    case("kv-heads flag against the file", LLAMA_TEXT, r"--kv-heads 3", extra=["--kv-heads", "3"]),
]

if __name__ == "__main__":
    run_table(CASES)
