"""Fault table: malformed documents for every reader of files (issue 21): check's result and
baseline, --tolerances, merge's sweep.json and cells, sweep's resume of an existing sweep.json.
Each mutation of a valid document must end in exit 2 and one line naming the file."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402
import fixtures  # noqa: E402

F = fixtures.make()
CELL = sorted(F["cells"])[0]  # keel_B2_d16_s0.json
SWEEP = ["sweep", "--arch", "keel", "--depth", "2,3", "--width", "16", "--heads", "2", "--seq", "4", "-o", "sw", "-q"]


def text_mutations(text):
    """Breakages of the JSON text itself, whatever the document."""
    return {
        "empty file": "",
        "only a brace": "{",
        "truncated at half": text[: len(text) // 2],
        "truncated at 90%": text[: len(text) * 9 // 10],
        "last byte cut": text.rstrip()[:-1],
        "null": "null",
        "an array": "[]",
        "a number": "5",
        "a string": '"gradflow"',
        "NaN literal": text.replace("{", '{"x":NaN,', 1),
        "Infinity literal": text.replace("{", '{"x":Infinity,', 1),
        "1e400": text.replace("{", '{"x":1e400,', 1),
        "-1e400": text.replace("{", '{"x":-1e400,', 1),
        "nested 100000 deep": "[" * 100000 + "]" * 100000,
        "binary garbage": "\x00\x01\xfe garbage",
        "trailing garbage": text.rstrip() + " trailing",
        "two documents": text.rstrip() + text,
    }


def analyze_mutations(text):
    """Documents that parse but are not gradflow analyze documents of schema_version 1."""
    def at(change):
        return fixtures.edit(text, change)
    def set_path(path, value):
        def change(document):
            node = document
            for key in path[:-1]:
                node = node[key]
            if value is DELETE:
                del node[path[-1]]
            else:
                node[path[-1]] = value
        return at(change)
    run, seed = ["runs", 0], ["runs", 0, "seeds", 0]
    cases = {}
    for version in [2, 0, -1, "1", None, 1.5, DELETE]:
        cases[f"schema_version {version!r}"] = set_path(["schema_version"], version)
    cases.update({
        "command 5": set_path(["command"], 5),
        "command 5 and empty cells": json.dumps({"schema_version": 1, "command": 5, "cells": []}),
        "sweep without cells or summary": json.dumps({"schema_version": 1, "command": "sweep", "cells": [{}]}),
        "runs an object": set_path(["runs"], {}),
        "runs a number": set_path(["runs"], 5),
        "runs missing": set_path(["runs"], DELETE),
        "a run is a number": set_path(["runs"], [5]),
        "arch 7": set_path(run + ["arch"], 7),
        "arch null": set_path(run + ["arch"], None),
        "arch missing": set_path(run + ["arch"], DELETE),
        "config a number": set_path(run + ["config"], 5),
        "config missing": set_path(run + ["config"], DELETE),
        "seeds empty": set_path(run + ["seeds"], []),
        "seeds a number": set_path(run + ["seeds"], 5),
        "a seed is a string": set_path(run + ["seeds"], ["x"]),
        "seed number a string": set_path(seed + ["seed"], "0"),
        "states an array": set_path(seed + ["states"], []),
        "states missing": set_path(seed + ["states"], DELETE),
        "rms holds booleans": set_path(seed + ["states", "rms"], [True, False]),
        "sublayers missing": set_path(seed + ["sublayers"], DELETE),
        "sublayer kinds missing": set_path(seed + ["sublayers", "kind"], DELETE),
        "sublayer blocks shorter": set_path(seed + ["sublayers", "block"], [0]),
        "summary missing": set_path(seed + ["summary"], DELETE),
        "gain_min a number": set_path(seed + ["summary", "gain_min"], 5),
    })
    return cases


DELETE = object()
ANALYZE = F["analyze"]
CASES = []

# check: the result broken, then the baseline broken (the other one valid).
RESULT_NAMED = r"r\.json(: | vs b\.json: the result)"
BASELINE_NAMED = r"error: b\.json: |b\.json: the baseline"
for name, bad in {**text_mutations(ANALYZE), **analyze_mutations(ANALYZE)}.items():
    CASES.append(Case(f"check result: {name}", ["check", "r.json", "--baseline", "b.json"], message=RESULT_NAMED,
                      files={"r.json": bad, "b.json": ANALYZE}))
    CASES.append(Case(f"check baseline: {name}", ["check", "r.json", "--baseline", "b.json"],
                      message=BASELINE_NAMED, files={"r.json": ANALYZE, "b.json": bad}))

# check --tolerances
TOLERANCES = {
    **{f"text: {k}": v for k, v in text_mutations('{"log_space": 0.05}').items()},
    "negative": '{"log_space": -1}',
    "a string value": '{"linear": "x"}',
    "null value": '{"exponent": null}',
    "1e400 value": '{"log_space": 1e400}',
    "unknown key": '{"bogus": 1}',
    "figures negative": '{"figures": {"gain": -1}}',
    "figures a string": '{"figures": {"gain": "x"}}',
    "figures a list": '{"figures": [1]}',
}
for name, bad in TOLERANCES.items():
    CASES.append(Case(f"tolerances: {name}", ["check", "a.json", "--baseline", "a.json", "--tolerances", "t.json"],
                      message=r"t\.json", files={"a.json": ANALYZE, "t.json": bad}))

# merge and sweep resume: a broken sweep.json
MANIFEST = F["manifest"]


def manifest_edit(change):
    return fixtures.edit(MANIFEST, change)


def grid(key, value):
    return manifest_edit(lambda d: d["grid"].__setitem__(key, value))


MANIFESTS = {
    **{f"text: {k}": v for k, v in text_mutations(MANIFEST).items()},
    **{f"schema_version {v!r}": manifest_edit(lambda d, v=v: d.__setitem__("schema_version", v))
       for v in [2, 99, 0, "1", None, 1.5]},
    "command analyze": manifest_edit(lambda d: d.__setitem__("command", "analyze")),
    "command 5": manifest_edit(lambda d: d.__setitem__("command", 5)),
    "grid missing": manifest_edit(lambda d: d.pop("grid")),
    "model missing": manifest_edit(lambda d: d.pop("model")),
    "model a number": manifest_edit(lambda d: d.__setitem__("model", 5)),
    "model lacks seq": manifest_edit(lambda d: d["model"].pop("seq")),
    "seeds -5": grid("seeds", -5),
    "seeds 0": grid("seeds", 0),
    "seeds a string": grid("seeds", "2"),
    "seeds 2147483647": grid("seeds", 2147483647),
    "seeds 1e400": MANIFEST.replace('"seeds": 1', '"seeds": 1e400'),
    "depths empty": grid("depths", []),
    "depth 0": grid("depths", [0, 2]),
    "depth negative": grid("depths", [-2]),
    "depth a string": grid("depths", ["2"]),
    "depth 2147483647": grid("depths", [2147483647]),
    "width 0": grid("widths", [0]),
    "archs empty": grid("archs", []),
    "arch unknown": grid("archs", ["nope"]),
    "archs a number": grid("archs", 7),
}
assert '"seeds": 1' in MANIFEST, "the manifest fixture changed its layout"
for name, bad in MANIFESTS.items():
    CASES.append(Case(f"merge sweep.json: {name}", ["merge", "sw"], message=r"sw/sweep\.json",
                      files=fixtures.sweep_files(F, manifest=bad)))
for name in ["text: truncated at half", "text: 1e400", "schema_version 99", "model lacks seq", "grid missing",
             "text: an array", "seeds -5"]:
    # The resumed sweep meets a damaged manifest: named, not replaced (its cells stay as they were).
    CASES.append(Case(f"sweep resume sweep.json: {name}", SWEEP, message=r"sw/sweep\.json",
                      files=fixtures.sweep_files(F, manifest=MANIFESTS[name])))

# merge: a broken cell
CELL_TEXT = F["cells"][CELL]


def cell_edit(change):
    return fixtures.edit(CELL_TEXT, change)


def cell_config(key, value):
    return cell_edit(lambda d: d["runs"][0]["config"].__setitem__(key, value))


CELLS = {
    **{f"text: {k}": v for k, v in text_mutations(CELL_TEXT).items()},
    "an empty object": "{}",
    "schema_version 2": cell_edit(lambda d: d.__setitem__("schema_version", 2)),
    "no runs": json.dumps({"schema_version": 1, "runs": []}),
    "runs missing": cell_edit(lambda d: d.pop("runs")),
    "config lacks probes": cell_edit(lambda d: d["runs"][0]["config"].pop("probes")),
    "another arch inside": cell_config("arch", "pre-ln"),
    "another depth inside": cell_config("blocks", 3),
    "another seed inside": cell_edit(lambda d: d["runs"][0]["seeds"][0].__setitem__("seed", 1)),
    "another seq (other sweep)": cell_config("seq", 8),
    "blocks a string": cell_config("blocks", "2"),
    "rms cut short": cell_edit(lambda d: d["runs"][0]["seeds"][0]["states"].__setitem__("rms", [1.0])),
    "summary missing": cell_edit(lambda d: d["runs"][0]["seeds"][0].pop("summary")),
    "gain_min a number": cell_edit(lambda d: d["runs"][0]["seeds"][0]["summary"].__setitem__("gain_min", 5)),
}
for name, bad in CELLS.items():
    CASES.append(Case(f"merge cell: {name}", ["merge", "sw"], message=CELL.replace(".", r"\."),
                      files=fixtures.sweep_files(F, cells={CELL: bad})))

if __name__ == "__main__":
    print(f"{len(CASES)} malformed-document cases")
    run_table(CASES)
