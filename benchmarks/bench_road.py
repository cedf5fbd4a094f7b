"""ROAD's imputation on the CPU, the direct solve against the iterative one (issue 41's budget): ``python
benchmarks/bench_rank.py --road-solve`` as ``make bench`` runs it (see there)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rank import road_solve


def main() -> int:
    """Time the two solves alternately, twice, and print the ratio (``bench_rank.road_solve``)."""
    return road_solve(2)


if __name__ == "__main__":
    raise SystemExit(main())
