#!/usr/bin/python3
"""The project's own CI gate (run by ctest): for every baseline in data/baselines/, rerun the
command data/baselines/README.md states and `gradflow check` it against the baseline (exit 0),
with a few expectations per placement.

Usage: test_baselines.py GRADFLOW_BINARY BASELINE_DIR
"""
import glob
import os
import subprocess
import sys
import tempfile

BINARY, BASELINES = sys.argv[1], sys.argv[2]
# The command every baseline was made with (scripts/make-baselines), minus --arch and -o.
COMMAND = ["analyze", "--depth", "16", "-q"]
EXPECTATIONS = {
    "keel": ["keel.log10_grad_ratio < 0.1", "keel.gain_min.value > 0.5", "keel.growth_class == bounded"],
    "pre-ln": ["pre-ln.growth_class == sqrt"],
    "post-ln": ["post-ln.growth_class == bounded"],
    "deepnorm": ["deepnorm.growth_class == bounded"],
}

failed = 0
paths = sorted(glob.glob(os.path.join(BASELINES, "*.json")))
if not paths:
    print(f"no baselines in {BASELINES}")
    sys.exit(1)
with tempfile.TemporaryDirectory() as tmp:
    for baseline in paths:
        arch = os.path.splitext(os.path.basename(baseline))[0]
        result = os.path.join(tmp, f"{arch}.json")
        proc = subprocess.run([BINARY, *COMMAND, "--arch", arch, "-o", result], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"FAIL {arch}: analyze exited {proc.returncode}: {proc.stderr}")
            failed += 1
            continue
        expect = [x for e in EXPECTATIONS.get(arch, []) for x in ("--expect", e)]
        proc = subprocess.run([BINARY, "check", result, "--baseline", baseline, *expect], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"FAIL {arch}: check exited {proc.returncode}\n{proc.stdout}{proc.stderr}")
            failed += 1
        else:
            print(f"ok   {arch}: {proc.stdout.splitlines()[2]}")
print(f"{len(paths) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
