#!/usr/bin/python3
"""ctest: `gradflow analyze --checkpoint` against the independent float64 reference (checkpoint_reference.py).

Makes the standard set of tiny checkpoints (make_checkpoints.py) in a temp dir, plus the trained model at
data/checkpoints/tiny-llama-trained/ when it exists, runs
    GRADFLOW analyze --checkpoint DIR --tokens TOKENS --precision f64 --format json -q
and the reference on each, and compares loss, every rms, every log10_grad (as norms) and every angular distance
with relative tolerance 1e-10. Prints one line per checkpoint (worst error per figure), then 'N passed, N failed'.

    test_checkpoint_reference.py GRADFLOW_BINARY [--only NAME ...] [--tol 1e-10] [--keep DIR]
    test_checkpoint_reference.py --reference-as-gradflow            # a fake binary answering with the reference
    test_checkpoint_reference.py --reference-as-gradflow --perturb  # the fake scales one gain by 1.001: every
                                                                    # checkpoint must FAIL (exit 0 iff all caught)
Exit codes: 0 agreement (or, with --perturb, every perturbation caught), 1 a mismatch, 2 usage.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkpoint_reference as ref  # noqa: E402
import make_checkpoints  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
TRAINED = os.path.join(REPO, "data", "checkpoints", "tiny-llama-trained")
PERTURB_FACTOR = 1.001


# ---------------------------------------------------------------------------------------------------------------
# The fake gradflow (used only to exercise this script before / besides the C++): answers `analyze` with the
# reference's figures in gradflow's JSON shape.

def perturb_one_gain(config, tensors):
    """Scale layer 0's first norm gain by PERTURB_FACTOR (Gemma-2: its effective gain 1 + w). Returns the name."""
    pattern = re.compile(r"(^|\.)(layers|h)\.0\..*(norm|ln_\d)\.weight$")
    name = sorted(n for n in tensors if pattern.search(n))[0]
    if config.get("model_type") == "gemma2":
        tensors[name] = (1.0 + tensors[name]) * PERTURB_FACTOR - 1.0
    else:
        tensors[name] = tensors[name] * PERTURB_FACTOR
    return name


def act_as_gradflow(argv):
    parser = argparse.ArgumentParser(prog="fake-gradflow")
    parser.add_argument("command", choices=["analyze"])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--precision", required=True, choices=["f64"])
    parser.add_argument("--format", required=True, choices=["json"])
    parser.add_argument("-q", action="store_true", required=True)
    parser.add_argument("--perturb", action="store_true")
    args = parser.parse_args(argv)
    config, tensors = ref.load_checkpoint(args.checkpoint)
    if args.perturb:
        print(f"fake-gradflow: scaled {perturb_one_gain(config, tensors)} by {PERTURB_FACTOR}", file=sys.stderr)
    result = ref.analyze(config, tensors, ref.read_tokens(args.tokens))
    seed = {"states": {"rms": result["rms"], "log10_grad": result["log10_grad"]},
            "checkpoint": {"loss": result["loss"], "angular_distance": result["angular_distance"],
                           "logits_shape": result["logits_shape"]}}
    print(json.dumps({"schema_version": 0, "tool": "fake-gradflow", "runs": [{"seeds": [seed]}]}))
    return 0


def write_fake_binary(directory, perturb):
    path = os.path.join(directory, "fake-gradflow")
    with open(path, "w") as handle:
        handle.write(f'#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} --act-as-gradflow '
                     f'{"--perturb " if perturb else ""}"$@"\n')
    os.chmod(path, 0o755)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Comparison

def as_float(value):
    """gradflow may write a non-finite double as a string or null."""
    if value is None:
        return math.nan
    return float(value)


