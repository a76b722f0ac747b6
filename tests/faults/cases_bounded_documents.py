"""Fault table (issue 34): the documents gradflow reads back are bounded and checked. Nesting far
deeper than gradflow writes (the campaign's 200,000 arrays inside `tool`, and 10x that), documents
over the size limit, inputs that are not regular files (FIFOs, devices, directories), check's
documents with short columns, misplaced types and repeated runs, seeds or cells, merge's repeated
grid entries, cells of two runs and -o onto its own inputs, a sweep into a directory of another
grid, and a sweep directory locked by another sweep. Each ends in exit 2 and one line naming the
file (a few boundary cases pass, exit 0), within 5 s under a 400 MB address-space limit for the
large inputs.

Usage: cases_bounded_documents.py BUILD/gradflow"""
import fcntl
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402
import fixtures  # noqa: E402

F = fixtures.make()
ANALYZE, MANIFEST, SUMMARY = F["analyze"], F["manifest"], F["summary"]
CELL = sorted(F["cells"])[0]  # keel_B2_d16_s0.json
CELL_TEXT = F["cells"][CELL]
CELL_RE = CELL.replace(".", r"\.")
SWEEP = ["sweep", "--arch", "keel", "--depth", "2,3", "--width", "16", "--heads", "2", "--seq", "4", "-o", "sw", "-q"]
CHECK = ["check", "r.json", "--baseline", "b.json"]
TOLERANCES = '{"log_space": 0.05}'
LIMIT_MB = 400


def bounded_memory():
    """preexec: an address-space limit, so that a reader that slurps or recurses fails here."""
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_MB << 20, LIMIT_MB << 20))


# A large input: answered within 5 s under the memory limit. (OpenBLAS's start-up spins under an
# RLIMIT_AS of 60-175 MB, issue 34; at 400 MB it starts normally, so no OPENBLAS_NUM_THREADS here.)
LARGE = dict(timeout=5, preexec=bounded_memory)


def nested_in_tool(text, depth, opener="[", closer="]"):
    """The document with `depth` nested arrays (or objects) under tool.nested."""
    document = json.loads(text)
    document["tool"]["nested"] = "@NESTED@"
    inner = "[]" if opener == "[" else "{}"
    if opener == "{":
        body = '{"a":' * (depth - 1) + inner + "}" * (depth - 1)
    else:
        body = opener * (depth - 1) + inner + closer * (depth - 1)
    return json.dumps(document).replace('"@NESTED@"', body)


def tolerances_nested(depth):
    return '{"figures": {"gain": 0.1}, "x": ' + "[" * depth + "]" * depth + "}"


CASES = []

# ---- 1. nesting: the campaign's example (200,000 arrays in tool) and 10x, in every reader
for depth, label in ((200_000, "200,000"), (2_000_000, "2,000,000 (10x)")):
    deep_analyze = nested_in_tool(ANALYZE, depth)
    CASES += [
        Case(f"nesting: check result, {label} arrays in tool", CHECK, message=r"r\.json: JSON nested deeper than 64",
             files={"r.json": deep_analyze, "b.json": ANALYZE}, **LARGE),
        Case(f"nesting: check baseline, {label} arrays in tool", CHECK, message=r"b\.json: JSON nested deeper than 64",
             files={"r.json": ANALYZE, "b.json": deep_analyze}, **LARGE),
        Case(f"nesting: --tolerances, {label} arrays", CHECK + ["--tolerances", "t.json"],
             message=r"t\.json: JSON nested",
             files={"r.json": ANALYZE, "b.json": ANALYZE, "t.json": tolerances_nested(depth)}, **LARGE),
        Case(f"nesting: merge sweep.json, {label} arrays in tool", ["merge", "sw"],
             message=r"sw/sweep\.json: JSON nested",
             files=fixtures.sweep_files(F, manifest=nested_in_tool(MANIFEST, depth)),
             **LARGE),
        Case(f"nesting: merge cell, {label} arrays in tool", ["merge", "sw"], message=CELL_RE + r": JSON nested",
             files=fixtures.sweep_files(F, cells={CELL: nested_in_tool(CELL_TEXT, depth)}), **LARGE),
        Case(f"nesting: sweep resume sweep.json, {label} arrays in tool", SWEEP, message=r"sw/sweep\.json: JSON nested",
             files=fixtures.sweep_files(F, manifest=nested_in_tool(MANIFEST, depth)), **LARGE),
        Case(f"nesting: sweep resume cell, {label} arrays in tool", SWEEP, message=CELL_RE + r": JSON nested",
             files=fixtures.sweep_files(F, cells={CELL: nested_in_tool(CELL_TEXT, depth)}), **LARGE),
    ]
