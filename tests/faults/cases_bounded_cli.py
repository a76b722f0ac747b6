"""Fault table (issue 34): the command line read as a person reads it, writes that cannot lose data,
start-up that cannot hang.

Kinds, one generated block each:
- numbers: every numeric option refuses octal/hex/binary prefixes, exponents and fractions where a
  whole number belongs, inf/nan/hex floats, and values out of its type's range (naming the range);
  leading zeros mean what a person reads ("010" is ten, checked against "10" below the table);
- empty values: '' and empty list items are refused instead of taking the default;
- options that would do nothing: refused, or warned about in one line;
- lost output: --help and --version into /dev/full, a sweep summary into a full stderr;
- the file-size limit (ulimit -f): exit 2, the temporaries removed;
- the address-space limit (ulimit -v): --version answers at once, analyze refuses cleanly;
- outputs that would overwrite each other (-o and --export-weights);
- messages: one line whatever the file name holds, naming the option given.

Usage: cases_bounded_cli.py BINARY
"""
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402
import fixtures  # noqa: E402

TINY = fixtures.TINY
F = fixtures.make()
ERROR = "gradflow: error:"


def limit(kind, value):
    def preexec():
        resource.setrlimit(kind, (value, value))
    return preexec


def dev_full(fd):
    def preexec():
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
    return preexec


CASES = []

# ---- numbers -------------------------------------------------------------------------------------
# (subcommand words before the option, option, kind, words after): kind is whole, unsigned or real.
NUMERIC = [
    (["analyze"], "--depth", "whole", TINY[2:]),
    (["analyze"], "--width", "whole", ["--depth", "2", "--heads", "2", "--seq", "4"]),
    (["analyze"], "--heads", "whole", ["--depth", "2", "--width", "16", "--seq", "4"]),
    (["analyze"], "--seq", "whole", ["--depth", "2", "--width", "16", "--heads", "2"]),
    (["analyze"], "--ffn-hidden", "whole", TINY),
    (["analyze"], "--kv-heads", "whole", TINY),
    (["analyze"], "--probes", "whole", TINY),
    (["analyze"], "--seeds", "whole", TINY),
    (["analyze"], "--threads", "whole", TINY),
    (["analyze"], "--seed", "unsigned", TINY),
    (["analyze"], "--input-corr", "real", TINY),
    (["analyze"], "--norm-eps", "real", TINY),
    (["analyze"], "--rope-theta", "real", TINY),
    (["analyze", "--arch", "keel"], "--alpha", "real", TINY),
    (["analyze", "--update", "adam"], "--lr", "real", TINY),
    (["archs"], "--depth", "whole", []),
    (["sweep", "--arch", "keel", "-o", "sw"], "--depth", "whole", []),
    (["sweep", "--arch", "keel", "--depth", "2", "-o", "sw"], "--width", "whole", []),
    (["sweep", "--arch", "keel", "--depth", "2", "-o", "sw"], "--jobs", "whole", []),
    (["check", "a.json", "--baseline", "a.json"], "--max-rows", "whole", []),
]
# value -> the regex its message must match (after the option's name)
BAD_WHOLE = {
    "0x10": r"must be written in decimal digits \(no 0x",
    "0b11": r"must be written in decimal digits \(no 0x",
    "0o17": r"must be written in decimal digits \(no 0x",
    "1e3": r"must be written in digits; (try {opt} 1000|give a list such as)",
    "64.0": r"must be written in digits; (try {opt} 64|give a list such as)",
    "2.5": r"must be a whole number",
    "99999999999999999999": r"is larger than 2147483647, the most it takes",
    "-3000000000": r"is smaller than -2147483648, the least it takes",
    " 8": r"must be a whole number",
    "٨": r"must be a whole number",
}
BAD_UNSIGNED = {
    "18446744073709551616": r"is larger than 18446744073709551615, the most it takes",
    "-1": r"must be >= 0",
    "0x1": r"must be written in decimal digits",
    "1e3": r"must be written in digits; try --seed 1000",
    "1.5": r"must be a whole number >= 0",
}
BAD_REAL = {
    "0x1p-2": r"must be a number",
    "inf": r"must be a number, not inf or nan",
    "-Infinity": r"must be a number, not inf or nan",
    "NaN": r"must be a number, not inf or nan",
    "1e400": r"is too large: it would be read as inf",
    "1.5.2": r"must be a number",
    "1e": r"must be a number",
}
BAD = {"whole": BAD_WHOLE, "unsigned": BAD_UNSIGNED, "real": BAD_REAL}
for before, option, kind, after in NUMERIC:
    for value, message in BAD[kind].items():
        shown = rf'("{value}"|{value})' if value.strip() == value else r'".*"'
        files = {"a.json": F["analyze"]} if before[0] == "check" else {}
        CASES.append(Case(f"{' '.join(before[:1])} {option} {value!r}", [*before, option, value, *after],
                          message=rf"{ERROR} {option} {shown} " + message.replace("{opt}", option),
                          files=files))

