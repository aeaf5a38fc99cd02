"""Predicted vs measured memory on the dev data: OOM-vs-fits confusion and peak-memory error.

    python tests/bench/memory_fit.py            # summary
    python tests/bench/memory_fit.py --rows     # every misjudged row and every measured peak

A run is predicted to fit when `planner.memory.verdict` says so (the predicted total within HBM minus
the default 5% headroom). Measured peaks are compared like for like: BigScience's nvidia-smi maximum of the
first node includes the CUDA context, NCCL's buffers and the allocator's reserve, so it is compared with the
first stage as nvidia-smi reads it (`planner.memory.reported_bytes`).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from memory_cases import all_cases  # noqa: E402

from planner.memory import memory_breakdown, reported_bytes, stage_memory, verdict  # noqa: E402


def main(show_rows: bool) -> None:
    cases = all_cases()
    by_table: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    errors: list[tuple[str, float, float]] = []
    for c in cases:
        mem = memory_breakdown(c.model, c.cand, c.cluster, c.training)
        fits = verdict(mem, c.cluster, c.training).fits
        by_table[c.table].append((c.ran, fits))
        if show_rows and fits != c.ran:
            print(f"  {'FALSE PRUNE' if c.ran else 'MISSED OOM '} {c.id:58} {c.cand.label():60} "
                  f"flash={c.training.flash_attention} seq={c.model.seq_len} pred {mem.total_bytes / 2**30:6.1f} GiB")
        if c.measured_gib is not None:
            first = stage_memory(c.model, c.cand, c.cluster, c.training)[0]
            pred = reported_bytes(first, c.cand, c.cluster, c.definition) / 2**30
            errors.append((c.id, c.measured_gib, pred))
    print(f"{'table':62} {'rows':>4} {'right':>6} {'ran, pred OOM':>13} {'OOM, pred fit':>13}")
    total = right = false_prune = missed = 0
    for table, pairs in sorted(by_table.items()):
        n = len(pairs)
        ok = sum(r == f for r, f in pairs)
        fp = sum(r and not f for r, f in pairs)
        mo = sum((not r) and f for r, f in pairs)
        print(f"{table:62} {n:4} {ok / n:6.1%} {fp:13} {mo:13}")
        total, right, false_prune, missed = total + n, right + ok, false_prune + fp, missed + mo
    print(f"{'all':62} {total:4} {right / total:6.1%} {false_prune:13} {missed:13}")
    hag = [p for t, ps in by_table.items() if t.startswith("llama_13B") for p in ps]
    print(f"Hagemann et al. 422 rows: OOM-vs-fits right {sum(r == f for r, f in hag) / len(hag):.1%}, "
          f"ran but predicted OOM {sum(r and not f for r, f in hag)}")
    if errors:
        rel = [(p - m) / m for _, m, p in errors]
        print(f"\nmeasured peaks (nvidia-smi, GiB): {len(errors)} runs, predicted/measured median "
              f"{statistics.median(p / m for _, m, p in errors):.2f}, mean |error| "
              f"{statistics.mean(abs(x) for x in rel):.1%}, max |error| {max(abs(x) for x in rel):.1%}")
        if show_rows:
            for i, m, p in errors:
                print(f"  {i:62} measured {m:5.1f} predicted {p:5.1f}")


if __name__ == "__main__":
    main("--rows" in sys.argv[1:])
