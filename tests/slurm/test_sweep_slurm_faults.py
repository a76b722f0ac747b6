#!/usr/bin/python3
"""scripts/sweep-slurm's refusals and its submission record, without SLURM (issue 51, item 7).

Fake `sbatch`, `squeue`, `scancel` and `scontrol` first on PATH log every call, so this runs in CI
where no SLURM can start, and the failure of a later submission after an earlier one succeeded is
made deterministic (the fake sbatch fails at the Nth call).

  1. a generated table of bad invocations: each exits 2 with exactly one line on stderr (no
     traceback) that names what is wrong, before any sbatch or scancel is called, and leaves the
     directory it was given as it was (unless the case says the directory itself is the problem);
  2. a good invocation through the same fakes is submitted (the table's "nothing submitted" is
     not vacuous);
  3. the merge job's submission failing after the array's succeeded: the array is cancelled
     (scancel), one line says so, exit 3; it was recorded in DIR/slurm/jobs.json before the merge
     job was submitted; the same when a resubmitted array's merge job fails; when scancel fails
     too, the line says the array could not be cancelled and how to cancel it;
  4. sbatch, squeue or scancel missing from PATH: exit 3, one line, no traceback.

Usage: test_sweep_slurm_faults.py GRADFLOW [--submitter PATH]. --submitter runs the table against
another copy of the script (e.g. `git show main:scripts/sweep-slurm`) to see each case fail there.
Exit 0 pass, 1 fail.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = ["--", "--arch", "keel", "--depth", "4,8", "--width", "16", "--heads", "2", "--seq", "4"]
failures = []

# The fakes. Each logs "NAME ARGS" to $FAKE_SLURM/calls.log. sbatch prints job ids 1001, 1002, ...
# and fails at call $FAKE_SBATCH_FAIL_AT; before each call it logs what DIR/slurm/jobs.json holds.
# With $FAKE_SQUEUE_LIVE squeue reports every job running; with $FAKE_SCANCEL_FAIL scancel fails.
FAKES = {
    "sbatch": r"""#!/bin/bash