CASES += [
    Case("nesting: check result, 200,000 objects in tool", CHECK, message=r"r\.json: JSON nested deeper than 64",
         files={"r.json": nested_in_tool(ANALYZE, 200_000, "{", "}"), "b.json": ANALYZE}, **LARGE),
    Case("nesting: sweep --plan, a cell 200,000 arrays deep", SWEEP + ["--plan"], message=CELL_RE + r": JSON nested",
         files=fixtures.sweep_files(F, cells={CELL: nested_in_tool(CELL_TEXT, 200_000)}), **LARGE),
    Case("nesting: check result, 65 levels (one past the limit)", CHECK, message=r"r\.json: JSON nested deeper than 64",
         files={"r.json": nested_in_tool(ANALYZE, 63), "b.json": ANALYZE}),
    # The boundary: 64 levels in all (document, tool, then 62 arrays) is read and compared.
    Case("nesting: check result, 64 levels in all, accepted", CHECK, exit=0, one_line=False, quiet_stdout=False,
         files={"r.json": nested_in_tool(ANALYZE, 62), "b.json": ANALYZE}),
    # Brackets inside strings are text, not nesting.
    Case("nesting: 200,000 brackets inside a string, accepted", CHECK, exit=0, one_line=False, quiet_stdout=False,
         files={"r.json": ANALYZE.replace("{", '{"text": "' + "[{" * 100_000 + '\\\\\\"",', 1), "b.json": ANALYZE}),
]


# ---- 2. size: a document over the limit (a sparse file: no disk, read by nobody), in every reader
def sparse(name, size=(1 << 30) + 1):
    def setup(directory):
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.truncate(size)
    return setup


CASES += [
    Case("size: check result over 1 GiB", CHECK, message=r"r\.json is 1\.07 GB, more than the 1\.07 GB",
         files={"b.json": ANALYZE}, setup=sparse("r.json"), **LARGE),
    Case("size: check result of 10 GiB", CHECK, message=r"r\.json is 10\.74 GB, more than",
         files={"b.json": ANALYZE}, setup=sparse("r.json", 10 << 30), **LARGE),
    Case("size: check baseline over 1 GiB", CHECK, message=r"b\.json is 1\.07 GB", files={"r.json": ANALYZE},
         setup=sparse("b.json"), **LARGE),
    Case("size: --tolerances over 1 GiB", CHECK + ["--tolerances", "t.json"], message=r"t\.json is 1\.07 GB",
         files={"r.json": ANALYZE, "b.json": ANALYZE}, setup=sparse("t.json"), **LARGE),
    Case("size: merge cell over 1 GiB", ["merge", "sw"], message=CELL_RE + r" is 1\.07 GB",
         files=fixtures.sweep_files(F, cells={CELL: None}), setup=sparse(f"sw/cells/{CELL}"), **LARGE),
    Case("size: sweep resume sweep.json over 1 GiB", SWEEP, message=r"sw/sweep\.json is 1\.07 GB",
         files=fixtures.sweep_files(F, manifest=""), setup=sparse("sw/sweep.json"), **LARGE),
    Case("size: analyze --config over 1 GiB", ["analyze", "--config", "c.json", *fixtures.TINY],
         message=r"c\.json is 1\.07 GB", setup=sparse("c.json"), **LARGE),
]


