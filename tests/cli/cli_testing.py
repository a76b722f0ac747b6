"""The tiny test runner shared by the CLI test scripts: `@test` runs a function at once and records
it; `finish()` prints the 'N passed, N failed' line ctest readers look for and exits non-zero on a failure."""
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