n=$(( $(cat "$FAKE_SLURM/sbatch.count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$FAKE_SLURM/sbatch.count"
echo "sbatch $*" >> "$FAKE_SLURM/calls.log"
if [ -n "${FAKE_JOBS_JSON:-}" ]; then
  echo "before sbatch $n: $(cat "$FAKE_JOBS_JSON" 2>/dev/null || echo none)" >> "$FAKE_SLURM/records.log"
fi
if [ "${FAKE_SBATCH_FAIL_AT:-0}" = "$n" ]; then
  echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy" >&2
  exit 1
fi
echo "$((1000 + n))"
""",
    "squeue": """#!/bin/bash
echo "squeue $*" >> "$FAKE_SLURM/calls.log"
if [ -n "${FAKE_SQUEUE_LIVE:-}" ]; then
  echo "N/A|RUNNING|None"
fi
""",
    "scancel": """#!/bin/bash
echo "scancel $*" >> "$FAKE_SLURM/calls.log"
if [ -n "${FAKE_SCANCEL_FAIL:-}" ]; then
  echo "scancel: error: Kill job error on job id $1: Access/permission denied" >&2
  exit 1
fi
""",
    "scontrol": """#!/bin/bash
echo "scontrol $*" >> "$FAKE_SLURM/calls.log"
echo "JobId=$4 JobState=${FAKE_JOB_STATE:-CANCELLED} ExitCode=0:15"
""",
}

# Stand-ins for --gradflow that are not gradflow: what each prints for `sweep ... --plan`.
GOOD_CELL = {"position": 0, "file": "cells/x.json", "arch": "keel", "blocks": 4, "width": 16, "seed": 0,
             "estimated_seconds": 1.0, "estimated_memory_bytes": 1e6, "complete": False}
GOOD_PLAN = {"cell_count": 1, "complete_count": 0, "estimated_seconds": 1.0, "largest_memory_bytes": 1e6,
             "estimate_note": "", "cells": [GOOD_CELL]}
NOT_GRADFLOW = {
    "silent": "exit 0",
    "text": "echo 'this is not a plan'",
    "empty-object": "echo '{}'",
    "list": "echo '[1, 2]'",
    "truncated": "echo '{\"cell_count\": 1, \"cells\": ['",
    "no-cells": "echo '" + json.dumps({**GOOD_PLAN, "cell_count": 0, "cells": []}) + "'",
    "nan-seconds": "echo '" + json.dumps({**GOOD_PLAN, "cells": [{**GOOD_CELL, "estimated_seconds": float("nan")}]})
                   + "'",
    "string-memory": "echo '" + json.dumps({**GOOD_PLAN, "largest_memory_bytes": "lots"}) + "'",
    "cell-not-object": "echo '" + json.dumps({**GOOD_PLAN, "cells": [7]}) + "'",
    "negative-position": "echo '" + json.dumps({**GOOD_PLAN, "cells": [{**GOOD_CELL, "position": -1}]}) + "'",
    "not-utf8": r"printf '\xff\xfe{}\n'",
}


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def case(name, args, needle, setup=None, keeps_tree=True, gradflow=None, env=None):
    """args: the submitter's words ({w} is the case's directory); needle: what the line must name;
    setup(w): files the case needs; keeps_tree: the directory must be left as it was; env: for the fakes."""
    return dict(name=name, args=args, needle=needle, setup=setup, keeps_tree=keeps_tree, gradflow=gradflow,
                env=env or {})


def make_file(relative, content="x"):
    def setup(w):
        path = os.path.join(w, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as file:
            file.write(content)
    return setup


def make_dir(relative):
    return lambda w: os.makedirs(os.path.join(w, relative))


def make_result(gradflow, *words, files=()):
    """A document gradflow writes (`gradflow WORDS`, {w} the case's directory), and `files` beside it."""
    def setup(w):
        subprocess.run([gradflow, *[word.replace("{w}", w) for word in words]], check=True, capture_output=True)
        for relative, content in files:
            make_file(relative, content)(w)
    return setup


def cases(gradflow):
    out = ["-o", "{w}/out"]
    table = []
    # Numbers: each numeric option with every kind of value it must refuse.
    for option in ("--tasks", "--cpus-per-task", "--retries"):
        for value in ("x", "1.5", "", "1e3", "nan"):
            table.append(case(f"{option} {value!r}", [*out, option, value, *SWEEP], option))
    for option in ("--task-minutes", "--poll"):
        for value in ("nan", "NaN", "-nan", "inf", "Infinity", "1e999", "x", ""):
            table.append(case(f"{option} {value!r}", [*out, option, value, *SWEEP], option))
    table.append(case("--poll 1e300 (too large to sleep)", [*out, "--poll", "1e300", *SWEEP], "--poll"))
    # Text options given an empty value: refused, never taken as 'not given'.
    for option in ("--time", "--mem", "--partition", "--account", "--qos", "--check", "--tolerances",
                   "--sbatch-arg"):
        table.append(case(f"{option} ''", [*out, option, "", *SWEEP], option))
    table.append(case("--gradflow ''", [*out, "--gradflow", "", *SWEEP], "--gradflow"))
    # SLURM's syntax for time and memory, checked before anything is submitted.
    for value in ("soon", "1:2:3:4", "1-", "-5", "1h"):
        table.append(case(f"--time {value!r}", [*out, f"--time={value}", *SWEEP], "--time"))
    for value in ("4X", "G", "-1G", "4 G", "1.5G"):
        table.append(case(f"--mem {value!r}", [*out, f"--mem={value}", *SWEEP], "--mem"))
    # --sbatch-arg: an option of sbatch, never one the submitter sets itself.
    for value in ("constraint=avx512", "--array=0-3", "-a0-3", "--dependency=afterok:1", "-d", "--parsable",
                  "--output=x.out", "--wrap=true",
                  # sbatch takes a long option's unique prefix for it
                  "--arr=0-3", "--depend=afterok:1", "--out=x.out", "--wr=true", "--pars"):
        table.append(case(f"--sbatch-arg {value!r}", [*out, f"--sbatch-arg={value}", *SWEEP], "--sbatch-arg"))
    # The submitter's own usage errors: one line, not argparse's usage block.
    table.append(case("no -o", SWEEP, "-o"))
    table.append(case("-o without a value", ["-o", *SWEEP], "-o"))
    table.append(case("an unknown option", [*out, "--frobnicate", *SWEEP], "--frobnicate"))
    table.append(case("--help among the sweep options", [*out, *SWEEP, "--help"], "--help"))
    # -o: the sweep's directory.
    table.append(case("-o ''", ["-o", "", *SWEEP], "-o"))
    table.append(case("-o naming a file", ["-o", "{w}/file", *SWEEP], "{w}/file", setup=make_file("file")))
    table.append(case("-o under a file", ["-o", "{w}/file/sub", *SWEEP], "{w}/file", setup=make_file("file")))
    table.append(case("-o /dev/null", ["-o", "/dev/null", *SWEEP], "/dev/null"))
    table.append(case("-o under /proc", ["-o", "/proc/gradflow-sweep-slurm-test", *SWEEP], "/proc/"))
    table.append(case("-o an existing directory in /proc", ["-o", "/proc/self", *SWEEP], "/proc/self"))
    table.append(case("-o whose slurm/ is a file", ["-o", "{w}/d", *SWEEP], "{w}/d/slurm",
                      setup=make_file("d/slurm")))
    table.append(case("-o whose slurm/jobs.json is a directory", ["-o", "{w}/d", *SWEEP], "jobs.json",
                      setup=make_dir("d/slurm/jobs.json"), keeps_tree=False))
    table.append(case("-o whose slurm/task.sh is a directory", ["-o", "{w}/d", *SWEEP], "task.sh",
                      setup=make_dir("d/slurm/task.sh"), keeps_tree=False))
    table.append(case("-o whose slurm/status/task-0.exit is a directory", ["-o", "{w}/d", "--tasks", "1", *SWEEP],
                      "task-0.exit", setup=make_dir("d/slurm/status/task-0.exit"), keeps_tree=False))
    # --check and --tolerances: read as the merge job's gradflow check will read them.
    sweep_baseline = ["sweep", "--arch", "keel", "--depth", "2", "--width", "16", "--heads", "2", "--seq", "4",
                      "-o", "{w}/base", "-q"]
    check = [*out, "--check", "{w}/base.json", *SWEEP]
    table.append(case("--check a truncated baseline", check, "{w}/base.json",
                      setup=make_file("base.json", '{"command": "sweep", "cells": [')))
    table.append(case("--check a baseline that is not JSON", check, "{w}/base.json", setup=make_file("base.json", "x")))
    table.append(case("--check a baseline gradflow did not write", check, "{w}/base.json",
                      setup=make_file("base.json", '{"command": "sweep", "cells": []}')))
    table.append(case("--check an analyze document", [*out, "--check", "{w}/a.json", *SWEEP], "{w}/a.json",
                      setup=make_result(gradflow, "analyze", "--arch", "keel", "--depth", "2", "--width", "16",
                                        "--heads", "2", "--seq", "4", "-o", "{w}/a.json", "-q")))
    for content in ('{"log_space": "x"}', "[", '{"figures": {"gain": -1}}', '{"nonsense": 1}'):
        table.append(case(f"--tolerances {content!r}",
                          [*out, "--check", "{w}/base/summary.json", "--tolerances", "{w}/t.json", *SWEEP],
                          "{w}/t.json", setup=make_result(gradflow, *sweep_baseline, files=[("t.json", content)])))
    # A rerun while the earlier submission into DIR is still queued: refused, DIR left as it was.
    table.append(case("a rerun while the earlier jobs are queued", ["-o", "{w}/d", *SWEEP], "still queued",
                      setup=make_file("d/slurm/jobs.json", '{"array": "77", "merge": "78"}'),
                      env={"FAKE_SQUEUE_LIVE": "1"}))
    # --gradflow: a directory, or something that does not print a plan.
    table.append(case("--gradflow a directory", [*out, "--gradflow", "{w}", *SWEEP], "--gradflow"))
    for name in NOT_GRADFLOW:
        table.append(case(f"--gradflow that prints {name}", [*out, *SWEEP], "--gradflow", gradflow=name))
    return table


def tree(directory):
    """Every path under `directory` but the fakes' own (their log of calls)."""
    return sorted(path for path in (os.path.relpath(os.path.join(top, name), directory)
                                    for top, dirs, files in os.walk(directory) for name in dirs + files)
                  if path.split(os.sep)[0] != "fake-slurm")


class Fakes:
    """A directory of fake SLURM commands, first on PATH; the log of their calls."""

    def __init__(self, work, missing=()):
        self.dir = os.path.join(work, "fake-slurm")
        os.makedirs(os.path.join(self.dir, "bin"))
        for name, text in FAKES.items():
            if name in missing:
                continue
            path = os.path.join(self.dir, "bin", name)
            with open(path, "w") as file:
                file.write(text)
            os.chmod(path, 0o755)
        for name, text in NOT_GRADFLOW.items():
            path = os.path.join(self.dir, f"gradflow-{name}")
            with open(path, "w") as file:
                file.write(f"#!/bin/bash\n{text}\n")
            os.chmod(path, 0o755)
        # Without the fakes' directory only the tools a shell script needs: no real SLURM command.
        self.path = os.path.join(self.dir, "bin") + ":/usr/bin:/bin"
        if missing:
            shadow = os.path.join(self.dir, "shadow")
            os.makedirs(shadow)
            for tool in ("bash", "cat", "echo", "printf"):
                found = shutil.which(tool)
                if found:
                    os.symlink(found, os.path.join(shadow, tool))
            self.path = os.path.join(self.dir, "bin") + ":" + shadow

    def calls(self):
        try:
            with open(os.path.join(self.dir, "calls.log")) as file:
                return [line.rstrip("\n") for line in file]
        except OSError:
            return []

    def records(self):
        try:
            with open(os.path.join(self.dir, "records.log")) as file:
                return [line.rstrip("\n") for line in file]
        except OSError:
            return []

    def env(self, **extra):
        return {**os.environ, "PATH": self.path, "FAKE_SLURM": self.dir, "SLURM_CONF": "/nonexistent",
                **extra}


def submit(submitter, gradflow, args, fakes, timeout=60, **env):
    """Runs the submitter in the case's directory (where -o '' would land) with the fakes on PATH."""
    command = [sys.executable, submitter, "--gradflow", gradflow, *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", env=fakes.env(**env),
                              timeout=timeout, cwd=os.path.dirname(fakes.dir))
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"(timed out after {timeout} s)"


def run_table(submitter, gradflow, work):
    table = cases(gradflow)
    failed = 0
    for number, entry in enumerate(table):
        w = os.path.join(work, f"case-{number}")
        os.makedirs(w)
        fakes = Fakes(w)
        if entry["setup"]:
            entry["setup"](w)
        before = tree(w)
        args = [word.replace("{w}", w) for word in entry["args"]]
        if entry["gradflow"]:
            args = ["--gradflow", os.path.join(fakes.dir, f"gradflow-{entry['gradflow']}"), *args]
        code, _, stderr = submit(submitter, gradflow, args, fakes, **entry["env"])
        lines = stderr.splitlines()
        needle = entry["needle"].replace("{w}", w)
        problems = []
        if code != 2:
            problems.append(f"exit {code}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} lines on stderr")
        if "Traceback" in stderr:
            problems.append("a traceback")
        if any(len(line) > 300 for line in lines):
            problems.append("a line longer than 300 characters")
        if not any(needle in line for line in lines[:1]):
            problems.append(f"{needle!r} not named")
        touched = [call for call in fakes.calls() if call.split()[0] in ("sbatch", "scancel")]
        if touched:
            problems.append(f"called {touched}")
        if entry["keeps_tree"] and tree(w) != before:
            problems.append(f"created {sorted(set(tree(w)) - set(before))}")
        failed += bool(problems)
        check(not problems, f"refused, exit 2, one line, nothing submitted: {entry['name']}" +
              (f" ({'; '.join(problems)[:300]}; last line: {(lines or [''])[-1][:200]!r})" if problems
               else f": {lines[0][:160]}"))
    print(f"{len(table)} bad invocations, {failed} not refused as they should be", flush=True)
    return table


def scenarios(submitter, gradflow, work):
    # 2. A good invocation through the same fakes is submitted: two sbatch calls, ids on stdout.
    w = os.path.join(work, "good")
    fakes = Fakes(w)
    code, stdout, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", "--no-wait", *SWEEP], fakes)
    submitted = [call for call in fakes.calls() if call.startswith("sbatch")]
    check(code == 0 and stdout.split() == ["1001", "1002"] and len(submitted) == 2,
          f"a good invocation is submitted through the fakes ({code}: {stdout.strip()!r}, {stderr.strip()!r})")

    # A --task-minutes so small that the tasks it asks for overflow: one task per cell, submitted.
    w = os.path.join(work, "tiny-task-minutes")
    fakes = Fakes(w)
    code, stdout, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", "--no-wait", "--task-minutes", "5e-324",
                                                        *SWEEP], fakes)
    arrays = [call.split()[2] for call in fakes.calls() if call.startswith("sbatch --parsable --array=")]
    check(code == 0 and arrays == ["--array=0-1"],
          f"--task-minutes 5e-324 submits one task per cell ({code}: {arrays}, {stderr.strip()[-200:]!r})")

    # 3. The merge job's sbatch fails after the array's succeeded: the array is cancelled and named.
    for wait in (False, True):
        w = os.path.join(work, f"merge-fails-{'wait' if wait else 'no-wait'}")
        fakes = Fakes(w)
        jobs = f"{w}/out/slurm/jobs.json"
        extra = ["--poll", "0.01"] if wait else ["--no-wait"]
        code, stdout, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", *extra, *SWEEP], fakes,
                                      FAKE_SBATCH_FAIL_AT="2", FAKE_JOBS_JSON=jobs)
        lines = [line for line in stderr.splitlines() if "error" in line]
        cancelled = [call for call in fakes.calls() if call.startswith("scancel")]
        mode = "waiting" if wait else "--no-wait"
        check(code == 3 and "Traceback" not in stderr, f"{mode}: a failed merge submission exits 3 ({code}: "
              f"{stderr.strip()[-300:]!r})")
        check(len(lines) == 1 and "1001" in lines[0] and "cancel" in lines[0] and "merge" in lines[0],
              f"{mode}: one line names the failed merge submission and the cancelled array ({lines})")
        check(cancelled == ["scancel 1001"], f"{mode}: the array alone is cancelled ({cancelled})")
        records = fakes.records()
        check(len(records) == 2 and '"1001"' in records[1],
              f"{mode}: the array is recorded in jobs.json before the merge job is submitted ({records})")
        check(stdout.strip() == "", f"{mode}: no job ids on stdout for a failed submission ({stdout.strip()!r})")

    # The array cannot be cancelled either (scancel fails): the line says so and how to cancel it,
    # and the record still holds it.
    w = os.path.join(work, "merge-fails-scancel-fails")
    fakes = Fakes(w)
    jobs = f"{w}/out/slurm/jobs.json"
    code, stdout, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", "--no-wait", *SWEEP], fakes,
                                  FAKE_SBATCH_FAIL_AT="2", FAKE_SCANCEL_FAIL="1")
    lines = [line for line in stderr.splitlines() if "error" in line]
    try:
        with open(jobs) as file:
            recorded = json.load(file)
    except (OSError, ValueError):
        recorded = None
    check(code == 3 and len(lines) == 1 and "could not be cancelled" in lines[0] and "Access/permission denied" in
          lines[0] and "scancel 1001" in lines[0] and "Traceback" not in stderr and stdout.strip() == "",
          f"a failed merge submission whose array cannot be cancelled says so, with the scancel to run ({code}: "
          f"{lines})")
    check(recorded == {"array": "1001", "merge": None}, f"the array that could not be cancelled stays recorded "
          f"({recorded})")

    # The same for a resubmission: the first array's task ends CANCELLED, the retry's array is
    # submitted and its merge job's sbatch fails: the new array is cancelled, and said so.
    w = os.path.join(work, "retry-merge-fails")
    fakes = Fakes(w)
    code, _, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", "--tasks", "1", "--poll", "0.01", "--retries", "1",
                                                   *SWEEP], fakes, FAKE_SBATCH_FAIL_AT="4")
    lines = [line for line in stderr.splitlines() if "error" in line]
    cancelled = [call for call in fakes.calls() if call.startswith("scancel")]
    check(code == 3 and len(lines) == 1 and "1003" in lines[0] and "Traceback" not in stderr and
          "scancel 1003" in cancelled,
          f"a resubmitted array whose merge job fails to submit is cancelled ({code}: {cancelled}, {lines})")

    # 4. SLURM's commands missing: exit 3, one line, nothing created.
    for missing in ("sbatch", "squeue", "scancel"):
        w = os.path.join(work, f"missing-{missing}")
        fakes = Fakes(w, missing=(missing,))
        code, _, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", "--no-wait", *SWEEP], fakes)
        lines = stderr.splitlines()
        check(code == 3 and len(lines) == 1 and missing in lines[0] and "Traceback" not in stderr and
              not os.path.exists(f"{w}/out") and not [c for c in fakes.calls() if c.startswith("sbatch")],
              f"{missing} missing from PATH: exit 3, one line naming it, nothing created or submitted "
              f"({code}: {stderr.strip()[-300:]!r})")
    # A rerun whose earlier record must be checked with squeue, when squeue is missing.
    w = os.path.join(work, "missing-squeue-rerun")
    fakes = Fakes(w, missing=("squeue",))
    os.makedirs(f"{w}/out/slurm")
    with open(f"{w}/out/slurm/jobs.json", "w") as file:
        json.dump({"array": "77", "merge": "78"}, file)
    code, _, stderr = submit(submitter, gradflow, ["-o", f"{w}/out", "--no-wait", *SWEEP], fakes)
    check(code == 3 and len(stderr.splitlines()) == 1 and "squeue" in stderr and "Traceback" not in stderr,
          f"squeue missing with an earlier submission on record: exit 3, one line ({code}: {stderr.strip()!r})")


def main():
    arguments = sys.argv[1:]
    submitter = os.path.join(ROOT, "scripts", "sweep-slurm")
    if "--submitter" in arguments:
        at = arguments.index("--submitter")
        submitter = os.path.abspath(arguments[at + 1])
        del arguments[at:at + 2]
    if len(arguments) != 1:
        print(__doc__)
        return 1
    gradflow = os.path.abspath(arguments[0])
    work = tempfile.mkdtemp(prefix="gradflow-slurm-faults-")
    try:
        run_table(submitter, gradflow, work)
        scenarios(submitter, gradflow, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print(f"FAILED: {failure[:200]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
