"""Planner speed: `plan` as a new process, and whole-space scoring rates.

    python tests/bench/bench_plan.py            # prints medians over 5 runs (7 for the issue-29 commands)
    python tests/bench/bench_plan.py --issue29  # only the issue-29 commands and the import time
    python tests/bench/bench_plan.py --issue29 --against /tmp/before   # and another checkout's, interleaved

Targets (issues 2 and 9): `plan --model 176B --gpus 384` under 0.3 s wall as a new process on 2 cores
(Python start-up included); the whole space of Megatron-1T on 3072 GPUs and of Llama-3-405B on
16384 GPUs under 2 s each; a plan's cost must not grow with the GPU count (98,304 and 10^9 GPUs take
what 384 take). Issue 29 point 5, as new processes (`python3 -m planner ...`, CPU seconds = user + system
of the child, Python start-up included): `plan --model 176B --gpus 384` <= 0.1 s CPU; Llama 3.1 405B at
its preset's 128K tokens on 16,384 H100 and Mixtral-8x22B at its preset's 64K on 1,024 H100 <= 0.3 s.
Reported as medians and candidates scored per second, not asserted.

    python tests/bench/bench_plan.py --instructions [--against DIR]   # the issue-29 commands' instruction counts
    python tests/bench/bench_plan.py --floor   # what Mixtral's plan pays before any memory or time is computed

``--instructions`` counts the instructions each issue-29 command executes, start-up included, under valgrind's
callgrind (valgrind must be installed; each command ~50x slower), with the hash seed fixed and the caches warm: the
same count to a few hundred instructions from run to run whatever the machine's load, where CPU seconds on a shared
2-core machine move by more than one change gains. Instructions are not seconds (a cache miss costs more than an
add): a change is judged by both.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REPEATS = 5
NEW_PROCESS_REPEATS = 7
ISSUE29 = [  # `plan` argv (python3 -m planner ...) of issue 29's speed targets, and the target CPU seconds
    (["--model", "176B", "--gpus", "384"], 0.1),
    (["--model", "llama3.1-405b", "--gpus", "16384", "--gpu", "H100-SXM"], 0.3),   # the preset's 128K tokens
    (["--model", "mixtral-8x22b", "--gpus", "1024", "--gpu", "H100-SXM"], 0.3),    # the preset's 64K tokens
]


def median_wall(argv: list[str], check: bool = True) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=check, capture_output=True, timeout=120)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def new_process(argv: list[str], repeats: int = NEW_PROCESS_REPEATS) -> tuple[float, float]:
    """Median wall and CPU (user + system) seconds of ARGV run as a new process in this checkout."""
    return new_processes(argv, [ROOT], repeats)[0]


def new_processes(argv: list[str], roots: list[Path], repeats: int = NEW_PROCESS_REPEATS) -> list[tuple[float, float]]:
    """Median wall and CPU (user + system) seconds of ARGV run as a new process in each of ``roots`` (planner
    checkouts: the working directory and PYTHONPATH), the roots taking turns run by run (a shared machine's load
    falls on each alike), after one run in each that writes the bytecode and catalog caches (as `pip install` does;
    PYTHONDONTWRITEBYTECODE=1, set in some sandboxes, would otherwise have every run compile planner/ from source,
    ~0.15 s more)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    envs = [env | {"PYTHONPATH": str(root)} for root in roots]
    for root, e in zip(roots, envs):
        subprocess.run(argv, cwd=root, env=e, check=True, capture_output=True, timeout=600)
    wall: list[list[float]] = [[] for _ in roots]
    cpu: list[list[float]] = [[] for _ in roots]
    for _ in range(repeats):
        for i, (root, e) in enumerate(zip(roots, envs)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(argv, cwd=root, env=e, check=True, capture_output=True, timeout=600)
            wall[i].append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[i].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu)]


def issue29(roots: list[Path]) -> None:
    """Issue 29's targets as new processes, with Python's start-up and planner's import time beside them: one
    wall / CPU pair per checkout in ``roots`` (``--against DIR`` adds another checkout, e.g. the commit before a
    change, measured interleaved with this one)."""
    n = NEW_PROCESS_REPEATS
    print(f"new processes, median of {n}: wall s / CPU s (user + system), for {', '.join(map(str, roots))}")
    for label, argv in (("python3 -c pass (start-up alone)", [sys.executable, "-c", "pass"]),
                        ("python3 -c 'import planner.cli' (start-up + imports)",
                         [sys.executable, "-c", "import planner.cli"])):
        cells = new_processes(argv, roots)
        print(" | ".join(f"{wall:7.3f} {cpu:7.3f}" for wall, cpu in cells) + f"  {label}")
    for argv, target in ISSUE29:
        cells = new_processes([sys.executable, "-m", "planner", *argv], roots)
        print(" | ".join(f"{wall:7.3f} {cpu:7.3f}" for wall, cpu in cells)
              + f"  plan {' '.join(argv)}  (target <= {target} s CPU)")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")