# ---- 3. not regular files: a FIFO (which would block a plain open forever), devices, directories
def fifo(name, link_to_fifo=False):
    def setup(directory):
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.remove(path)
        if link_to_fifo:
            os.mkfifo(os.path.join(directory, "the-fifo"))
            os.symlink(os.path.join(directory, "the-fifo"), path)
        else:
            os.mkfifo(path)
    return setup


def symlink(name, target):
    def setup(directory):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            os.remove(path)
        os.symlink(target, path)
    return setup


def without(files, name):
    return {key: value for key, value in files.items() if key != name}


FIFO_RE = r" is a FIFO \(named pipe\), not a regular file"
DEVICE_RE = r" is a device, not a regular file"
CASES += [
    Case("special: check result a FIFO", CHECK, message=r"r\.json" + FIFO_RE, files={"b.json": ANALYZE},
         setup=fifo("r.json"), timeout=5),
    Case("special: check result a symlink to a FIFO", CHECK, message=r"r\.json" + FIFO_RE, files={"b.json": ANALYZE},
         setup=fifo("r.json", link_to_fifo=True), timeout=5),
    Case("special: check baseline a FIFO", CHECK, message=r"b\.json" + FIFO_RE, files={"r.json": ANALYZE},
         setup=fifo("b.json"), timeout=5),
    Case("special: --tolerances a FIFO", CHECK + ["--tolerances", "t.json"], message=r"t\.json" + FIFO_RE,
         files={"r.json": ANALYZE, "b.json": ANALYZE}, setup=fifo("t.json"), timeout=5),
    Case("special: merge sweep.json a FIFO", ["merge", "sw"], message=r"sw/sweep\.json" + FIFO_RE,
         files=fixtures.sweep_files(F), setup=fifo("sw/sweep.json"), timeout=5),
    Case("special: merge cell a FIFO", ["merge", "sw"], message=CELL_RE + FIFO_RE,
         files=fixtures.sweep_files(F), setup=fifo(f"sw/cells/{CELL}"), timeout=5),
    Case("special: sweep resume sweep.json a FIFO", SWEEP, message=r"sw/sweep\.json" + FIFO_RE,
         files=fixtures.sweep_files(F), setup=fifo("sw/sweep.json"), timeout=5),
    Case("special: sweep resume cell a FIFO", SWEEP, message=CELL_RE + FIFO_RE,
         files=fixtures.sweep_files(F), setup=fifo(f"sw/cells/{CELL}"), timeout=5),
    Case("special: sweep --plan, a cell a FIFO", SWEEP + ["--plan"], message=CELL_RE + FIFO_RE,
         files=fixtures.sweep_files(F), setup=fifo(f"sw/cells/{CELL}"), timeout=5),
    Case("special: analyze --config a FIFO", ["analyze", "--config", "c.json", *fixtures.TINY],
         message=r"c\.json" + FIFO_RE, setup=fifo("c.json"), timeout=5),
    Case("special: check result /dev/null", ["check", "/dev/null", "--baseline", "b.json"],
         message=r"/dev/null" + DEVICE_RE, files={"b.json": ANALYZE}, timeout=5),
    Case("special: check baseline /dev/null", ["check", "r.json", "--baseline", "/dev/null"],
         message=r"/dev/null" + DEVICE_RE, files={"r.json": ANALYZE}, timeout=5),
    Case("special: --tolerances /dev/zero", CHECK + ["--tolerances", "/dev/zero"], message=r"/dev/zero" + DEVICE_RE,
         files={"r.json": ANALYZE, "b.json": ANALYZE}, timeout=5),
    Case("special: analyze --config /dev/null", ["analyze", "--config", "/dev/null", *fixtures.TINY],
         message=r"/dev/null" + DEVICE_RE, timeout=5),
    Case("special: merge cell a symlink to /dev/zero", ["merge", "sw"], message=CELL_RE + DEVICE_RE,
         files=fixtures.sweep_files(F), setup=symlink(f"sw/cells/{CELL}", "/dev/zero"), timeout=5),
    Case("special: sweep resume cell a symlink to /dev/zero", SWEEP, message=CELL_RE + DEVICE_RE,
         files=fixtures.sweep_files(F), setup=symlink(f"sw/cells/{CELL}", "/dev/zero"), timeout=5),
    Case("special: check result a directory", ["check", "d", "--baseline", "b.json"], message=r"d is a directory",
         files={"b.json": ANALYZE, "d/x": ""}, timeout=5),
    Case("special: merge sweep.json a directory", ["merge", "sw"], message=r"sw/sweep\.json is a directory",
         files={**without(fixtures.sweep_files(F), "sw/sweep.json"), "sw/sweep.json/x": ""}, timeout=5),
]


