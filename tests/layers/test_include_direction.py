#!/usr/bin/env python3
"""The layers' include direction (issue 33): a core-layer source that includes an app header does
not compile, and the same source without that include does (so the failure is the include's).

    test_include_direction.py CMAKE BUILD_DIR
builds the two targets tests/CMakeLists.txt defines outside ALL from tests/layers/core_source.cpp."""
import subprocess
import sys

APP_HEADER = "gradflow/app/report.hpp"


def build(cmake, build_dir, target):
    run = subprocess.run([cmake, "--build", build_dir, "--target", target], capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def main():
    cmake, build_dir = sys.argv[1:3]
    code, output = build(cmake, build_dir, "layers_core_source")
    if code != 0:
        sys.exit(f"FAIL: the core-layer source without the app header does not compile:\n{output}")
    code, output = build(cmake, build_dir, "layers_core_source_including_app")
    if code == 0:
        sys.exit(f"FAIL: a core-layer source including {APP_HEADER} compiled; the core's include "
                 "path must not hold the app headers (src/app/include)")
    if APP_HEADER not in output or "No such file or directory" not in output:
        sys.exit(f"FAIL: the core-layer source failed, but not for want of {APP_HEADER}:\n{output}")
    print(f"ok: a core-layer source cannot include {APP_HEADER}; without it, it compiles")


if __name__ == "__main__":
    main()