def instructions(roots: list[Path]) -> None:
    """The issue-29 commands' instruction counts (callgrind's "Collected"), one column per checkout in ``roots``."""
    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind (apt-get install valgrind)")
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONHASHSEED": "0"}
    print(f"instructions (callgrind), hash seed 0, caches warm, for {', '.join(map(str, roots))}")
    for argv in [["-c", "pass"], ["-c", "import planner.cli"]] + [["-m", "planner", *a] for a, _ in ISSUE29]:
        counts = []
        for root in roots:
            e = env | {"PYTHONPATH": str(root)}
            subprocess.run([sys.executable, *argv], cwd=root, env=e, check=True, capture_output=True, timeout=600)
            with tempfile.TemporaryDirectory() as tmp:
                run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
                                      sys.executable, *argv], cwd=root, env=e, check=True, capture_output=True,
                                     text=True, timeout=3600)
            found = re.search(r"Collected : (\d+)", run.stderr)
            counts.append(int(found.group(1)) if found else float("nan"))
        print(" | ".join(f"{c / 1e6:9.1f} M" for c in counts) + f"  python3 {' '.join(argv)}")


def floor() -> None:
    """What Mixtral-8x22B's plan (issue 29's slowest target) costs before any memory or time is computed, in-process:
    the shared rules' rows (every (TP, PP, CP, MBS) group and its rows, ruled out or passed to memory), with the rules
    answered from scratch and again with every answer known, and building each candidate that reaches the memory
    rule (what a design that judges candidates one by one in Python pays at the least)."""
    import gc
    from collections import Counter

    from planner import cli
    from planner.rank import _survivors_of_shared_rules, prepare
    from planner.rules import Checker, knob_values

    args = cli.build_parser().parse_args(["--model", "mixtral-8x22b", "--gpus", "1024", "--gpu", "H100-SXM"])
    model, cluster, training = cli.setup_from_args(args)
    targets = cli.targets_for(training, None)
    model = prepare(model, training)
    checker = Checker(model, cluster, training, targets)
    knobs = knob_values(targets[0], training)
    gc.disable()
    for label in ("rules answered from scratch", "every rule answer known"):
        t0 = time.process_time()
        items = list(_survivors_of_shared_rules(model, cluster, training, knobs, checker, Counter(), {},
                                                keep_rampup=False))
        print(f"{time.process_time() - t0:.3f} s  the shared rules' rows, {label}")
    rows = [i for i in items if type(i) is not int]
    t0 = time.process_time()
    built = [r.candidate(i) for r in rows for i in range(len(r.eps))]
    print(f"{time.process_time() - t0:.3f} s  building the {len(built):,} candidates of the {len(rows):,} rows that "
          f"reach the memory rule (of {sum(i if type(i) is int else len(i.eps) for i in items):,})")
    gc.enable()


def whole_space(model: str, gpus: int, gpu: str, framework: str) -> tuple[float, int]:
    import planner

    m = planner.load_model(model)
    cluster = planner.make_cluster(gpu=gpu, gpus=gpus)
    training = planner.TrainingSpec(global_batch=m.global_batch, seq_len=m.seq_len, framework=framework)
    times, total = [], 0
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        p = planner.plan(m, cluster, training)
        times.append(time.perf_counter() - t0)
        total = p.total
    return statistics.median(times), total


def main() -> int:
    args = sys.argv[1:]
    roots = [ROOT] + ([Path(args[args.index("--against") + 1]).resolve()] if "--against" in args else [])
    if "--instructions" in args:
        instructions(roots)
        return 0
    if "--floor" in args:
        floor()
        return 0
    issue29(roots)
    if "--issue29" in args:
        return 0
    print()
    startup = median_wall([sys.executable, "-c", "pass"])
    wall = median_wall([sys.executable, "-m", "planner.cli", "--model", "176B", "--gpus", "384"])
    print(f"python start-up alone:                    {startup:.3f} s (median of {REPEATS})")
    print(f"plan --model 176B --gpus 384 (new process): {wall:.3f} s (median of {REPEATS}; target < 0.3 s)")
    for gpus in (98_304, 10**9):
        t = median_wall([sys.executable, "-m", "planner.cli", "--model", "176B", "--gpus", str(gpus), "--no-rampup"],
                        check=False)
        print(f"plan --model 176B --gpus {gpus:,} --no-rampup (new process): {t:.3f} s (median of {REPEATS})")
    for model, gpus, gpu, fw in (("1T", 3072, "A100-80GB", "megatron-lm"), ("405B", 16384, "H100-SXM", "megatron-lm")):
        t, n = whole_space(model, gpus, gpu, fw)
        print(f"whole space {model} on {gpus} {gpu} ({fw}): {t:.3f} s for {n} candidates = "
              f"{n / t:,.0f} candidates/s (median of {REPEATS}; target < 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
