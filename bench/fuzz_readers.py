"""Long fuzzing of the readers: the seeded damage of tests/hostile/test_fuzz_readers.py, for many
more seeds than the test suite runs (it runs the first 80).

    PYTHONPATH=src .venv/bin/python bench/fuzz_readers.py --first 80 --cases 1000

Prints each failing seed with what failed; exits 1 when any did. A failing seed is reproduced by
the same command with ``--first SEED --cases 1``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.hostile.test_fuzz_readers import compacted_fixtures, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=80, help="the first seed")
    parser.add_argument("--cases", type=int, default=200, help="how many seeds")
    args = parser.parse_args()
    failed = 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fdtrace-fuzz-") as scratch:
        compacted = compacted_fixtures(Path(scratch) / "compacted")
        for case in range(args.first, args.first + args.cases):
            with tempfile.TemporaryDirectory(dir=scratch) as folder:
                try:
                    run_case(case, Path(folder), compacted)
                except BaseException as exc:  # noqa: BLE001 - pytest.fail raises its own type
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    failed += 1
                    print(f"seed {case}: {' '.join(str(exc).split())[:400]}", flush=True)
    print(f"{args.cases} seeds from {args.first}: {failed} failed, {time.monotonic() - began:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