# ---- 4. check: the shape of a valid document, every field the comparison reads
def edit(text, change):
    return fixtures.edit(text, change)


def seed0(document):
    return document["runs"][0]["seeds"][0]


def append_copy(listing, index=0, change=None):
    copy = json.loads(json.dumps(listing[index]))
    if change:
        change(copy)
    listing.append(copy)


def put(path, value):
    """A change that sets the field at `path` (keys and indices from the first seed, "config"
    from the first run) to `value`."""
    def change(document):
        node = document["runs"][0] if path[0] == "config" else seed0(document)
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def pop(*path):
    def change(document):
        node = seed0(document)
        for key in path:
            node = node[key]
        node.pop()
    return change


ANALYZE_SHAPES = {  # name: (change, what the message says)
    "states.rms shorter than the depth":
        (pop("states", "rms"), r"states\.rms has 4 entries, but config\.sublayers is 4 \(5 states\)"),
    "states.rms longer than the depth":
        (lambda d: seed0(d)["states"]["rms"].append(1.0), r"states\.rms has 6 entries"),
    "sublayers.gain shorter": (pop("sublayers", "gain"), r"sublayers\.gain has 3 entries"),
    "a stream's rms shorter": (pop("states", "streams", "x", "rms"), r"states\.streams\.x\.rms has 4"),
    "sublayer kinds and blocks both shorter":
        (lambda d: (pop("sublayers", "kind")(d), pop("sublayers", "block")(d)), r"sublayers\.kind has 3"),
    "a string in states.rms":
        (put(["states", "rms", 1], "1.0"), r"states\.rms holds string \(\"1\.0\"\), not numbers"),
    "a string in sublayers.gain": (put(["sublayers", "gain", 0], "x"), r"sublayers\.gain holds string"),
    "an object in states.log10_grad": (put(["states", "log10_grad", 0], {}), r"states\.log10_grad holds object"),
    "a number in sublayers.kind": (put(["sublayers", "kind", 0], 1), r"sublayers\.kind holds number"),
    "a string in sublayers.block": (put(["sublayers", "block", 0], "0"), r"sublayers\.block holds string"),
    "states.rms a number": (put(["states", "rms"], 5), r"states\.rms is number, not an array"),
    "summary.log10_grad_ratio a string":
        (put(["summary", "log10_grad_ratio"], "0.1"), r"summary\.log10_grad_ratio is string"),
    "summary.growth_class a number": (put(["summary", "growth_class"], 3), r"summary\.growth_class is number"),
    "summary.gain_min.value a string":
        (put(["summary", "gain_min", "value"], "1"), r"summary\.gain_min\.value is string"),
    "config.sublayers a string": (put(["config", "sublayers"], "4"), r"config\.sublayers is string"),
    "config.sublayers 0": (put(["config", "sublayers"], 0), r"config\.sublayers is 0"),
    "two runs of one arch": (lambda d: append_copy(d["runs"]), r"run keel appears twice"),
    "two seeds of one number": (lambda d: append_copy(d["runs"][0]["seeds"]), r"run keel seed 0 appears twice"),
    "two runs of one arch, the second edited":
        (lambda d: append_copy(d["runs"], change=lambda r: r["seeds"][0]["states"]["rms"].__setitem__(0, 9.0)),
         r"run keel appears twice"),
}
for name, (change, message) in ANALYZE_SHAPES.items():
    bad = edit(ANALYZE, change)
    CASES.append(Case(f"check result: {name}", CHECK, message=r"r\.json vs b\.json: the result .*" + message,
                      files={"r.json": bad, "b.json": ANALYZE}))
