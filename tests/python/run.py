"""Runs the Python tests for ctest without hiding a skip: exit 0 when every test ran and passed, 1 on
a failure, 77 (ctest: Skipped) when a test was skipped, with the reason printed.

    run.py [--only PREFIX]... [--exclude PREFIX]...

PREFIX is a test id prefix such as test_plot.Plots.test_plots; --only keeps the tests that start with
one, --exclude drops them (tests/CMakeLists.txt splits the tests that need matplotlib into their own
ctest entry this way)."""
import argparse
import sys
import unittest
from pathlib import Path

SKIP_CODE = 77


def tests_of(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from tests_of(t)
        else:
            yield t


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--exclude", action="append", default=[])
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    found = unittest.defaultTestLoader.discover(str(here), top_level_dir=str(here))
    selected = [t for t in tests_of(found)
                if (not args.only or any(t.id().startswith(p) for p in args.only))
                and not any(t.id().startswith(p) for p in args.exclude)]
    if not selected:
        print("run.py: no test matches", file=sys.stderr)
        return 1
    result = unittest.TextTestRunner(verbosity=2).run(unittest.TestSuite(selected))
    if not result.wasSuccessful():
        return 1
    if result.skipped:
        for test, reason in result.skipped:
            print(f"SKIPPED: {test.id()}: {reason}")
        return SKIP_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
