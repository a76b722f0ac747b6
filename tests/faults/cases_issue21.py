"""Fault table: every case issue 21 lists, one row each, plus stdout on a full disk, -o onto special
files and the memory limits (RLIMIT_AS, as `prlimit --as` / `ulimit -v` set it)."""
import json
import os
import resource
import stat
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402
import fixtures  # noqa: E402

F = fixtures.make()
A = F["analyze"]
TINY = fixtures.TINY
CELL = sorted(F["cells"])[0]
CELL_RE = CELL.replace(".", r"\.")
OUT = "gradflow: error:"

# Paths outside the cases' directories (the harness checks those stay clean): a symlink loop, a
# symlink to a file, a FIFO.
SPECIAL = tempfile.mkdtemp(prefix="gradflow-special-")
LOOP = os.path.join(SPECIAL, "loop")
os.symlink(os.path.join(SPECIAL, "loop2"), LOOP)
os.symlink(LOOP, os.path.join(SPECIAL, "loop2"))
# The same loop under the one extension --export-weights accepts, so the loop (not the name) is refused.
LOOP_SAFETENSORS = os.path.join(SPECIAL, "loop.safetensors")
os.symlink(os.path.join(SPECIAL, "loop2.safetensors"), LOOP_SAFETENSORS)
os.symlink(LOOP_SAFETENSORS, os.path.join(SPECIAL, "loop2.safetensors"))
LINK = os.path.join(SPECIAL, "link.json")
open(os.path.join(SPECIAL, "target.json"), "w").close()
os.symlink(os.path.join(SPECIAL, "target.json"), LINK)
FIFO = os.path.join(SPECIAL, "fifo")
os.mkfifo(FIFO)
LOOP_DIR = os.path.join(SPECIAL, "loopdir")
os.symlink(LOOP_DIR, LOOP_DIR)
# Stand-ins for /dev/null and /dev/stdout: a binary that replaced its -o target (as main did)
# must not be able to damage the system's own. A device node needs root (CAP_MKNOD); without it
# the device case runs against a symlink-free path and says so.
NULL_DEVICE = os.path.join(SPECIAL, "null")
NULL_SAFETENSORS = os.path.join(SPECIAL, "null.safetensors")  # the name --export-weights accepts
try:
    for node in (NULL_DEVICE, NULL_SAFETENSORS):
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    DEVICE_MESSAGE = r"null(\.safetensors)? is a device"
except PermissionError:
    print("note: no CAP_MKNOD; the -o device case uses a symlink to /dev/null instead")
    for node in (NULL_DEVICE, NULL_SAFETENSORS):
        os.symlink("/dev/null", node)
    DEVICE_MESSAGE = r"null(\.safetensors)? is a symbolic link"
STDOUT_LINK = os.path.join(SPECIAL, "stdout")
os.symlink("/proc/self/fd/1", STDOUT_LINK)


def to_dev_full():
    """preexec: the child's stdout is /dev/full (every write fails with ENOSPC)."""
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, 1)


def address_space(limit):
    def preexec():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


def with_number(text, value):
    return text.replace("{", '{"n":' + value + ",", 1)


def sweep_with(**grid):
    manifest = json.loads(F["manifest"])
    manifest["grid"].update(grid)
    return fixtures.sweep_files(F, manifest=json.dumps(manifest))


