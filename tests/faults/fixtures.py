"""Valid gradflow documents for the fault tables to break: a tiny analyze result, a sweep manifest and
its cells, made once per table run by the binary under test (so they always match its schema)."""
import json
import os
import subprocess
import sys
import tempfile

TINY = ["--depth", "2", "--width", "16", "--heads", "2", "--seq", "4"]


def binary():
    return os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/gradflow")


def _run(args, cwd):
    subprocess.run([binary(), *args], cwd=cwd, check=True, capture_output=True)


def make():
    """{'analyze': text, 'manifest': text, 'cells': {name: text}, 'summary': text}"""
    with tempfile.TemporaryDirectory(prefix="gradflow-fixture-") as directory:
        _run(["analyze", "--arch", "keel", *TINY, "-o", "a.json", "--format", "json"], directory)
        _run(["sweep", "--arch", "keel", "--depth", "2,3", "--width", "16", "--heads", "2", "--seq", "4",
              "-o", "sw", "-q"], directory)
        read = lambda *p: open(os.path.join(directory, *p)).read()
        cells = {name: read("sw", "cells", name) for name in sorted(os.listdir(os.path.join(directory, "sw", "cells")))}
        return {"analyze": read("a.json"), "manifest": read("sw", "sweep.json"), "cells": cells,
                "summary": read("sw", "summary.json")}


def sweep_files(fixture, manifest=None, cells=None, prefix="sw"):
    """A sweep directory as a Case's files: sweep.json and cells/, with replacements."""
    files = {f"{prefix}/sweep.json": fixture["manifest"] if manifest is None else manifest}
    for name, text in fixture["cells"].items():
        files[f"{prefix}/cells/{name}"] = text
    for name, text in (cells or {}).items():
        if text is None:
            files.pop(f"{prefix}/cells/{name}", None)
        else:
            files[f"{prefix}/cells/{name}"] = text
    return files


def edit(text, change):
    """The JSON text with change(document) applied (change mutates the parsed document)."""
    document = json.loads(text)
    change(document)
    return json.dumps(document)