# ---- empty values: refused, not the default --------------------------------------------------------
EMPTY = [
    ("analyze --config ''", ["analyze", "--config", "", *TINY], "--config"),
    ("analyze --export-weights ''", ["analyze", "--export-weights", "", *TINY], "--export-weights"),
    ("analyze --rope-theta ''", ["analyze", "--rope-theta", "", *TINY], "--rope-theta"),
    ("analyze --alpha ''", ["analyze", "--arch", "keel", "--alpha", "", *TINY], "--alpha"),
    ("analyze --depth ''", ["analyze", "--depth", "", "--width", "16"], "--depth"),
    ("analyze --depth=", ["analyze", "--depth=", "--width", "16"], "--depth"),
    ("analyze --arch ''", ["analyze", "--arch", "", *TINY], "--arch"),
    ("analyze --format ''", ["analyze", "--format", "", *TINY], "--format"),
    ("analyze --tokens ''", ["analyze", "--tokens", "", *TINY], "--tokens"),
    ("check --tolerances ''", ["check", "a.json", "--baseline", "a.json", "--tolerances", ""], "--tolerances"),
    ("check --baseline ''", ["check", "a.json", "--baseline", ""], "--baseline"),
    ("archs --depth ''", ["archs", "--depth", ""], "--depth"),
]
for name, args, option in EMPTY:
    CASES.append(Case(name, args, message=rf"{option} is given an empty value",
                      files={"a.json": F["analyze"]} if args[0] == "check" else {}))
EMPTY_ITEMS = [
    ("analyze --lr 1e-3,,1e-4", ["analyze", "--update", "adam", "--lr", "1e-3,,1e-4", *TINY], "--lr"),
    ("analyze --lr ,1e-3", ["analyze", "--update", "adam", "--lr", ",1e-3", *TINY], "--lr"),
    ("analyze --lr 1e-3,", ["analyze", "--update", "adam", "--lr", "1e-3,", *TINY], "--lr"),
    ("sweep --depth 2,,4", ["sweep", "--arch", "keel", "--depth", "2,,4", "-o", "sw"], "--depth"),
    ("sweep --width 16,", ["sweep", "--arch", "keel", "--depth", "2", "--width", "16,", "-o", "sw"], "--width"),
]
for name, args, option in EMPTY_ITEMS:
    CASES.append(Case(name, args, message=rf"{option} \S+ has an empty item"))

# ---- options that would do nothing --------------------------------------------------------------
CASES += [
    Case("--version extra", ["--version", "extra"], message=r"--version takes nothing else"),
    Case("--version before a subcommand", ["--version", "analyze"], message=r"--version takes nothing else"),
    Case("--rope-fraction without --rope-theta", ["analyze", "--rope-fraction", "0.5", *TINY, "-q"],
         message=r"--rope-fraction 0.5 has no effect without rotary embeddings"),
    Case("--keel-variant without keel (a warning)",
         ["analyze", "--arch", "pre-ln", "--keel-variant", "v1", *TINY, "-q", "--format", "csv"], exit=0,
         quiet_stdout=False, message=r"warning: --keel-variant applies to keel only"),
]

