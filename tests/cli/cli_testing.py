"""The tiny test runner shared by the CLI test scripts: `@test` runs a function at once and records
it; `finish()` prints the 'N passed, N failed' line ctest readers look for and exits non-zero on a failure.
`first_difference` compares two parsed JSON documents bit for bit (the thread-count and subnormal tests)."""
import json
import struct
import sys
import time

RESULTS = {"passed": 0, "failed": 0}


def test(function):
    start = time.monotonic()
    try:
        function()
        RESULTS["passed"] += 1
        print(f"ok   {function.__name__} ({time.monotonic() - start:.1f} s)")
    except AssertionError as error:
        RESULTS["failed"] += 1
        print(f"FAIL {function.__name__}: {error}")
    return function


def finish():
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] else 0)


def show(value):
    if isinstance(value, float):
        return f"{value!r} ({value.hex()})"
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."


def first_difference(a, b, path="$"):
    """The first place where the parsed documents a and b differ, as (path, a's value, b's value), or
    None. A list item holding an "arch" is labelled with it. Numbers must agree in JSON type (int, float)
    and, for floats, bit for bit."""
    if type(a) is not type(b):
        return path, a, b
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key, "(absent)"), b.get(key, "(absent)")
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            label = f"{path}[{i}]" + (f"({x['arch']})" if isinstance(x, dict) and "arch" in x else "")
            found = first_difference(x, y, label)
            if found:
                return found
        return None if len(a) == len(b) else (f"{path} (length)", len(a), len(b))
    if isinstance(a, float):
        return None if struct.pack("<d", a) == struct.pack("<d", b) else (path, a, b)
    return None if a == b else (path, a, b)
