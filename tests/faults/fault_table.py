"""The harness for gradflow's fault tables: each table is a list of `Case`s (a bad invocation, the
files it reads, what must come of it), run through the real binary in a fresh directory.

A case passes when gradflow exits with the expected code, prints exactly one line on stderr that
matches `message` (a regular expression, searched), prints nothing on stdout (for error exits),
and leaves the directory exactly as it found it: no output, no temporary file.

Usage from a table script:
    from fault_table import Case, run_table
    CASES = [Case("depth zero", ["analyze", "--depth", "0"], message=r"--depth 0")]
    run_table(CASES)          # reads the binary from argv[1]; prints 'N passed, N failed'
"""
import dataclasses
import os
import re
import subprocess
import sys
import tempfile


@dataclasses.dataclass
class Case:
    name: str                      # what the case is, for the report
    args: list                     # the command line after the binary; "{dir}" is replaced by the case's directory
    message: str = ""              # regex that the one stderr line must contain (searched, case-sensitive)
    exit: int = 2                  # the expected exit code
    files: dict = dataclasses.field(default_factory=dict)  # name -> str or bytes written before the run
    stdin: str = ""                # standard input
    one_line: bool = True          # stderr must be exactly one line
    quiet_stdout: bool = True      # stdout must be empty
    timeout: float = 60.0          # seconds before the case counts as a hang
    env: dict = dataclasses.field(default_factory=dict)   # extra environment variables
    preexec: object = None         # a function run in the child before exec (e.g. to set rlimits)
    setup: object = None           # a function called with the case's directory after `files` are written
                                   # (e.g. to make a FIFO); what it makes counts as there before the run


def _listing(directory):
    found = set()
    for root, dirs, names in os.walk(directory):
        for name in dirs + names:
            found.add(os.path.relpath(os.path.join(root, name), directory))
    return found


# Under AddressSanitizer (scripts/ci-sanitize sets GRADFLOW_FAULTS_SANITIZED=1) a case that limits the
# address space cannot run: ASan reserves terabytes of shadow memory. Those cases are skipped there
# (they run in the Release suite), and every timeout is multiplied by the sanitizers' slowdown.
SANITIZED = os.environ.get("GRADFLOW_FAULTS_SANITIZED") == "1"
TIMEOUT_SCALE = 10.0 if SANITIZED else 1.0


def sets_address_space(preexec):
    """True when the case's preexec would set RLIMIT_AS: it runs in a forked child whose
    setrlimit and dup2 only record, so the probe changes nothing."""
    if preexec is None:
        return False
    pid = os.fork()
    if pid == 0:
        import resource
        calls = []
        resource.setrlimit = lambda kind, value: calls.append(kind)
        os.dup2 = lambda *args, **kwargs: None
        try:
            preexec()
        except BaseException:
            pass
        os._exit(1 if resource.RLIMIT_AS in calls else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


def _without_address_limit(preexec):
    """The preexec, with its RLIMIT_AS calls ignored (it runs in the child, so the patch stays there)."""
    def run():
        import resource
        setrlimit = resource.setrlimit
        resource.setrlimit = lambda kind, value: None if kind == resource.RLIMIT_AS else setrlimit(kind, value)
        preexec()
    return run


def run_case(binary, case):
    """Runs one case; returns None when it passes, else the reason it failed."""
    with tempfile.TemporaryDirectory(prefix="gradflow-fault-") as directory:
        for name, content in case.files.items():
            path = os.path.join(directory, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb" if isinstance(content, bytes) else "w") as handle:
                handle.write(content)
        if case.setup is not None:
            case.setup(directory)
        before = _listing(directory)
        args = [str(a).replace("{dir}", directory) for a in case.args]
        env = dict(os.environ, **case.env)
        try:
            proc = subprocess.run([binary, *args], cwd=directory, input=case.stdin.encode(),
                                  capture_output=True, timeout=case.timeout * TIMEOUT_SCALE, env=env,
                                  preexec_fn=case.preexec)
        except subprocess.TimeoutExpired:
            return f"no answer within {case.timeout * TIMEOUT_SCALE} s (a hang)"
        stderr = proc.stderr.decode(errors="replace")
        stdout = proc.stdout.decode(errors="replace")
        lines = [line for line in stderr.splitlines() if line.strip()]
        problems = []
        if proc.returncode != case.exit:
            problems.append(f"exit {proc.returncode}, expected {case.exit}")
        if case.one_line and len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines, expected 1")
        if case.message and not re.search(case.message, stderr):
            problems.append(f"stderr does not match /{case.message}/")
        if case.quiet_stdout and stdout:
            problems.append(f"stdout not empty ({len(stdout)} chars)")
        left = _listing(directory) - before
        if left:
            problems.append(f"left behind: {sorted(left)}")
        if problems:
            return "; ".join(problems) + f"\n       stderr: {stderr.strip()[:400]!r}"
        return None


def run_table(cases, binary=None):
    """Runs every case and prints one line per failure and the closing 'N passed, N failed' line."""
    binary = os.path.abspath(binary or (sys.argv[1] if len(sys.argv) > 1 else "build/gradflow"))
    names = [case.name for case in cases]
    duplicates = {name for name in names if names.count(name) > 1}
    assert not duplicates, f"case names repeat: {sorted(duplicates)}"
    passed = failed = 0
    if SANITIZED:
        # A case whose address-space limit is only a bound on the work still runs, without the
        # limit; one that expects the limit's own refusal ("out of memory") cannot, and is skipped.
        limited = [case for case in cases if sets_address_space(case.preexec)]
        needs_limit = [case for case in limited if re.search(r"memory|RLIMIT_AS", case.message)]
        for case in limited:
            if case not in needs_limit:
                case.preexec = _without_address_limit(case.preexec)
        if needs_limit:
            print(f"note: {len(needs_limit)} case(s) expecting the address-space refusal skipped under the "
                  f"sanitizers; {len(limited) - len(needs_limit)} run without their limit")
        cases = [case for case in cases if case not in needs_limit]
    for case in cases:
        reason = run_case(binary, case)
        if reason is None:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {case.name}: gradflow {' '.join(map(str, case.args))}\n       {reason}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
