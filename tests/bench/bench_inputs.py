"""What validating inputs costs `plan`: CPU seconds (user + sys, min and median of N fresh processes).

    python tests/bench/bench_inputs.py [N]

Prints: an empty interpreter, the planner's schema module imported alone, pydantic v2 imported with two
strict models (the alternative planner/schema.py avoids), and `plan --model 176B --gpus 384`. CPU time,
not wall time, so a loaded machine skews it less; compare lines of one run, not runs.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYDANTIC = """
from pydantic import BaseModel, ConfigDict, Field
class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    name: str
    layers: int = Field(gt=0, le=10000)
    hidden: int = Field(gt=0)
    glu: bool = False
    train_tokens: float | None = None
    rampup: list[int] | None = None
class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    gpu: str
    nodes: int = Field(gt=0)
    inter_node_gbps: float | None = Field(default=None, gt=0)
Model(name="x", layers=3, hidden=4)
"""
# planner.schema alone: planner/__init__ would import the whole planner, so load the file by path
SCHEMA = """
import importlib.util, sys
import planner.errors
spec = importlib.util.spec_from_file_location("schema_alone", "planner/schema.py")
m = importlib.util.module_from_spec(spec); sys.modules["schema_alone"] = m; spec.loader.exec_module(m)
"""
SCHEMA_BASE = "import planner.errors"


def cpu_s(argv: list[str], n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(times), statistics.median(times)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    rows = [("python -c pass", [sys.executable, "-c", "pass"]),
            ("import planner (whole package)", [sys.executable, "-c", SCHEMA_BASE]),
            ("  + planner/schema.py", [sys.executable, "-c", SCHEMA_BASE + "\n" + SCHEMA]),
            ("pydantic v2 + 2 strict models", [sys.executable, "-c", PYDANTIC]),
            ("plan --model 176B --gpus 384", [sys.executable, "-m", "planner.cli", "--model", "176B", "--gpus", "384"])]
    for label, argv in rows:
        try:
            lo, med = cpu_s(argv, n)
        except subprocess.CalledProcessError:
            print(f"{label:34s} (failed: not installed?)")
            continue
        print(f"{label:34s} CPU s min {lo:.3f}  median {med:.3f}  (n={n})")


if __name__ == "__main__":
    main()
