#!/usr/bin/python3
"""The progress bar, tested through the real binary under a pseudo-terminal (run by ctest).

It must appear on stderr when stderr is a terminal and the run takes longer than about a second,
never when stderr is piped, never with --quiet, never for a short run, and never on stdout, so
that `gradflow analyze ... | python3 -c 'import json,sys; json.load(sys.stdin)'` always works.

Usage: test_progress.py GRADFLOW_BINARY
"""
import json
import os
import re
import pty
import select
import subprocess
import sys
import time

from cli_testing import finish, test

BINARY = sys.argv[1] if len(sys.argv) > 1 else "build/gradflow"
# Long enough (a few seconds on a laptop core) for the bar's one-second delay to pass.
LONG = ["analyze", "--arch", "pre-ln,post-ln,keel", "--depth", "512", "--threads", "1"]  # about 4 s on a 2026 EPYC
SHORT = ["analyze", "--arch", "keel", "--depth", "2", "--width", "16", "--heads", "2", "--seq", "4"]
# The bar as drawn: "label [####.....]  42.0%" (the JSON itself may contain "%", e.g. "95% t-interval").
BAR = re.compile(r"\[[#.]{10,}\] +\d+\.\d%")
# One whole redraw: "label [####.....]  42.0%  ETA 0m03s".
FRAME = re.compile(r"gradflow analyze \(\d+ run\(s\)\) \[[#.]{10,}\] +\d+\.\d%(  ETA \d+[hm]\d\d[ms])?")
# Each redraw starts by returning to the line's start and erasing it; finish() erases once more.
REDRAW = "\r\033[2K"
# A terminal needs about ten redraws a second (ProgressBar::kInterval is 100 ms).
REDRAWS_PER_SECOND = 10


def run_with_terminal_stderr(args, command=None):
    """Runs gradflow (or `command`) with stderr on a pty and stdout on a pipe: (stdout, terminal
    output, seconds)."""
    controller, terminal = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen(command or [BINARY, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    stdout_chunks, terminal_chunks = [], []
    streams = {proc.stdout.fileno(): stdout_chunks, controller: terminal_chunks}
    while streams:  # drain both, or a full pipe or pty would block the child
        ready, _, _ = select.select(list(streams), [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError(f"gradflow {' '.join(args)} produced nothing for 60 s")
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the pty's other side closed
                chunk = b""
            if chunk:
                streams[fd].append(chunk)
            else:
                del streams[fd]
    proc.wait()
    seconds = time.monotonic() - start
    os.close(controller)
    assert proc.returncode == 0, f"{command or args} exited {proc.returncode}: {b''.join(terminal_chunks)!r}"
    return b"".join(stdout_chunks).decode(), b"".join(terminal_chunks).decode(errors="replace"), seconds




@test
def bar_appears_on_a_terminal_stderr_and_never_on_stdout():
    stdout, terminal, seconds = run_with_terminal_stderr(LONG)
    assert seconds > 1.5, f"the run took {seconds:.2f} s; too short to test the bar, lengthen LONG"
    assert BAR.search(terminal), f"no bar on the terminal after {seconds:.1f} s: {terminal[-300:]!r}"
    assert terminal.endswith(REDRAW), f"the bar is not erased at the end: {terminal[-80:]!r}"
    assert not BAR.search(stdout) and "\r" not in stdout and "\033" not in stdout, "bar characters on stdout"
    doc = json.loads(stdout)
    assert [r["arch"] for r in doc["runs"]] == ["pre-ln", "post-ln", "keel"]


@test
def redraws_are_limited_to_about_ten_a_second_and_the_last_is_complete():
    _, terminal, seconds = run_with_terminal_stderr(LONG)
    assert seconds > 1.5, f"the run took {seconds:.2f} s; too short to test the bar, lengthen LONG"
    assert terminal.startswith(REDRAW) and terminal.endswith(REDRAW), f"{terminal[:80]!r} ... {terminal[-80:]!r}"
    frames = terminal[len(REDRAW):-len(REDRAW)].split(REDRAW)  # what each redraw drew, in order
    others = [f for f in frames if not FRAME.fullmatch(f)]
    assert not others, f"something besides the bar on the terminal: {others[:3]!r}"
    # The bar waits a second and then redraws at most every 100 ms, plus the completed state: a
    # redraw per sliver of progress (about a thousand per run) is far more than a terminal shows.
    bound = REDRAWS_PER_SECOND * seconds + 3
    assert len(frames) <= bound, (f"{len(frames)} redraws in a {seconds:.1f} s run, more than {bound:.0f} "
                                  f"({REDRAWS_PER_SECOND}/s)")
    print(f"  {len(frames)} redraws in {seconds:.1f} s")
    last = frames[-1]
    assert re.search(r"\[#{10,}\] +100\.0%$", last), f"the last redraw is not the completed bar: {last!r}"


@test
def quiet_silences_the_bar():
    stdout, terminal, _ = run_with_terminal_stderr([*LONG, "-q"])
    assert terminal == "", f"--quiet printed {terminal[:200]!r}"
    json.loads(stdout)


@test
def short_run_shows_no_bar():
    stdout, terminal, seconds = run_with_terminal_stderr(SHORT)
    if seconds < 1.0:  # a loaded machine may stretch it past the delay, when a bar would be right
        assert terminal == "", f"a {seconds:.2f} s run drew {terminal[:200]!r}"
    json.loads(stdout)


@test
def piped_stderr_shows_no_bar():
    proc = subprocess.run([BINARY, *LONG], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", f"piped stderr got {proc.stderr[:200]!r}"
    json.loads(proc.stdout)


@test
def pipe_into_json_load_succeeds_with_the_bar_on_the_terminal():
    pipeline = f"'{BINARY}' {' '.join(LONG)} | /usr/bin/python3 -c 'import json,sys; json.load(sys.stdin)'"
    _, terminal, _ = run_with_terminal_stderr(None, ["bash", "-o", "pipefail", "-c", pipeline])
    assert BAR.search(terminal), f"no bar on the terminal: {terminal[-300:]!r}"
    assert "Traceback" not in terminal and "Error" not in terminal, terminal[-500:]


finish()
