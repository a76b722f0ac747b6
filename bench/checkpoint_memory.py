#!/usr/bin/python3
"""Peak memory and wall time of `analyze --checkpoint` on a checkpoint with Llama-3.2-1B's shapes
(issue 28, acceptance 3): random BF16 weights (about 2.5 GB on disk, written here in chunks so that
this script itself stays small), 64 token ids, the LM loss; gradflow must stay under 1.5 GB of
peak RSS because it reads, converts and drops the weights sublayer by sublayer.

Usage: bench/checkpoint_memory.py GRADFLOW [GRADFLOW ...] [--dir DIR] [--keep] [--precision f32|f64]
                                  [--tokens 64] [--threads N] [--rounds R]
Prints one JSON line per run: wall seconds, peak RSS in MB (from wait4's ru_maxrss), the file size.
Several binaries (e.g. today's main and a change) run side by side, interleaved for R rounds on the
same checkpoint, and a last line gives each binary's median wall time and its ratio to the first's
(issue 47, acceptance 3: compare in one run, as the machine's speed drifts).
"""
import statistics
import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "configs", "llama-3.2-1b.json")


def tensors(config):
    """(name, shape) of a Llama checkpoint in state_dict order (tied head: no lm_head.weight)."""
    d, h = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim", d // heads)
    out = [("model.embed_tokens.weight", (config["vocab_size"], d))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (heads * hd, d)),
                (p + "self_attn.k_proj.weight", (kv * hd, d)), (p + "self_attn.v_proj.weight", (kv * hd, d)),
                (p + "self_attn.o_proj.weight", (d, heads * hd)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (h, d)), (p + "mlp.up_proj.weight", (h, d)),
                (p + "mlp.down_proj.weight", (d, h))]
    out.append(("model.norm.weight", (d,)))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (config["vocab_size"], d)))
    return out


def write_checkpoint(directory, config):
    rng = np.random.default_rng(0)
    header, offset = {}, 0
    listing = tensors(config)
    for name, shape in listing:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        chunk = 1 << 24
        for name, shape in listing:
            count = int(np.prod(shape))
            std = 1.0 if name.endswith("norm.weight") else 0.02
            for first in range(0, count, chunk):
                n = min(chunk, count - first)
                values = rng.standard_normal(n, dtype=np.float32) * np.float32(std)
                if std == 1.0:
                    values = np.float32(1.0) + values * np.float32(0.1)
                out.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    with open(os.path.join(directory, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
    with open(os.path.join(directory, "tokens.txt"), "w") as out:
        out.write(" ".join(str(int(t)) for t in rng.integers(0, config["vocab_size"], TOKENS)))


def accepts_threads(binary, directory):
    """Whether `binary` takes --threads with --checkpoint (builds before issue 47 refuse it: one thread)."""
    # --seq 0 is refused too, so neither build does any work here
    probe = subprocess.run([binary, "analyze", "--checkpoint", directory, "--threads", "1", "--seq", "0", "-q"],
                           capture_output=True, text=True)
    return "--threads does not apply" not in probe.stderr


def measure(binary, directory, args):
    """One run of `binary` on the checkpoint: its wall time, peak RSS and a few figures."""
    out = os.path.join(directory, "out.json")
    command = [binary, "analyze", "--checkpoint", directory, "--tokens", os.path.join(directory, "tokens.txt"),
               "--precision", args.precision, "-q", "--format", "json", "-o", out]
    if args.threads and accepts_threads(binary, directory):
        command += ["--threads", str(args.threads)]
    start = time.time()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.time() - start
    code = os.waitstatus_to_exitcode(status)
    with open(out) as handle:
        doc = json.load(handle)
    os.remove(out)
    seed = doc["runs"][0]["seeds"][0]
    return {"binary": binary, "exit": code, "wall_seconds": round(wall, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "file_gb": round(os.path.getsize(os.path.join(directory, "model.safetensors")) / 1e9, 3),
            "precision": args.precision, "tokens": TOKENS, "threads": doc.get("threads"),
            "loss": seed["checkpoint"]["loss"], "log10_grad_0": seed["states"]["log10_grad"][0]}


def main():
    global TOKENS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gradflow", nargs="+")
    parser.add_argument("--dir")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--precision", default="f32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, help="--threads for every binary (default: gradflow's, all cores)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    TOKENS = args.tokens
    with open(CONFIG) as handle:
        config = json.load(handle)
    directory = args.dir or tempfile.mkdtemp(prefix="gradflow-1b-")
    os.makedirs(directory, exist_ok=True)
    try:
        if not os.path.exists(os.path.join(directory, "model.safetensors")):
            start = time.time()
            write_checkpoint(directory, config)
            print(f"wrote {directory} in {time.time() - start:.0f} s", file=sys.stderr)
        walls = {binary: [] for binary in args.gradflow}
        code = 0
        for _ in range(args.rounds):
            for binary in args.gradflow:
                result = measure(binary, directory, args)
                print(json.dumps(result), flush=True)
                walls[binary].append(result["wall_seconds"])
                code = code or result["exit"]
        first = statistics.median(walls[args.gradflow[0]])
        print(json.dumps({binary: {"median_wall_seconds": statistics.median(w),
                                   "ratio_to_first": round(statistics.median(w) / first, 3)}
                          for binary, w in walls.items()}))
        return code
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
