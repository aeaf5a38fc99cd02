"""Shared pytest set-up: the repository root on sys.path, paths to the shared data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: copies of ../shared/data (seed 003's V100 tables, published runs)."""
    return DATA