for name in ("states.rms shorter than the depth", "a string in states.rms", "two seeds of one number"):
    change, message = ANALYZE_SHAPES[name]
    CASES.append(Case(f"check baseline: {name}", CHECK, message=r"r\.json vs b\.json: the baseline .*" + message,
                      files={"r.json": ANALYZE, "b.json": edit(ANALYZE, change)}))

SWEEP_SHAPES = {
    "two identical cells": (lambda d: append_copy(d["cells"]), r"cell keel B2 d16 seed 0 appears twice"),
    "a cell's rms_final a string":
        (lambda d: d["cells"][0].__setitem__("rms_final", "1"), r"cell keel B2 d16 seed 0\.rms_final is string"),
    "a cell's gain_max.value a list":
        (lambda d: d["cells"][1]["gain_max"].__setitem__("value", [1]), r"gain_max\.value is array"),
    "two fits of one arch and width": (lambda d: append_copy(d["summary"]["fits"]), r"fit keel d16 appears twice"),
    "a fit's growth_exponent.value a string":
        (lambda d: d["summary"]["fits"][0]["growth_exponent"].__setitem__("value", "0"),
         r"fit keel d16\.growth_exponent\.value is string"),
}
for name, (change, message) in SWEEP_SHAPES.items():
    CASES.append(Case(f"check sweep result: {name}", CHECK, message=r"r\.json vs b\.json: the result .*" + message,
                      files={"r.json": edit(SUMMARY, change), "b.json": SUMMARY}))

# ---- 5. merge: repeated grid entries, cells of two runs, -o onto its own inputs
for key, value in (("widths", [16, 16]), ("depths", [2, 3, 2]), ("archs", ["keel", "keel"])):
    repeated = edit(MANIFEST, lambda d, key=key, value=value: d["grid"].__setitem__(key, value))
    CASES.append(Case(f"merge: sweep.json lists {key} {value}", ["merge", "sw"],
                      message=rf"sw/sweep\.json: {key} lists \S+ twice",
                      files=fixtures.sweep_files(F, manifest=repeated)))
TWO_WIDTHS = edit(MANIFEST, lambda d: d["grid"].__setitem__("widths", [16, 16]))
CASES.append(Case("sweep resume: sweep.json lists a width twice", SWEEP,
                  message=r"sw/sweep\.json: widths lists 16 twice", files=fixtures.sweep_files(F, manifest=TWO_WIDTHS)))
CASES += [
    Case("merge: a cell holding two runs", ["merge", "sw"], message=CELL_RE + r" holds 2 run\(s\) with 1 seed\(s\)",
         files=fixtures.sweep_files(F, cells={CELL: edit(CELL_TEXT, lambda d: append_copy(d["runs"]))})),
    Case("merge: a cell holding two seeds", ["merge", "sw"], message=CELL_RE + r" holds 1 run\(s\) with 2 seed\(s\)",
         files=fixtures.sweep_files(F, cells={CELL: edit(CELL_TEXT, lambda d: append_copy(d["runs"][0]["seeds"]))})),
]
SELF = r"is .*{}, one of the files merge reads"
CASES += [
    Case("merge: -o onto one of its cells", ["merge", "sw", "-o", f"sw/cells/{CELL}"], message=SELF.format(CELL_RE),
         files=fixtures.sweep_files(F)),
    Case("merge: -o onto its sweep.json", ["merge", "sw", "-o", "sw/sweep.json"], message=SELF.format(r"sweep\.json"),
         files=fixtures.sweep_files(F)),
    Case("merge: -o onto its sweep.json spelled another way", ["merge", "sw", "-o", "./sw/cells/../sweep.json"],
         message=SELF.format(r"sweep\.json"), files=fixtures.sweep_files(F)),
    Case("merge: -o onto a symlink to one of its cells", ["merge", "sw", "-o", "link.json"],
         message=SELF.format(CELL_RE), files=fixtures.sweep_files(F), setup=symlink("link.json", f"sw/cells/{CELL}")),
    Case("merge: -o onto a hard link of one of its cells", ["merge", "sw", "-o", "hard.json"],
         message=SELF.format(CELL_RE), files=fixtures.sweep_files(F),
         setup=lambda d: os.link(os.path.join(d, "sw", "cells", CELL), os.path.join(d, "hard.json"))),
    Case("merge: -o onto the second shard's cell", ["merge", "sw", "sw2", "-o", f"sw2/cells/{CELL}"],
         message=SELF.format("sw2/cells/" + CELL_RE),
         files={**fixtures.sweep_files(F), **fixtures.sweep_files(F, prefix="sw2")}),
]

