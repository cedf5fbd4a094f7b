"""``make bench``: run every ``benchmarks/bench_*.py`` in turn; each prints ratios against its own baseline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    """Run the benchmark scripts (or those named on the command line) and return the worst exit status."""
    here = Path(__file__).resolve().parent
    scripts = [here / f"bench_{name}.py" for name in sys.argv[1:]] or sorted(here.glob("bench_*.py"))
    status = 0
    for script in scripts:
        print(f"== {script.stem} ==", flush=True)
        status = max(status, subprocess.call([sys.executable, str(script)]))
    return status


if __name__ == "__main__":
    sys.exit(main())
