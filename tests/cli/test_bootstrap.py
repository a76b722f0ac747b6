#!/usr/bin/python3
"""scripts/bootstrap on a machine where nothing is installed, with apt-get, dpkg-query and cmake
replaced by stubs that record their arguments: the main job installs the build set only (no
python3-torch), --tests adds the test stack, apt waits for the dpkg lock, nothing goes to stdout.

Usage: test_bootstrap.py REPO_DIR
"""
import os
import stat
import subprocess
import sys
import tempfile

from cli_testing import finish, test

REPO = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
STUBS = {
    "dpkg-query": "exit 1\n",  # nothing is installed
    "apt-get": 'echo "apt-get $*" >> "$STUB_LOG"\n',
    "sudo": '"$@"\n',
    "cmake": 'echo "cmake $*" >> "$STUB_LOG"\n',
}


def bootstrap(*args):
    with tempfile.TemporaryDirectory() as stubs:
        for name, body in STUBS.items():
            path = os.path.join(stubs, name)
            with open(path, "w") as f:
                f.write("#!/bin/sh\n" + body)
            os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        log = os.path.join(stubs, "calls.log")
        env = dict(os.environ, PATH=stubs + ":" + os.environ["PATH"], STUB_LOG=log)
        env.pop("CI", None)
        proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "bootstrap"), *args], env=env,
                              capture_output=True, text=True)
        calls = open(log).read().splitlines() if os.path.exists(log) else []
    return proc, calls


def install_line(calls):
    lines = [c for c in calls if c.startswith("apt-get") and " install " in c]
    assert len(lines) == 1, calls
    return lines[0].split()


@test
def the_main_job_installs_the_build_set_only():
    proc, calls = bootstrap()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "", f"bootstrap wrote to stdout: {proc.stdout[:200]!r}"
    packages = install_line(calls)
    for needed in ["cmake", "g++", "libcli11-dev", "libeigen3-dev", "libopenblas-dev", "libfmt-dev",
                   "nlohmann-json3-dev"]:
        assert needed in packages, (needed, packages)
    for test_only in ["python3-torch", "python3-matplotlib", "python3-numpy", "doctest-dev"]:
        assert test_only not in packages, (test_only, packages)
    assert any(c.startswith("cmake --build") and "--target gradflow" in c for c in calls), calls


@test
def tests_adds_the_test_stack_and_builds_everything():
    proc, calls = bootstrap("--tests")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    packages = install_line(calls)
    for needed in ["python3-torch", "python3-matplotlib", "python3-numpy", "doctest-dev", "cmake"]:
        assert needed in packages, (needed, packages)
    assert any(c.startswith("cmake --preset") and "-DGRADFLOW_TESTS=ON" in c for c in calls), calls
    assert any(c.startswith("cmake --build") and "--target" not in c for c in calls), calls


@test
def apt_waits_for_the_dpkg_lock():
    _, calls = bootstrap()
    apt = [c for c in calls if c.startswith("apt-get")]
    assert apt and all("DPkg::Lock::Timeout=600" in c for c in apt), apt


@test
def a_bad_argument_is_refused():
    proc, calls = bootstrap("--test")
    assert proc.returncode == 2 and "unknown argument '--test'" in proc.stderr and not calls, proc.stderr


finish()
