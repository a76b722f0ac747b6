#!/usr/bin/python3
"""The placement language's attend (attention over depth, docs/placement-files.md "Reading a history"):
gradflow against the reference interpreter (tests/reference/placement_file.py, its own attend and an autograd
backward through the whole history) on the shipped data/placements/attnres-history.toml (Full AttnRes) and
attnres-block-history.toml (Block AttnRes: [history] keeps only the block boundaries, --attnres-blocks 2).

Every figure of the run (states' rms and log10_grad, per stream; gain; branch_rms, stream_share) agrees
within compare.py's tolerance for the pseudo-queries at 0 (--attnres-query 0, the paper's init: uniform reads)
and at 0.3 (a softmax that is not uniform, with the keys' gradient path), for --block attn-ffn and ffn, --norm
rms and layer (f64). Two more fixtures: two-histories.toml (two history streams, three reads a sublayer, one
inside F's input) and attend-when.toml (only attention sublayers read a history: with --block ffn none does, so
the run is Markov, skip_gain is reported and --spectrum runs). Every comparison also runs --update (issue 30,
acceptance 1 and 2): one optimizer step with a stepped history, and under --update-params all every read's
pseudo-query stepped too, against the reference's own step (gradflow_reference.model_update with
PseudoQueries); a comparison without its update rows fails. --exact-jacobian's Frobenius and spectral norms of
J_{l->out} at every state agree with the reference's (placement_file.exact_jacobian_history: autograd through the
whole history, one backward per output coordinate) within 1e-10 in log10. Two negative controls run copies in
gradflow only, one whose reads take h's history instead of v's (Full), one without [history] (Block: every
state a source), and require the comparison with the shipped file to fail.

Usage: test_attend_reference.py GRADFLOW_BINARY REPOSITORY_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

BINARY, ROOT = sys.argv[1], sys.argv[2]
HISTORY = os.path.join(ROOT, "tests", "placements", "history")
SHIPPED = os.path.join(ROOT, "data", "placements")
FULL = "attnres-history"          # Full AttnRes: every state of v is a source
BLOCK = "attnres-block-history"   # Block AttnRes: [history] keeps p's block boundaries only
COMPARE = os.path.join(ROOT, "tests", "reference", "compare.py")
ALL_SGD = ("--update", "sgd", "--update-params", "all")


FIXED = os.path.join(HISTORY, "fixed-weights.toml")  # history_sum and history_mean, every other state kept
# (placement or file, its own flags): AttnRes at the paper's zero pseudo-queries and at 0.3 (Block AttnRes with
# N = 2: at --depth 3 a block of two and one of one), DenseFormer's DWA at its identity init and with uniform
# weights (history_sum), and the fixed-weight fixture.
CASES = [(FULL, ["--attnres-query", "0"]), (FULL, ["--attnres-query", "0.3"]),
         (BLOCK, ["--attnres-query", "0", "--attnres-blocks", "2"]),
         (BLOCK, ["--attnres-query", "0.3", "--attnres-blocks", "2"]),
         ("denseformer-history", ["--dwa-init", "identity"]), ("denseformer-history", ["--dwa-init", "uniform"]),
         (FIXED, [])]


def options(name, query):
    """Full or Block AttnRes's flags: the pseudo-queries' init and, for Block AttnRes, N = 2."""
    return next(flags for n, flags in CASES if n == name and flags[1] == str(query))


def compare_options(flags):
    return [a for flag, value in zip(flags[::2], flags[1::2]) for a in ("--placement-option", f"{flag[2:]}={value}")]


def file_of(name):
    return name if name.endswith(".toml") else os.path.join(SHIPPED, name + ".toml")


def wrong_copy(tmp, name, old, new):
    """A copy of a shipped file under another id, with `old` replaced by `new` (a negative control)."""
    with open(file_of(name)) as f:
        text = f.read()
    placement_id = os.path.basename(name)[:-len(".toml")] if name.endswith(".toml") else name
    assert old in text and f'id = "{placement_id}"' in text
    path = os.path.join(tmp, placement_id + "-wrong.toml")
    with open(path, "w") as f:
        f.write(text.replace(old, new).replace(f'id = "{placement_id}"', f'id = "{placement_id}-wrong"'))
    return path


def compare(path, *args):
    proc = subprocess.run([sys.executable, COMPARE, "--gradflow", BINARY, "--arch", path, "--strict", *args],
                          capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    # the update's rows (U:...) must have been compared, not skipped
    updated = "--update" not in args or "delta_loss_first_order" in out
    return (proc.returncode if updated else 1), out


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in CASES:
            for block in ("attn-ffn", "ffn"):
                for norm in ("rms", "layer"):
                    code, out = compare(name, "--block", block, "--norm", norm, "--depth", "3", *ALL_SGD,
                                        *compare_options(flags))
                    ok = code == 0 and "=OK" in out
                    print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(name)} {' '.join(flags)}, --block {block}, "
                          f"--norm {norm}, {' '.join(ALL_SGD)}")
                    if not ok:
                        failures.append(out)
        for update in (("--update", "adam", "--update-params", "all"), ("--update", "adam")):
            code, out = compare(FULL, "--block", "attn-ffn", "--depth", "3", *update, *compare_options(options(FULL, 0.3)))
            ok = code == 0 and "=OK" in out
            print(f"{'ok  ' if ok else 'FAIL'} {FULL}, --attnres-query 0.3, --block attn-ffn, {' '.join(update)}")
            if not ok:
                failures.append(out)
        adam_all = ("--update", "adam", "--update-params", "all")
        for name, args in (("two-histories", ("--block", "attn-ffn", *adam_all)),
                           ("two-histories", ("--block", "ffn", *adam_all)),
                           ("attend-when", ("--block", "attn-ffn", *ALL_SGD)), ("attend-when", ("--block", "ffn"))):
            code, out = compare(os.path.join(HISTORY, name + ".toml"), *args, "--depth", "3")
            ok = code == 0 and "=OK" in out
            print(f"{'ok  ' if ok else 'FAIL'} {name} {' '.join(args)}")
            if not ok:
                failures.append(out)
        # attend-when with --block ffn builds no attend node: a Markov run, with the skip path's figures
        out = os.path.join(tmp, "markov.json")
        subprocess.run([BINARY, "analyze", "--arch", os.path.join(HISTORY, "attend-when.toml"), "--block", "ffn",
                        "--depth", "3", "--width", "16", "--heads", "2", "--seq", "5", "--spectrum", "2", "-q",
                        "-o", out], check=True)
        with open(out) as f:
            skip = json.load(f)["runs"][0]["seeds"][0]["sublayers"]["skip_gain"]
        markov = all(v is not None for v in skip)
        print(f"{'ok  ' if markov else 'FAIL'} attend-when --block ffn is a Markov run (skip_gain {skip})")
        if not markov:
            failures.append("attend-when with --block ffn reported a null skip_gain")
        # --exact-jacobian: the exact J_{l->out} through every later read, against autograd's
        sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
        import placement_file as PF
        for name, flags in CASES:
            path = file_of(name)
            for block in ("attn-ffn", "ffn"):
                export, out = os.path.join(tmp, "exact.safetensors"), os.path.join(tmp, "exact.json")
                subprocess.run([BINARY, "analyze", "--arch", name, "--block", block, "--depth", "3", "--width", "8",
                                "--heads", "2", "--seq", "4", "--precision", "f64", "--exact-jacobian", "--no-timing",
                                "-q", "--export-weights", export, "-o", out, *flags], check=True)
                with open(out) as f:
                    ours = json.load(f)["runs"][0]["seeds"][0]["states"]
                stack, x0, _, _, _ = PF.build_from_export(PF.load(path), export, {"block": block})
                fro, spectral = PF.exact_jacobian_history(stack, x0)
                gap = max(max(abs(a - b) for a, b in zip(ours["log10_jacobian_fro_exact"], fro)),
                          max(abs(a - b) for a, b in zip(ours["log10_jacobian_spectral_exact"], spectral)))
                ok = gap <= 1e-10
                print(f"{'ok  ' if ok else 'FAIL'} --exact-jacobian, {os.path.basename(name)} {' '.join(flags)}, --block {block}: largest log10 "
                      f"gap {gap:.2e} over {len(fro)} states")
                if not ok:
                    failures.append(f"--exact-jacobian {name} {flags} {block}: gradflow {ours['log10_jacobian_fro_exact']}"
                                    f" reference {fro}")
        # negative controls: gradflow runs a copy whose reads take h's history instead of v's (Full AttnRes), or
        # whose [history] keeps every state (Block AttnRes), the reference interpreter reads the right file on
        # gradflow's exported weights; their gradients must differ.
        for name, wrong_from, wrong_to in ((FULL, "attend(v, o, query)", "attend(h, o, query)"),
                                           (BLOCK, "\n[history]\np = ", "\n# [history]\n# p = "),
                                           (FIXED, "0.3*history_sum(a)", "0.3*history_mean(a)")):
            wrong = wrong_copy(tmp, name, wrong_from, wrong_to)
            right = file_of(name)
            export, out = os.path.join(tmp, "wrong.safetensors"), os.path.join(tmp, "wrong.json")
            subprocess.run([BINARY, "analyze", "--arch", wrong, "--depth", "3", "--width", "16", "--heads", "2",
                            "--seq", "5", "--precision", "f64", "--no-timing", "-q", "--export-weights", export,
                            "-o", out, *(options(name, 0.3) if name != FIXED else [])], check=True)
            reference = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "reference", "placement_file.py"),
                                        right, export], capture_output=True, text=True, check=True)
            with open(out) as f:
                ours = json.load(f)["runs"][0]["seeds"][0]["states"]["log10_grad"]
            theirs = json.loads(reference.stdout)["states"]["log10_grad"]
            gap = max(abs(a - b) for a, b in zip(ours, theirs))
            told_apart = gap > 1e-6
            print(f"{'ok  ' if told_apart else 'FAIL'} negative control ({os.path.basename(name)}): the wrong history is told apart "
                  f"(largest log10_grad gap {gap:.2e})")
            if not told_apart:
                failures.append(f"the negative control of {name} agreed with the reference")
    if failures:
        print("\n".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
