"""Fault table: bad invocations of every subcommand, generated from the options and their bad values
(issue 21). Each must end in exit 2 with one stderr line naming the option and the value, no stdout
and no file left behind."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402
import fixtures  # noqa: E402

TINY = fixtures.TINY


def names(*parts):
    """A regex that finds every part in the message, in any order (option names and values)."""
    return "(?s)" + "".join(f"(?=.*{re.escape(str(p))})" for p in parts if str(p))


CASES = []


def bad(subcommand, option, value, prefix=(), note="", shown=None):
    """shown: how the message spells the value, when not as typed (1e400 is read as inf)."""
    args = [subcommand, *prefix, option, value]
    CASES.append(Case(f"{subcommand} {option} {value!r}{note}", args,
                      message=names(option, value if shown is None else shown)))


# analyze: every integer size with values that are not one (or not a valid one)
INTEGER_BAD = ["abc", "1.5", "99999999999", "-1", "2147483647", "1e3", "12abc"]
for option in ["--depth", "--width", "--heads", "--seq", "--probes", "--spectrum", "--threads"]:
    for value in INTEGER_BAD:
        bad("analyze", option, value)
for option in ["--depth", "--width", "--heads", "--seq", "--probes", "--threads"]:
    bad("analyze", option, "0")
for value in ["-3", "100000"]:
    bad("analyze", "--threads", value)
bad("analyze", "--spectrum", "65")

# analyze: real-valued options, each with the placement that uses it
FLOAT_BAD = ["nan", "inf", "-inf", "abc", "1e400", "NaN"]
for option, arch, extra in [("--input-corr", "keel", ["-1", "2"]), ("--mix-ratio", "mix-ln", ["-1", "2"]),
                            ("--alpha", "keel", ["-1", "0"]), ("--rezero-alpha", "rezero", []),
                            # the shipped files' options (issue 30): ranges, and values the file refuses
                            ("--completep-alpha", "completep", ["0.4", "1.5"]),
                            ("--completep-base-depth", "completep", ["0", "-2"]),
                            ("--attnres-blocks", "attnres-block", ["0", "2.5"]),
                            ("--num-fracs", "frac-connections", ["0", "3", "2.5"])]:  # 3: not a divisor of --width 16
    for value in FLOAT_BAD + extra:
        bad("analyze", option, value, prefix=["--arch", arch, *TINY],
            shown={"1e400": "inf", "NaN": "nan"}.get(value, value))

# analyze: closed sets
for option in ["--block", "--norm", "--init", "--precision", "--format", "--angles"]:
    for value in ["bogus", "RMS-", "x y"]:
        bad("analyze", option, value)
for value in ["nope", "keel,nope", ",", "keel,,pre-ln"]:
    CASES.append(Case(f"analyze --arch {value!r}", ["analyze", "--arch", value, *TINY], message=r"--arch|placement"))

# archs
for value in INTEGER_BAD + ["0"]:
    bad("archs", "--depth", value)
bad("archs", "--format", "xml")
CASES.append(Case("archs --arch unknown", ["archs", "--arch", "nope"], message="nope"))

# sweep: lists, counts, shards
SWEEP = ["sweep", "--arch", "keel", "--width", "16", "--heads", "2", "--seq", "4", "-o", "out", "-q"]
for value in ["0", "-1", "a", "2,,3", "2,2", "", "2147483647", "1,99999999999", "2;3", "1.5"]:
    CASES.append(Case(f"sweep --depth {value!r}", [*SWEEP, "--depth", value], message=names("--depth")))
for value in ["0", "a", "16,16", "2147483647", "-16"]:
    CASES.append(Case(f"sweep --width {value!r}", ["sweep", "--arch", "keel", "--depth", "2", "-o", "out", "--width", value],
                      message=names("--width")))
for value in ["0", "-5", "abc", "2147483647", "1.5"]:
    CASES.append(Case(f"sweep --seeds {value!r}", [*SWEEP, "--depth", "2", "--seeds", value], message=names("seed")))
for value in ["0", "-1", "abc"]:
    CASES.append(Case(f"sweep --jobs {value!r}", [*SWEEP, "--depth", "2", "--jobs", value], message=names("--jobs")))
for value in ["3/2", "-1/2", "1", "a/b", "0/0", "1/1", "2/", "/2"]:
    CASES.append(Case(f"sweep --shard {value!r}", [*SWEEP, "--depth", "2", "--shard", value], message=names("--shard")))
CASES.append(Case("sweep --arch unknown", ["sweep", "--arch", "nope", "--depth", "2", "-o", "out"], message="nope"))
CASES.append(Case("sweep --input-corr nan", [*SWEEP, "--depth", "2", "--input-corr", "nan"], message=names("--input-corr", "nan")))
CASES.append(Case("sweep without -o", ["sweep", "--arch", "keel", "--depth", "2"], message=r"-o|--output"))

# merge
CASES.append(Case("merge of no directory", ["merge", "nowhere"], message="nowhere"))
CASES.append(Case("merge of a file", ["merge", "f.json"], message=r"f\.json", files={"f.json": "{}"}))
CASES.append(Case("merge --format xml", ["merge", "nowhere", "--format", "xml"], message="xml"))

# check
A = {"a.json": "{}"}
CASES.append(Case("check of a missing result", ["check", "none.json", "--baseline", "none2.json"], message=r"none\.json"))
CASES.append(Case("check without --baseline", ["check", "a.json"], message="--baseline", files=A))
for value in ["keel.log10_grad_ratio", "keel.log10_grad_ratio != nan", "keel.log10_grad_ratio < inf",
              "keel < 1", ".a < 1", "keel.a.b.c < 1", "keel.log10_grad_ratio < abc", "keel.x <> 1",
              "keel.log10_grad_ratio == -nan", "keel.log10_grad_ratio < 1 2"]:
    CASES.append(Case(f"check --expect {value!r}", ["check", "a.json", "--baseline", "a.json", "--expect", value],
                      message=names("--expect"), files=A))

if __name__ == "__main__":
    print(f"{len(CASES)} bad invocations")
    run_table(CASES)
