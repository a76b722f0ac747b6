"""Built-ins as placement files: each data/placements/builtins/ID.toml (id "ID-file") must give the
built-in ID's figures bit for bit (timing aside), for every block kind, RMS and LayerNorm, float32
and float64 (docs/placement-files.md). Also: a file outside the repository, and one given by path
and by id, run and agree.

Usage: test_bit_identity.py GRADFLOW_BINARY REPOSITORY_ROOT
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

BINARY, ROOT = sys.argv[1], sys.argv[2]
SMALL = ["--depth", "3", "--width", "16", "--heads", "2", "--seq", "8", "--seeds", "2"]


def without_timing(value):
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if "second" not in k and "timing" not in k}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def analyze(archs, extra, env=None):
    proc = subprocess.run([BINARY, "analyze", "--arch", ",".join(archs), "--format", "json", *SMALL, *extra],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"gradflow analyze --arch {','.join(archs)} {' '.join(extra)} failed: {proc.stderr}")
    return json.loads(proc.stdout)["runs"]


def main():
    files = sorted(glob.glob(os.path.join(ROOT, "data", "placements", "builtins", "*.toml")))
    failures, compared = [], 0
    for path in files:
        built_in = os.path.basename(path)[:-len(".toml")]
        for block in ["attn-ffn", "ffn", "attn"]:
            for norm in ["rms", "layer"]:
                for precision in ["f32", "f64"]:
                    extra = ["--block", block, "--norm", norm, "--precision", precision]
                    runs = analyze([built_in, path], extra)
                    a, b = without_timing(runs[0]["seeds"]), without_timing(runs[1]["seeds"])
                    compared += 1
                    if a != b:
                        failures.append(f"{built_in} {' '.join(extra)}: the file's figures differ from the built-in's")
    # A file in a directory outside the repository, by path and through GRADFLOW_PLACEMENTS.
    with tempfile.TemporaryDirectory() as directory:
        text = open(os.path.join(ROOT, "data", "placements", "builtins", "pre-ln.toml")).read()
        with open(os.path.join(directory, "mine.toml"), "w") as handle:
            handle.write(text.replace('id = "pre-ln-file"', 'id = "my-pre-ln"'))
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
