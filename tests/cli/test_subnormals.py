#!/usr/bin/python3
"""Flushing subnormals to zero in the backward pass (kernels.hpp, `flush_subnormals`) changes no
figure: `GRADFLOW_KERNELS=subnormals` (IEEE gradual underflow) and the default give the same
document, bit for bit, for the placements whose backward pass meets subnormal numbers.

Post-LN damps some tokens' gradient far faster than others, so single entries of its renormalised
cotangent fall below float's smallest normal; HybridNorm and B2T do the same. At the config below
(depth 256, width 64, seq 16) the gradual run took 0.27 s against 0.17 s flushed on 2026-12-04:
the subnormals are there, and each operation on one costs a microcode assist. Both f32 runs with
and without --update (whose backward runs through every weight), on 1 and 6 threads (2 per run).

Usage: test_subnormals.py GRADFLOW_BINARY
"""
import json
import os
import shlex
import subprocess
import sys

from cli_testing import finish, first_difference, show, test

BINARY = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")
ARGS = ["--arch", "post-ln,hybridnorm,b2t", "--depth", "256", "--width", "64", "--heads", "4", "--seq", "16",
        "--no-timing", "-q", "--format", "json"]


def document(args, kernels):
    env = dict(os.environ)
    env.pop("GRADFLOW_KERNELS", None)
    if kernels:
        env["GRADFLOW_KERNELS"] = kernels
    command = [BINARY, "analyze", *args]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"{shlex.join(command)} exited {proc.returncode}: {proc.stderr.strip()}"
    doc = json.loads(proc.stdout)
    doc.pop("tool", None)  # the binary's provenance, not a figure
    assert len(doc["runs"]) == 3 and all("log10_grad" in run["seeds"][0]["states"] for run in doc["runs"])
    return doc


def case(extra, threads):
    args = [*ARGS, *extra, "--threads", str(threads)]

    def run():
        found = first_difference(document(args, ""), document(args, "subnormals"))
        if found:
            where, flushed, gradual = found
            raise AssertionError(f"GRADFLOW_KERNELS=subnormals changes {shlex.join(args)} at {where}: "
                                 f"flushed {show(flushed)}, gradual {show(gradual)}")
    run.__name__ = f"gradual underflow and flushed subnormals agree: {shlex.join(extra + ['--threads', str(threads)])}"
    test(run)


@test
def the_comparison_can_fail():
    # A document that differs in one figure's last bit, or in the sign of a zero, is caught.
    assert first_difference({"a": [0.1]}, {"a": [0.10000000000000002]}) is not None
    assert first_difference({"a": 0.0}, {"a": -0.0}) is not None
    assert first_difference({"a": [0.1]}, {"a": [0.1]}) is None


for extra in ([], ["--update", "adam"]):
    for threads in (1, 6):  # 6: each of the three runs splits its ops over 2 threads
        case(extra, threads)
finish()
