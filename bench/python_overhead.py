#!/usr/bin/python3
"""The Python module's overhead against the CLI, side by side (issue 31, acceptance 2).

    PYTHONPATH=build/python bench/python_overhead.py build/gradflow [--runs 5] [--depth 1024]

Alternates the two, `--runs` times each, on the README's main job (keel, the default config):
the CLI as a process writing its JSON to a file, and gradflow.analyze(...) in this process followed by
to_json() (the same document). Prints each time, the medians and their ratio.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import gradflow


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--depth", type=int, default=1024)
    parser.add_argument("--arch", default="keel")
    options = parser.parse_args()
    cli, python = [], []
    gradflow.analyze(arch=options.arch, depth=8)  # load the module's pages once
    with tempfile.TemporaryDirectory() as directory:
        for run in range(options.runs):
            start = time.perf_counter()
            subprocess.run([options.binary, "analyze", "--arch", options.arch, "--depth", str(options.depth), "-o",
                            os.path.join(directory, "r.json")], check=True)
            cli.append(time.perf_counter() - start)
            start = time.perf_counter()
            gradflow.analyze(arch=options.arch, depth=options.depth).to_json()
            python.append(time.perf_counter() - start)
            print(f"run {run + 1}: CLI {cli[-1]:.3f} s, Python {python[-1]:.3f} s", flush=True)
    ratio = statistics.median(python) / statistics.median(cli)
    print(f"median of {options.runs}: CLI {statistics.median(cli):.3f} s, Python {statistics.median(python):.3f} s, "
          f"Python / CLI = {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