CASES = [
    # Crashes: JSON of the wrong shape
    Case("check: command 5, cells []", ["check", "x.json", "--baseline", "x.json"], message=r"x\.json.*command",
         files={"x.json": '{"schema_version":1,"command":5,"cells":[]}'}),
    Case("check --expect on a run without seeds", ["check", "e.json", "--baseline", "e.json", "--expect",
                                                   "keel.log10_grad_ratio < 1"], message=r"e\.json.*run keel",
         files={"e.json": '{"schema_version":1,"runs":[{"arch":"keel","seeds":[]}]}'}),
    *[Case(f"merge: cell {name}", ["merge", "sw"], message=CELL_RE, files=fixtures.sweep_files(F, cells={CELL: text}))
      for name, text in [("{}", "{}"), ("[]", "[]"), ("runs []", '{"schema_version":1,"runs":[]}'),
                         ("without config.probes", fixtures.edit(F["cells"][CELL],
                                                                 lambda d: d["runs"][0]["config"].pop("probes")))]],
    Case("merge: sweep.json without model", ["merge", "sw"], message=r"sweep\.json.*model",
         files=fixtures.sweep_files(F, manifest=fixtures.edit(F["manifest"], lambda d: d.pop("model")))),
    # 1e400 anywhere
    Case("check: 1e400 in the result", ["check", "r.json", "--baseline", "b.json"], message=r"r\.json",
         files={"r.json": with_number(A, "1e400"), "b.json": A}),
    Case("check: 1e400 in the baseline", ["check", "r.json", "--baseline", "b.json"], message=r"b\.json",
         files={"r.json": A, "b.json": with_number(A, "1e400")}),
    Case("check: 1e400 in --tolerances", ["check", "a.json", "--baseline", "a.json", "--tolerances", "t.json"],
         message=r"t\.json", files={"a.json": A, "t.json": '{"log_space": 1e400}'}),
    Case("merge: 1e400 in sweep.json", ["merge", "sw"], message=r"sweep\.json",
         files=fixtures.sweep_files(F, manifest=with_number(F["manifest"], "1e400"))),
    Case("merge: 1e400 in a cell", ["merge", "sw"], message=CELL_RE,
         files=fixtures.sweep_files(F, cells={CELL: with_number(F["cells"][CELL], "1e400")})),
    # a cell whose content does not match its name
    Case("merge: a cell holding another cell", ["merge", "sw"], message=CELL_RE + ".*holds",
         files=fixtures.sweep_files(F, cells={CELL: F["cells"][sorted(F["cells"])[1]]})),
    # symlink loops
    Case("check: a symlink loop", ["check", LOOP, "--baseline", LOOP], message="symbolic links"),
    Case("merge: a symlink loop", ["merge", LOOP_DIR], message="loopdir"),
    Case("analyze -o: a symlink loop", ["analyze", *TINY, "-o", LOOP], message="symbolic link"),
    Case("analyze --export-weights: a symlink loop", ["analyze", *TINY, "-o", "r.json", "--export-weights", LOOP_SAFETENSORS],
         message="symbolic link"),
    # threads
    Case("analyze --threads 100000", ["analyze", "--arch", "keel,pre-ln,post-ln", "--depth", "1", "--width", "16",
                                      "--heads", "2", "--seq", "4", "--threads", "100000"], message=r"--threads 100000"),
    Case("analyze --threads -1", ["analyze", *TINY, "--threads", "-1"], message=r"--threads -1"),
    # sizes
    Case("analyze --depth 2147483647", ["analyze", "--depth", "2147483647"], message=r"--depth 2147483647"),
    Case("analyze --depth 2^30", ["analyze", "--depth", "1073741824"], message=r"--depth 1073741824"),
    Case("analyze --depth 2^31-2", ["analyze", "--depth", "2147483646"], message=r"--depth 2147483646"),
    Case("archs --arch keel --depth 2147483647", ["archs", "--arch", "keel", "--depth", "2147483647"],
         message=r"--depth 2147483647"),
    Case("sweep --seeds 2147483647", ["sweep", "--arch", "keel", "--depth", "2", "--seeds", "2147483647", "-o", "o"],
         message=r"2147483647 cells", timeout=10),
    Case("merge: seeds 2147483647", ["merge", "sw"], message=r"sweep\.json.*cells", timeout=10,
         files=sweep_with(seeds=2147483647)),
    # memory limits
    Case("analyze depth 64 under 300 MB of address space", ["analyze", "--arch", "keel", "--depth", "64"],
         message=r"out of memory.*RLIMIT_AS", preexec=address_space(300_000_000), timeout=5),
    Case("analyze depth 8192 under 300 MB of address space", ["analyze", "--arch", "keel", "--depth", "8192"],
         message=r"out of memory.*RLIMIT_AS", preexec=address_space(300_000_000), timeout=5),
    Case("analyze depth 8192 under 1.2 GB of address space", ["analyze", "--arch", "keel", "--depth", "8192"],
         message=r"out of memory", preexec=address_space(1_200_000_000), timeout=5),
    # --update keeps a cotangent per state and three copies of the weights: refused up front, not mid-run.
    Case("analyze --update at Llama width under 1.15 GB of address space",
         ["analyze", "--config", "llama-3.2-1b", "--depth", "2", "--update", "adam", "-q"],
         message=r"out of memory.*RLIMIT_AS", preexec=address_space(1_150_000_000), timeout=5),
    Case("sweep under 300 MB of address space", ["sweep", "--arch", "keel", "--depth", "64,8192", "-o", "o"],
         message=r"out of memory", preexec=address_space(300_000_000), timeout=5),
    # lost writes: stdout on a full disk
    Case("analyze json > /dev/full", ["analyze", *TINY, "--format", "json"], message="stdout", preexec=to_dev_full),
    Case("analyze csv > /dev/full", ["analyze", *TINY, "--format", "csv"], message="stdout", preexec=to_dev_full),
    Case("archs --format json > /dev/full", ["archs", "--format", "json"], message=r"stdout|write",
         preexec=to_dev_full),
    Case("archs > /dev/full", ["archs"], message=r"stdout|write", preexec=to_dev_full),
    Case("archs --arch keel > /dev/full", ["archs", "--arch", "keel"], message=r"stdout|write", preexec=to_dev_full),
    Case("check > /dev/full", ["check", "a.json", "--baseline", "a.json"], message="stdout", preexec=to_dev_full,
         files={"a.json": A}),
    Case("check --json > /dev/full", ["check", "a.json", "--baseline", "a.json", "--json"], message="stdout",
         preexec=to_dev_full, files={"a.json": A}),
    Case("merge > /dev/full", ["merge", "sw"], message="stdout", preexec=to_dev_full, files=fixtures.sweep_files(F)),
    Case("merge --format csv > /dev/full", ["merge", "sw", "--format", "csv"], message="stdout", preexec=to_dev_full,
         files=fixtures.sweep_files(F)),
    # -o onto special files: refused, the file left as it was
    Case("analyze -o a device (as /dev/null)", ["analyze", *TINY, "-o", NULL_DEVICE], message=DEVICE_MESSAGE),
    Case("analyze -o a link to /proc/self/fd/1 (as /dev/stdout)", ["analyze", *TINY, "-o", STDOUT_LINK],
         message=r"stdout is a symbolic link"),
    Case("analyze -o a symlink", ["analyze", *TINY, "-o", LINK], message=r"is a symbolic link"),
    Case("analyze -o a FIFO", ["analyze", *TINY, "-o", FIFO], message=r"is a FIFO", timeout=10),
    Case("merge -o a symlink", ["merge", "sw", "-o", LINK], message=r"is a symbolic link",
         files=fixtures.sweep_files(F)),
    Case("analyze --export-weights onto a device", ["analyze", *TINY, "-o", "r.json", "--export-weights", NULL_SAFETENSORS],
         message=DEVICE_MESSAGE),
    # accepted silently before
    *[Case(f"check: schema_version {v}", ["check", "a.json", "--baseline", "b.json"], message="schema_version",
           files={"a.json": fixtures.edit(A, lambda d, v=v: d.__setitem__("schema_version", json.loads(v))),
                  "b.json": A})
      for v in ["2", "0", "-1", '"1"', "null", "1.5"]],
    Case("merge: schema_version 99", ["merge", "sw"], message=r"sweep\.json.*schema_version",
         files=fixtures.sweep_files(F, manifest=fixtures.edit(F["manifest"], lambda d: d.__setitem__("schema_version", 99)))),
    Case("analyze --input-corr nan", ["analyze", *TINY, "--input-corr", "nan"], message=r"--input-corr nan"),
    Case("analyze --mix-ratio nan", ["analyze", "--arch", "mix-ln", *TINY, "--mix-ratio", "nan"], message=r"--mix-ratio nan"),
    Case("analyze --alpha inf", ["analyze", "--arch", "keel", *TINY, "--alpha", "inf"], message=r"--alpha inf"),
    Case("check --expect 'X != nan'", ["check", "a.json", "--baseline", "a.json", "--expect", "keel.log10_grad_ratio != nan"],
         message=r"--expect.*nan", files={"a.json": A}),
    Case("merge: seeds -5", ["merge", "sw"], message=r"sweep\.json.*seeds -5", files=sweep_with(seeds=-5)),
    Case("check: a result with arch 7", ["check", "r.json", "--baseline", "b.json"], message=r"r\.json.*arch",
         files={"r.json": fixtures.edit(A, lambda d: d["runs"][0].__setitem__("arch", 7)), "b.json": A}),
]

if __name__ == "__main__":
    print(f"{len(CASES)} cases from issue 21")
    try:
        run_table(CASES)
    finally:
        for name in os.listdir(SPECIAL):
            os.unlink(os.path.join(SPECIAL, name))
        os.rmdir(SPECIAL)
