"""The table of the planner's fitted constants (planner/constants.py) as the README shows it.

    python3 tests/bench/fitted_constants.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.constants import markdown  # noqa: E402

if __name__ == "__main__":
    print(markdown())
