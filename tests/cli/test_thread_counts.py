#!/usr/bin/python3
"""Issue 29: `gradflow analyze` gives bit-identical figures for --threads 1, 2, 3, 4, 7 and 16.

Each case runs the binary once per thread count with --no-timing (which leaves the wall times and
the thread count out) and compares the JSON documents, parsed, with the threads-1 document. Only
the "tool" block (the binary's name, version, commit, compiler, kernels) is removed before the
comparison; every figure is kept. gradflow writes doubles at round-trip precision (docs/output.md),
so equal text means equal doubles; the comparison is stricter still: two numbers are equal only when
they have the same JSON type and the same 64 bits (0.0 and -0.0 differ). A mismatch names the first
differing path, e.g. $.runs[23](mhc).seeds[0].states.log10_grad[5], with both values.

Where the threads go (src/runner.cpp): several placements run side by side, one thread each; a
run alone splits each op over threads. So --arch all covers the side-by-side loop, keel at depth
256 (the default width, heads and sequence) a long lone run, and every placement alone at the small
config (there is no option making --arch all's runs go one at a time) the split of each placement's
ops, multi-stream ones (hc, mhc, siamese-norm, ...) included.

Usage: test_thread_counts.py GRADFLOW_BINARY
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from cli_testing import finish, first_difference, show, test

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
THREAD_COUNTS = [1, 2, 3, 4, 7, 16]
SMALL = ["--depth", "8", "--width", "64", "--heads", "4", "--seq", "16"]  # every placement accepts it
UPDATE = ["--update", "adam"]  # --update has no default optimizer; adam's step is sgd's and more
RUN_TIMEOUT = 300  # seconds per run: a deadlocked thread pool fails naming its command, not ctest's timeout


def command_line(args, threads, path):
    return [BINARY, "analyze", *args, "--threads", str(threads), "--no-timing", "-q", "--format", "json",
            "-o", path]


def analyze(args, threads, path):
    """The document of one run, without its "tool" block (what binary wrote it, not a figure)."""
    command = command_line(args, threads, path)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{shlex.join(command)} ran for over {RUN_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise AssertionError(f"{shlex.join(command)} exited {proc.returncode}: {proc.stderr.strip()}")
    with open(path) as file:
        doc = json.load(file)
    doc.pop("tool", None)
    return doc


def assert_same_for_every_thread_count(args, directory, check=None):
    """Runs args at each thread count; the first document differing from the threads-1 one fails."""
    reference = None
    for threads in THREAD_COUNTS:
        path = os.path.join(directory, f"threads-{threads}.json")
        doc = analyze(args, threads, path)
        if reference is None:
            if check:
                check(doc)
            reference = doc
            continue
        found = first_difference(reference, doc)
        if found:
            where, a, b = found
            raise AssertionError(
                f"--threads {THREAD_COUNTS[0]} and --threads {threads} differ at {where}:\n"
                f"       threads {THREAD_COUNTS[0]}: {show(a)}\n       threads {threads}: {show(b)}\n"
                f"       {shlex.join(command_line(args, threads, 'FILE'))}")


def has_figures(args, runs=None):
    """Guards against a vacuous comparison: the document holds runs (as many as asked) with seeds,
    and the update figures when --update is given."""
    def check(doc):
        assert doc.get("runs"), f"no runs in the document of {shlex.join(args)}"
        if runs is not None:
            assert len(doc["runs"]) == runs, f"{len(doc['runs'])} runs, {runs} placements listed"
        for run in doc["runs"]:
            states = run["seeds"][0]["states"]
            assert "log10_grad" in states, f"{run['arch']}: no log10_grad"
            if "--update" in args:
                assert "update_rms_1" in states, f"{run['arch']}: no update figures with --update"
    return check


def placements():
    proc = subprocess.run([BINARY, "archs", "--format", "json"], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)["architectures"]


def case(label, function):
    function.__name__ = f"{label} [threads {','.join(map(str, THREAD_COUNTS))}]"
    test(function)


ARCHS = placements()
VARIANTS = [(precision, update) for update in ([], UPDATE) for precision in ("f32", "f64")]


def all_placements_together(extra):
    args = ["--arch", "all", *SMALL, *extra]

    def run():
        with tempfile.TemporaryDirectory() as directory:
            assert_same_for_every_thread_count(args, directory, has_figures(args, runs=len(ARCHS)))
    case(shlex.join(args), run)


def every_placement_alone(extra):
    assert any(len(arch["streams"]) > 1 for arch in ARCHS), "no multi-stream placement listed"

    def run():
        for arch in ARCHS:
            args = ["--arch", arch["id"], *SMALL, *extra]
            with tempfile.TemporaryDirectory() as directory:
                assert_same_for_every_thread_count(args, directory, has_figures(args, runs=1))
    case(f"each of the {len(ARCHS)} placements alone: --arch ID {shlex.join(SMALL + extra)}", run)


def keel_at_depth_256(extra):
    args = ["--arch", "keel", "--depth", "256", *extra]

    def run():
        with tempfile.TemporaryDirectory() as directory:
            assert_same_for_every_thread_count(args, directory, has_figures(args, runs=1))
    case(shlex.join(args), run)


def checkpoint_run(label, directory_of, extra):
    """Issue 47: a trained checkpoint through the placement graph and the ops splits them over threads
    as an init run does. directory_of() makes or names the checkpoint directory (it holds tokens.txt)."""
    def run():
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = directory_of(directory)
            args = ["--checkpoint", checkpoint, "--tokens", os.path.join(checkpoint, "tokens.txt"), *extra]
            assert_same_for_every_thread_count(args, directory, has_figures(args, runs=1))
            # the run did use the threads (families the ops cover; docs/checkpoints.md)
            with open(os.path.join(directory, f"threads-{THREAD_COUNTS[-1]}.json")) as file:
                assert json.load(file)["runs"][0]["config"]["checkpoint"], "no checkpoint block"
    case(f"--checkpoint {label} {shlex.join(extra)}", run)


def trained_llama(_):
    return os.path.join(os.path.dirname(__file__), "..", "..", "data", "checkpoints", "tiny-llama-trained")


def random_gpt2(directory):
    """A tiny GPT-2 (LayerNorm with biases, tanh GELU, position embeddings), BF16, from the reference's maker."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
    from make_checkpoints import make_checkpoint, write_tokens
    path = os.path.join(directory, "gpt2")
    make_checkpoint(path, "gpt2", dtype="BF16", seed=3)
    write_tokens(os.path.join(path, "tokens.txt"), count=16)
    return path


start = time.monotonic()
for precision, update in VARIANTS:
    all_placements_together(["--precision", precision, *update])
for precision, update in VARIANTS:
    every_placement_alone(["--precision", precision, *update])
for precision, update in VARIANTS:
    keel_at_depth_256(["--precision", precision, *update])
# Issue 33: the mixture-of-experts FFN splits its work one expert per piece and sums over experts
# in a fixed order; with a gated shared expert and biases, and a step of every tensor.
MOE = ["--ffn", "moe", "--experts", "6", "--experts-active", "2", "--shared-expert-hidden", "32", "--bias"]
for precision, update in VARIANTS:
    all_placements_together(["--precision", precision, *update, *MOE])
for precision, update in VARIANTS:
    checkpoint_run("data/checkpoints/tiny-llama-trained", trained_llama, ["--precision", precision, *update])
checkpoint_run("gpt2 (BF16)", random_gpt2, ["--precision", "f32", *UPDATE])
print(f"{time.monotonic() - start:.1f} s in all")
finish()
