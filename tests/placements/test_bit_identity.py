"""The built-ins are their files: each data/placements/builtins/ID.toml is compiled into gradflow as
the built-in ID (docs/placement-files.md, "The built-ins as files"). This test runs the file in the
source tree, under another id, beside the built-in, for every block kind, RMS and LayerNorm,
float32 and float64, and requires the same figures bit for bit (timing aside): the binary's
built-ins are the files as they stand, and a file on disk defines exactly what the built-in does.
Also: every built-in file is listed by `gradflow archs` as a built-in, a file outside the
repository runs by path and by id, and Hyper-Connections at init coincide with pre-ln.

Usage: test_bit_identity.py GRADFLOW_BINARY REPOSITORY_ROOT
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from json_compare import without_timing

BINARY, ROOT = sys.argv[1], sys.argv[2]
SMALL = ["--depth", "3", "--width", "16", "--heads", "2", "--seq", "8", "--seeds", "2"]
# A value other than the default for each option the built-in files declare.
OPTION_VALUES = {"alpha": ["--alpha", "1.7"], "keel_variant": ["--keel-variant", "v1"],
                 "mix_ratio": ["--mix-ratio", "0.5"], "rezero_alpha": ["--rezero-alpha", "0.3"]}


def analyze(archs, extra, env=None):
    proc = subprocess.run([BINARY, "analyze", "--arch", ",".join(archs), "--format", "json", *SMALL, *extra],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"gradflow analyze --arch {','.join(archs)} {' '.join(extra)} failed: {proc.stderr}")
    return json.loads(proc.stdout)["runs"]


def as_copy(path, directory):
    """The built-in file under the id ID-copy, without its aliases (two definitions may not share a name)."""
    text = open(path).read()
    built_in = os.path.basename(path)[:-len(".toml")]
    copy, count = re.subn(r'^id = "{}"$'.format(re.escape(built_in)), f'id = "{built_in}-copy"', text, flags=re.M)
    copy = re.sub(r"^aliases = .*$", "", copy, flags=re.M)
    if count != 1:
        raise SystemExit(f"{path}: expected one line id = \"{built_in}\" (a built-in's file carries its id)")
    target = os.path.join(directory, f"{built_in}-copy.toml")
    with open(target, "w") as handle:
        handle.write(copy)
    return target


def main():
    files = sorted(glob.glob(os.path.join(ROOT, "data", "placements", "builtins", "*.toml")))
    failures, compared = [], 0
    listed = subprocess.run([BINARY, "archs", "--format", "json"], capture_output=True, text=True, check=True)
    built_ins = {a["id"] for a in json.loads(listed.stdout)["architectures"] if a["source"] == "built-in"}
    with tempfile.TemporaryDirectory() as copies:
        for path in files:
            built_in = os.path.basename(path)[:-len(".toml")]
            if built_in not in built_ins:
                failures.append(f"{built_in}: data/placements/builtins/{built_in}.toml is not a built-in of `gradflow archs`")
                continue
            detail = subprocess.run([BINARY, "archs", "--arch", built_in], capture_output=True, text=True).stdout
            if f"data/placements/builtins/{built_in}.toml (compiled in)" not in detail:
                failures.append(f"{built_in}: `gradflow archs --arch {built_in}` does not name its file")
            copy = as_copy(path, copies)
            for block in ["attn-ffn", "ffn", "attn"]:
                for norm in ["rms", "layer"]:
                    for precision in ["f32", "f64"]:
                        extra = ["--block", block, "--norm", norm, "--precision", precision]
                        runs = analyze([built_in, copy], extra)
                        a, b = without_timing(runs[0]["seeds"]), without_timing(runs[1]["seeds"])
                        compared += 1
                        if a != b:
                            failures.append(f"{built_in} {' '.join(extra)}: the file's figures differ from the built-in's")
            # Its options given: the flag reaches the file's constants and conditions as the built-in's.
            text = open(path).read()
            given = [flag for key, flag in OPTION_VALUES.items() if f"[options.{key}]" in text]
            for flags in given:
                runs = analyze([built_in, copy], flags + ["--precision", "f64"])
                compared += 1
                if without_timing(runs[0]["seeds"]) != without_timing(runs[1]["seeds"]):
                    failures.append(f"{built_in} {' '.join(flags)}: the file's figures differ from the built-in's")
                if runs[0]["config"]["constants"] != runs[1]["config"]["constants"]:
                    failures.append(f"{built_in} {' '.join(flags)}: the file's constants differ from the built-in's")
    # A file in a directory outside the repository, by path and through GRADFLOW_PLACEMENTS.
    with tempfile.TemporaryDirectory() as directory:
        text = open(os.path.join(ROOT, "data", "placements", "builtins", "pre-ln.toml")).read()
        with open(os.path.join(directory, "mine.toml"), "w") as handle:
            handle.write(text.replace('id = "pre-ln"', 'id = "my-pre-ln"'))
        by_path = analyze(["pre-ln", os.path.join(directory, "mine.toml")], [])
        by_id = analyze(["my-pre-ln"], [], env=dict(os.environ, GRADFLOW_PLACEMENTS=directory))
        if without_timing(by_path[0]["seeds"]) != without_timing(by_path[1]["seeds"]):
            failures.append("a file outside the repository differs from pre-ln")
        if without_timing(by_id[0]["seeds"]) != without_timing(by_path[1]["seeds"]):
            failures.append("GRADFLOW_PLACEMENTS: the file found by id differs from the file given by path")
        if by_path[1]["config"]["placement_file"]["text"] != open(os.path.join(directory, "mine.toml")).read():
            failures.append("config.placement_file.text is not the file's text")
    # Hyper-Connections at init: four copies of pre-ln's stream, so these figures coincide bit for bit
    # (docs/placements.md); the gradient figures do not (each stream's gradient is its own).
    for precision in ["f32", "f64"]:
        hc, pre_ln = (run["seeds"][0] for run in analyze(["hc", "pre-ln"], ["--precision", precision]))
        for section, name in [("states", "rms"), ("sublayers", "branch_rms"), ("sublayers", "stream_share"),
                              ("summary", "growth_exponent"), ("summary", "growth_exponent_se"),
                              ("summary", "growth_class")]:
            compared += 1
            if hc[section][name] != pre_ln[section][name]:
                failures.append(f"hc {precision}: {section}.{name} differs from pre-ln's")
    for failure in failures:
        print("FAIL", failure)
    print(f"{len(files)} placement files, {compared} configurations compared, {len(failures)} failures")
    if len(files) < 16:
        print(f"FAIL only {len(files)} built-ins as files; at least 16 expected")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