def rel_error(a, b):
    a, b = as_float(a), as_float(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if (a == b or (math.isnan(a) and math.isnan(b))) else math.inf
    return abs(a - b) / max(abs(a), abs(b)) if a != b else 0.0


def norm_rel_error(log_a, log_b):
    """Relative error of the norms 10**log_a, 10**log_b: |n_a - n_b| / max(n_a, n_b) = 1 - 10**-|log_a - log_b|."""
    a, b = as_float(log_a), as_float(log_b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    return -math.expm1(-abs(a - b) * math.log(10.0))


def compare(gradflow_doc, reference, tol):
    """(worst errors per figure, list of problems)."""
    problems = []
    try:
        seed = gradflow_doc["runs"][0]["seeds"][0]
        got = {"loss": seed["checkpoint"]["loss"], "rms": seed["states"]["rms"],
               "log10_grad": seed["states"]["log10_grad"],
               "angular_distance": seed["checkpoint"]["angular_distance"]}
    except (KeyError, IndexError, TypeError) as err:
        return {}, [f"gradflow JSON lacks runs[0].seeds[0].states/checkpoint fields ({err!r})"]
    worst = {"loss": rel_error(got["loss"], reference["loss"])}
    for key, error in (("rms", rel_error), ("log10_grad", norm_rel_error), ("angular_distance", None)):
        if len(got[key]) != len(reference[key]):
            problems.append(f"{key}: gradflow has {len(got[key])} values, the reference {len(reference[key])}")
            worst[key] = math.inf
            continue
        if key == "angular_distance":  # in [0, 1]: absolute 1e-10 or relative 1e-10
            errors = [min(abs(as_float(a) - b), rel_error(a, b)) for a, b in zip(got[key], reference[key])]
        else:
            errors = [error(a, b) for a, b in zip(got[key], reference[key])]
        worst[key] = max(errors, default=0.0)
        bad = [i for i, e in enumerate(errors) if not e <= tol]
        if bad:
            i = bad[0]
            problems.append(f"{key}[{i}]: gradflow {got[key][i]!r}, reference {reference[key][i]!r}"
                            + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""))
    if not worst["loss"] <= tol:
        problems.append(f"loss: gradflow {got['loss']!r}, reference {reference['loss']!r}")
    return worst, problems


def run_gradflow(binary, checkpoint, tokens):
    cmd = [binary, "analyze", "--checkpoint", checkpoint, "--tokens", tokens, "--precision", "f64",
           "--format", "json", "-q"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"could not run {' '.join(cmd)}: {err}"
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"
    try:
        return json.loads(proc.stdout), None
    except json.JSONDecodeError as err:
        return None, f"stdout is not JSON ({err}): {proc.stdout[:200]!r}"


def trained_tokens(directory, default_tokens, workdir):
    """A tokens file valid for the trained model: its own tokens*.txt if it ships one, else ours if in range."""
    for name in sorted(os.listdir(directory)):
        if name.startswith("tokens") and name.endswith(".txt"):
            return os.path.join(directory, name)
    with open(os.path.join(directory, "config.json")) as handle:
        vocab = json.load(handle)["vocab_size"]
    if max(ref.read_tokens(default_tokens)) < vocab:
        return default_tokens
    path = os.path.join(workdir, "tokens-trained.txt")
    make_checkpoints.write_tokens(path, vocab=vocab)
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--act-as-gradflow"]:
        rest = argv[1:]
        perturb = "--perturb" in rest
        return act_as_gradflow([a for a in rest if a != "--perturb"] + (["--perturb"] if perturb else []))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gradflow", nargs="?", help="path of the gradflow binary")
    parser.add_argument("--reference-as-gradflow", action="store_true",
                        help="use a fake binary that answers with the reference (tests this script)")
    parser.add_argument("--perturb", action="store_true",
                        help="with --reference-as-gradflow: the fake scales one gain by 1.001; all must be caught")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these standard-set entries")
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument("--keep", metavar="DIR", help="write the checkpoints to DIR and keep them")
    args = parser.parse_args(argv)
    if bool(args.gradflow) == args.reference_as_gradflow:
        parser.error("give GRADFLOW_BINARY or --reference-as-gradflow (not both)")
    if args.perturb and not args.reference_as_gradflow:
        parser.error("--perturb needs --reference-as-gradflow")
    if args.gradflow and not os.access(args.gradflow, os.X_OK):
        parser.error(f"{args.gradflow} is not an executable")

    workdir = tempfile.mkdtemp(prefix="gradflow-ckpt-")
    try:
        outdir = args.keep or os.path.join(workdir, "checkpoints")
        binary = write_fake_binary(workdir, args.perturb) if args.reference_as_gradflow else args.gradflow
        tokens = os.path.join(outdir, "tokens.txt")
        os.makedirs(outdir, exist_ok=True)
        make_checkpoints.write_tokens(tokens)
        entries = [(name, path, tokens) for name, path in make_checkpoints.make_standard_set(outdir)
                   if not args.only or name in args.only]
        if args.only and len(entries) != len(args.only):
            parser.error(f"--only: unknown names; the set is {[n for n, _, _ in make_checkpoints.STANDARD_SET]}")
        if os.path.isdir(TRAINED):
            entries.append(("tiny-llama-trained", TRAINED, trained_tokens(TRAINED, tokens, workdir)))
        else:
            print(f"SKIP tiny-llama-trained: {os.path.relpath(TRAINED, REPO)}/ is absent")

        passed = failed = 0
        for name, path, token_file in entries:
            config, tensors = ref.load_checkpoint(path)
            reference = ref.analyze(config, tensors, ref.read_tokens(token_file))
            doc, error = run_gradflow(binary, path, token_file)
            worst, problems = compare(doc, reference, args.tol) if doc is not None else ({}, [error])
            figures = "  ".join(f"{k} {v:.1e}" for k, v in worst.items())
            if args.perturb:  # the comparison must catch the 1.001 gain
                ok = bool(problems) and doc is not None
                print(f"{'PASS' if ok else 'FAIL'} {name:28s} perturbation {'caught' if ok else 'MISSED'}  {figures}")
            else:
                ok = not problems
                print(f"{'PASS' if ok else 'FAIL'} {name:28s} {figures}")
                for problem in problems:
                    print(f"     {problem}")
            passed, failed = passed + ok, failed + (not ok)
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