# ---- lost output ----------------------------------------------------------------------------------
for args in (["--help"], ["--version"], ["analyze", "--help"], ["sweep", "--help"], ["check", "--help"],
             ["explain", "rms"]):
    CASES.append(Case(f"{' '.join(args)} > /dev/full", args, message=r"could not write the output to stdout",
                      preexec=dev_full(1)))
CASES.append(Case("sweep summary table 2> /dev/full",
                  ["sweep", "--arch", "keel", "--depth", "2", *TINY[2:], "-o", "sw"], one_line=False,
                  preexec=dev_full(2), setup=lambda d: subprocess.run(
                      [fixtures.binary(), "sweep", "--arch", "keel", "--depth", "2", *TINY[2:], "-o", "sw", "-q"],
                      cwd=d, check=True)))


# ---- the file-size limit (ulimit -f): EFBIG, not SIGXFSZ; nothing left ----------------------------
def sweep_without_cells(directory):
    """The sweep's directory as a first run leaves it, minus its cells (so the run under test writes them)."""
    subprocess.run([fixtures.binary(), "sweep", "--arch", "keel", "--depth", "2,3", *TINY[2:], "-o", "sw", "-q"],
                   cwd=directory, check=True)
    for name in os.listdir(os.path.join(directory, "sw", "cells")):
        os.remove(os.path.join(directory, "sw", "cells", name))
    os.remove(os.path.join(directory, "sw", "summary.json"))


FSIZE = limit(resource.RLIMIT_FSIZE, 2048)
CASES += [
    Case("ulimit -f: analyze -o out.json", ["analyze", *TINY, "-o", "out.json"], preexec=FSIZE,
         message=r"could not write -o out\.json \(.*\).*ulimit -f"),
    Case("ulimit -f: analyze -o out.csv", ["analyze", "--depth", "16", *TINY[2:], "-o", "out.csv"],
         preexec=FSIZE, message=r"could not write -o out\.csv"),
    Case("ulimit -f: analyze --export-weights", ["analyze", *TINY, "--export-weights", "w.safetensors", "-q"],
         preexec=FSIZE, message=r"could not write --export-weights w\.safetensors"),
    Case("ulimit -f: merge -o", ["merge", "sw", "-o", "merged.json"], preexec=FSIZE,
         files=fixtures.sweep_files(F), message=r"could not write -o merged\.json"),
    Case("ulimit -f: sweep cells", ["sweep", "--arch", "keel", "--depth", "2,3", *TINY[2:], "-o", "sw", "-q"],
         preexec=FSIZE, setup=sweep_without_cells, message=r"could not write sw/cells/\S+\.json"),
]

# ---- the address-space limit (ulimit -v): no hang at start-up -------------------------------------
for megabytes in (60, 100, 150, 175):
    address_space = limit(resource.RLIMIT_AS, megabytes * 1000 * 1024)
    CASES.append(Case(f"ulimit -v {megabytes} MB: --version", ["--version"], exit=0, one_line=False,
                      quiet_stdout=False, preexec=address_space, timeout=5))
    CASES.append(Case(f"ulimit -v {megabytes} MB: analyze", ["analyze", "--arch", "keel", "--depth", "64"],
                      message=r"out of memory.*RLIMIT_AS", preexec=address_space, timeout=5))
CASES.append(Case("ulimit -v 150 MB: archs --help", ["archs", "--help"], exit=0, one_line=False,
                  quiet_stdout=False, preexec=limit(resource.RLIMIT_AS, 150_000 * 1024), timeout=5))
CASES.append(Case("ulimit -v 350 MB: analyze on two threads", ["analyze", "--arch", "keel", "--depth", "64"],
                  message=r"out of memory.*RLIMIT_AS", preexec=limit(resource.RLIMIT_AS, 350_000 * 1024),
                  timeout=10))

