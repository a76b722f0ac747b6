"""completep (data/placements/completep.toml; Dey et al. 2025, arXiv 2505.01618, Table 1): its branch
multiplier and its depth-scaled Adam learning rate, at an alpha where the rate is not 1.

- The constants the run records: branch_scale = (B/B_base)^-alpha, adam_lr_scale = (B/B_base)^(alpha-1).
- --update adam: every sublayer's first-order loss change is the same file's without [learning_rate_scale]
  times (B/B_base)^(alpha-1) (Adam's first step is linear in the rate), and the states of the forward pass
  are the same bits; --update sgd keeps --lr (the code and Table 1 prescribe AdamW only).
- The reference interpreter (tests/reference/compare.py) agrees on every --update figure of a copy whose
  alpha defaults to 0.5, so the reference applies the rate independently of gradflow's C++.
- A broken copy (Adam's factor left at 1) fails the rate check: the check can fail.

Usage: test_completep.py GRADFLOW_BINARY REPOSITORY_ROOT
"""
import json
import os
import re
import subprocess
import sys
import tempfile

BINARY, ROOT = sys.argv[1], sys.argv[2]
SOURCE = os.path.join(ROOT, "data", "placements", "completep.toml")
SMALL = ["--width", "16", "--heads", "2", "--seq", "5", "--precision", "f64", "--no-timing", "-q"]
failures = []


def run(arch, *args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        subprocess.run([BINARY, "analyze", "--arch", arch, *SMALL, *args, "-o", out], check=True)
        with open(out) as f:
            return json.load(f)["runs"][0]


def variant(tmp, name, edit):
    """A copy of completep.toml under the id `name`, its text passed through `edit`."""
    with open(SOURCE) as f:
        text = f.read().replace('id = "completep"', f'id = "{name}"')
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write(edit(text))
    return path


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def rate_holds(scaled_file, plain_file, depth, alpha):
    """update_loss of `scaled_file` = (depth)^(alpha-1) times `plain_file`'s, states identical (B_base = 1)."""
    flags = ["--depth", str(depth), "--completep-alpha", str(alpha), "--update", "adam", "--lr", "1e-3"]
    a, b = run(scaled_file, *flags)["seeds"][0], run(plain_file, *flags)["seeds"][0]
    factor = depth ** (alpha - 1)
    loss_a, loss_b = a["sublayers"]["update_loss_1"], b["sublayers"]["update_loss_1"]
    ratio_ok = all(abs(x - factor * y) <= 1e-12 * abs(factor * y) for x, y in zip(loss_a, loss_b))
    return ratio_ok and a["states"]["rms"] == b["states"]["rms"]


with tempfile.TemporaryDirectory() as tmp:
    no_rate = variant(tmp, "completep-no-rate", lambda t: re.sub(r"\[learning_rate_scale\]\nadam = .*\n", "", t))
    check(no_rate and "[learning_rate_scale]" not in open(no_rate).read(), "the copy without a rate has none")

    constants = run("completep", "--depth", "8", "--completep-alpha", "0.5", "--completep-base-depth", "2")[
        "config"]["constants"]
    check(constants["branch_scale"]["value"] == 4 ** -0.5 and constants["adam_lr_scale"]["value"] == 4 ** -0.5,
          f"depth 8, B_base 2, alpha 0.5: branch_scale and adam_lr_scale are (8/2)^-0.5 ({constants})")

    for depth, alpha in ((4, 0.5), (9, 0.75), (4, 1.0)):
        check(rate_holds("completep", no_rate, depth, alpha),
              f"--update adam at depth {depth}, alpha {alpha}: update_loss x {depth}^({alpha} - 1), states equal")

    flags = ["--depth", "4", "--completep-alpha", "0.5", "--update", "sgd", "--lr", "1e-3"]
    check(run("completep", *flags)["seeds"][0]["sublayers"]["update_loss_1"]
          == run(no_rate, *flags)["seeds"][0]["sublayers"]["update_loss_1"], "--update sgd keeps --lr")

    # The reference: a copy whose alpha defaults to 0.5 (its options renamed: a flag is declared once).
    half = variant(tmp, "completep-half", lambda t: t.replace("completep_alpha", "half_alpha")
                   .replace("completep-alpha", "half-alpha").replace("completep_base_depth", "half_base_depth")
                   .replace("completep-base-depth", "half-base-depth")
                   .replace("default = 1\nrange = \"[0.5, 1]\"", "default = 0.5\nrange = \"[0.5, 1]\""))
    check("default = 0.5" in open(half).read(), "the reference's copy has alpha 0.5")
    compare = [sys.executable, os.path.join(ROOT, "tests", "reference", "compare.py"), "--gradflow", BINARY,
               "--arch", half, "--strict", "--depth", "4"]
    for rule in ("adam", "sgd"):
        result = subprocess.run(compare + ["--update", rule, "--update-params", "all"], capture_output=True,
                                text=True)
        compared = "U:sublayer update_loss" in result.stdout
        check(result.returncode == 0 and compared,
              f"compare.py --update {rule}: the reference agrees on every --update figure (exit "
              f"{result.returncode}, update figures compared: {compared})")

    broken = variant(tmp, "completep-broken", lambda t: t.replace('adam = "adam_lr_scale"', 'adam = "1"'))
    check(not rate_holds(broken, no_rate, 4, 0.5), "negative control: Adam's factor left at 1 fails the rate check")

print("all passed" if not failures else f"{len(failures)} failed")
sys.exit(1 if failures else 0)