# ---- 6. sweep: another grid into an existing directory, and a directory another sweep holds
OTHER_GRIDS = {
    "another depth list": (["--depth", "2,4"], r"grid \(depths \[2,3\] there, \[2,4\] in this run\)"),
    "another seed count": (["--depth", "2,3", "--seeds", "2"], r"grid \(seeds 1 there, 2 in this run\)"),
    "another width list":
        (["--depth", "2,3", "--width", "16,8"], r"grid \(widths \[16\] there, \[16,8\] in this run\)"),
    "another placement list": (["--depth", "2,3", "--arch", "keel,pre-ln"], r"grid \(archs"),
}
for name, (changes, message) in OTHER_GRIDS.items():
    args = list(SWEEP)
    for flag, value in zip(changes[::2], changes[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    CASES.append(Case(f"sweep: existing directory of {name}", args,
                      message=r"sw/sweep\.json holds a sweep over another " + message + r".*use a new -o DIR",
                      files=fixtures.sweep_files(F)))
    if name == "another depth list":
        CASES.append(Case("sweep --plan: existing directory of another depth list", args + ["--plan"],
                          message=r"sw/sweep\.json holds a sweep over another grid", files=fixtures.sweep_files(F)))
        CASES.append(Case("sweep --shard 0/2: existing directory of another depth list", args + ["--shard", "0/2"],
                          message=r"sw/sweep\.json holds a sweep over another grid", files=fixtures.sweep_files(F)))

HELD = []  # lock files held by this process for the length of the run (POSIX locks: per process)


def held_lock(kind):
    """setup: sw/sweep.lock held by this (the harness's) process, as a running sweep would."""
    def setup(directory):
        handle = open(os.path.join(directory, "sw", "sweep.lock"), "a+")
        fcntl.lockf(handle, kind, 1, 0)
        HELD.append(handle)
    return setup


LOCKED = r"another sweep is writing sw \(it holds sw/sweep\.lock\)"
CASES += [
    Case("lock: a sweep into a directory another sweep holds", SWEEP, message=LOCKED,
         files=fixtures.sweep_files(F), setup=held_lock(fcntl.LOCK_EX), timeout=5),
    Case("lock: a shard into a directory an unsharded sweep holds", SWEEP + ["--shard", "1/2"], message=LOCKED,
         files=fixtures.sweep_files(F), setup=held_lock(fcntl.LOCK_EX), timeout=5),
    Case("lock: a sweep into a directory shards hold", SWEEP, message=LOCKED,
         files=fixtures.sweep_files(F), setup=held_lock(fcntl.LOCK_SH), timeout=5),
    # Shards of one grid share DIR side by side: a shard beside a running shard goes ahead (its
    # cells are complete already, so it writes nothing new).
    Case("lock: a shard beside a running shard goes ahead", SWEEP + ["--shard", "1/2"], exit=0, one_line=False,
         files=fixtures.sweep_files(F), setup=held_lock(fcntl.LOCK_SH), timeout=10),
]

if __name__ == "__main__":
    print(f"{len(CASES)} bounded-document cases")
    run_table(CASES)