# ---- outputs that would overwrite each other -----------------------------------------------------
CASES += [
    Case("-o and --export-weights one file", ["analyze", *TINY, "-o", "x.safetensors", "--export-weights",
                                              "x.safetensors"], message=r"--export-weights x\.safetensors would overwrite -o"),
    Case("-o and --export-weights one file, spelt apart",
         ["analyze", *TINY, "-o", "sub/../x.safetensors", "--export-weights", "./x.safetensors"],
         files={"sub/keep": ""}, message=r"would overwrite -o sub/\.\./x\.safetensors"),
    Case("--export-weights of seed 1 onto -o",
         ["analyze", *TINY, "--seeds", "2", "-o", "w.keel.seed1.safetensors", "--export-weights", "w.safetensors"],
         message=r"--export-weights w\.keel\.seed1\.safetensors would overwrite -o"),
    Case("--export-weights into a missing directory names it",
         ["analyze", *TINY, "-q", "--export-weights", "none/w.safetensors"],
         message=r"--export-weights none/w\.safetensors is not writable"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLACEMENT = open(os.path.join(ROOT, "data", "placements", "builtins", "pre-ln.toml")).read().replace(
    'id = "pre-ln"', 'id = "my-pre-ln"')
GPT2 = open(os.path.join(ROOT, "data", "configs", "gpt2.json")).read()
CASES += [
    Case("-o onto the --config file", ["analyze", "--config", "c.json", *TINY, "-o", "c.json"],
         files={"c.json": GPT2}, message=r"-o c\.json is --config c\.json, a file this run reads"),
    Case("-o onto the placement file", ["analyze", "--arch", "./p.toml", *TINY, "-o", "p.toml"],
         files={"p.toml": PLACEMENT}, message=r"-o p\.toml is --arch \./p\.toml, a file this run reads"),
    Case("-o onto one of two placement files", ["analyze", "--arch", "keel,p.toml", *TINY, "-o", "./p.toml"],
         files={"p.toml": PLACEMENT}, message=r"is --arch p\.toml, a file this run reads"),
]

# ---- messages: one line, the option as given -----------------------------------------------------
CASES += [
    Case("-o with a newline in its name", ["analyze", *TINY, "-o", "a\nb/x.json"], message=r"-o a\\nb/x\.json"),
    Case("--config with a newline in its name", ["analyze", "--config", "no\nsuch.json", *TINY],
         message=r"no\\nsuch\.json"),
    Case("check of a file named with an escape", ["check", "x\x1b[2J.json", "--baseline", "a.json"],
         files={"a.json": F["analyze"]}, message=r"x\\x1b\[2J\.json"),
    Case("--placement file with a newline in its name", ["analyze", "--arch", "my\nfile.toml", *TINY],
         message=r"my\\nfile\.toml"),
    Case("sweep --jobs 100000", ["sweep", "--arch", "keel", "--depth", "2", "--jobs", "100000", "-o", "sw"],
         message=r"--jobs 100000 must lie in \[1, 1024\]"),
    Case("analyze --threads 100000", ["analyze", *TINY, "--threads", "100000"],
         message=r"--threads 100000 must lie in \[1, 1024\]"),
]


def same_output(a, b):
    """Leading zeros mean what a person reads: --depth 010 is --depth 10, --seed 007 is --seed 7."""
    extra = ["--no-timing", "-q"] if a[0] == "analyze" else []
    run = lambda args: subprocess.run([fixtures.binary(), *args, *extra, "--format", "json"], capture_output=True)
    first, second = run(a), run(b)
    return first.returncode == 0 and first.stdout == second.stdout


DECIMAL_PAIRS = [
    (["analyze", "--depth", "010", "--width", "016", "--seq", "08"], ["analyze", "--depth", "10", "--width", "16", "--seq", "8"]),
    (["analyze", *TINY, "--seed", "007"], ["analyze", *TINY, "--seed", "7"]),
    (["analyze", *TINY, "--input-corr", "00.5"], ["analyze", *TINY, "--input-corr", "0.5"]),
    (["archs", "--depth", "010", "--arch", "deepnorm"], ["archs", "--depth", "10", "--arch", "deepnorm"]),
]
if __name__ == "__main__":
    misread = [(a, b) for a, b in DECIMAL_PAIRS if not same_output(a, b)]
    for a, b in misread:
        print(f"FAIL leading zeros: {' '.join(a)} is not read as {' '.join(b)}")
    try:
        run_table(CASES)
    except SystemExit as done:
        sys.exit(1 if misread else done.code)
