#!/usr/bin/env python3
"""tests/README.md maps every file under src/ to the tests that cover it: this fails (exit 1, naming
each problem) when a source file has no row, a row names a file that is not in src/, or a row names a
test file that does not exist. --skeleton prints a row per source file with same-name tests, to start from.
    check_source_map.py REPO_ROOT [--skeleton]"""
import pathlib
import re
import sys


def same_name_tests(tests: pathlib.Path, source: pathlib.Path) -> list[str]:
    stem = source.stem
    found = list(tests.rglob(f"{stem}.test.cpp")) + list(tests.rglob(f"test_{stem}.py"))
    return sorted(str(p.relative_to(tests)) for p in found)


def main() -> int:
    root = pathlib.Path(sys.argv[1]).resolve()
    src, tests = root / "src", root / "tests"
    sources = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    if "--skeleton" in sys.argv[2:]:
        for source in sources:
            named = ", ".join(f"`{t}`" for t in same_name_tests(tests, src / source))
            print(f"| `{source}` | {named} | |")
        return 0
    rows = {}
    problems = []
    for line in (tests / "README.md").read_text().splitlines():
        match = re.match(r"\|\s*`([^`]+)`\s*\|([^|]*)\|", line)
        if not match or match.group(1).startswith("Source"):
            continue
        source, cell = match.group(1), match.group(2)
        if source in rows:
            problems.append(f"{source}: two rows")
        rows[source] = cell
        named = re.findall(r"`([^`]+)`", cell)
        if not named:
            problems.append(f"{source}: no test named")
        for test in named:
            pattern = test.split(" ")[0]
            if not list(tests.glob(pattern)):
                problems.append(f"{source}: test {test} does not exist under tests/")
    for source in sources:
        if source not in rows:
            problems.append(f"{source}: in src/ but has no row in tests/README.md")
    for source in rows:
        if source not in sources:
            problems.append(f"{source}: has a row in tests/README.md but is not in src/")
    for problem in problems:
        print(problem)
    print(f"{len(sources)} source files, {len(rows)} rows, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
