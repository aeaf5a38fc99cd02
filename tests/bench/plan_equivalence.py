"""Whole-output fingerprint of `plan` for a change that must not change any result (a speed-up).

    python tests/bench/plan_equivalence.py write /tmp/before    # on the code before the change
    python tests/bench/plan_equivalence.py check /tmp/before    # on the code after: exit 1 on any difference

For each case it records the `plan` CLI's JSON (every ranked row, pruned counts and examples, rampup schedule)
and its table (the elapsed-time figure masked), both with every row and with a few (--top 10, 3: the rows `plan`
scores in full when it bounds the rest), plus, through the API, every survivor's memory, time and
throughput dataclasses at full float precision, every pruned count and example, the total and `free_best`.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CLI_CASES = [  # argv of `plan`
    ["--model", "mixtral-8x22b", "--gpus", "1024", "--gpu", "H100-SXM"],
    ["--model", "mixtral-8x22b", "--gpus", "1024", "--gpu", "H100-SXM", "--precision", "fp8"],
    ["--model", "deepseek-v3", "--gpus", "2048", "--gpu", "H100-SXM"],
    ["--model", "deepseek-v3", "--gpus", "2048", "--gpu", "H100-SXM", "--precision", "fp8"],
    ["--model", "llama3.1-405b", "--gpus", "16384", "--gpu", "H100", "--seq-len", "131072", "--global-batch", "128",
     "--framework", "megatron-lm"],
    ["--model", "llama3.1-405b", "--gpus", "16384", "--gpu", "H100", "--seq-len", "131072", "--global-batch", "128",
     "--framework", "megatron-lm", "--precision", "fp8"],
    ["--model", "mixtral-8x22b", "--gpus", "1024", "--gpu", "H100", "--seq-len", "8192", "--global-batch", "512"],
    ["--model", "deepseek-v3", "--gpus", "2048", "--gpu", "H100", "--seq-len", "4096", "--global-batch", "15360"],
    ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "H100", "--framework", "megatron-lm"],
    ["--model", "qwen3-30b-a3b", "--gpus", "128", "--gpu", "H100"],
    ["--model", "176B", "--gpus", "384"],
    ["--model", "1B3", "--gpus", "16", "--gpu", "V100-32GB", "--precision", "fp16"],
    ["--model", "1T", "--gpus", "3072", "--gpu", "A100-80GB", "--framework", "megatron-lm"],
    ["--model", "llama3-405b", "--gpus", "16384", "--gpu", "H100-SXM", "--framework", "megatron-lm"],
    ["--model", "llama3-8b", "--gpus", "64", "--gpu", "A100-80GB", "--framework", "fsdp"],
    ["--model", "llama3-8b", "--gpus", "64", "--gpu", "H100", "--framework", "megatron-lm", "--seq-len", "32768",
     "--precision", "fp8"],
    ["--model", "175B", "--gpus", "1024", "--framework", "megatron-deepspeed", "--emit-flavor", "microsoft"],
]


def _cli(argv: list[str]) -> str:
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    text = re.sub(r"scored in [0-9.]+ s", "scored in X s", out.getvalue())
    return f"rc={rc}\n{text}\nstderr:\n{err.getvalue()}"


def _api(argv: list[str]) -> str:
    """Every survivor and every count through the API, floats unrounded."""
    from planner.cli import build_parser, choose_framework, setup_from_args, targets_for
    from planner.rank import plan

    args = build_parser().parse_args(argv)
    model, cluster, training = setup_from_args(args)
    choose_framework(args, model, cluster)
    p = plan(model, cluster, training, targets=targets_for(training, None), allow_empty=True,
             free_best=training.rampup is not None)
    lines = [f"total={p.total} survivors={len(p.candidates)}"]
    lines += [f"pruned {r.value} {n}" for r, n in p.pruned.items()]
    lines += [f"example {r.value} {c!r} {v!r}" for r, (c, v) in p.examples.items()]
    lines += [_repr(e) for e in p.candidates]
    lines.append(f"free_best {_repr(p.free_best)}")
    return "\n".join(lines)


def _repr(e) -> str:
    """An Estimate's repr without its time's `terms` and `params` (the lines they sum to are printed): comparable
    with fingerprints written before the step time became a list of terms."""
    if e is None or e.time is None:
        return repr(e)
    return repr(e).replace(repr(e.time), repr(e.time).split(", terms=")[0] + ")")


def fingerprints() -> dict[str, str]:
    out = {}
    for i, argv in enumerate(CLI_CASES):
        out[f"{i:02d}-table"] = " ".join(argv) + "\n" + _cli(argv + ["--top", "1000000"])
        out[f"{i:02d}-json"] = _cli(argv + ["--format", "json", "--top", "1000000"])
        out[f"{i:02d}-top-table"] = _cli(argv)   # the default --top 10: what `plan` scores in full (`plan(keep=)`)
        out[f"{i:02d}-top-json"] = _cli(argv + ["--format", "json", "--top", "3"])
        out[f"{i:02d}-api"] = _api(argv)
    return out


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print(__doc__)
        return 2
    where = Path(sys.argv[2])
    prints = fingerprints()
    if sys.argv[1] == "write":
        where.mkdir(parents=True, exist_ok=True)
        for name, text in prints.items():
            (where / f"{name}.txt").write_text(text)
        print(f"wrote {len(prints)} fingerprints to {where}")
        return 0
    bad = [name for name, text in prints.items() if (where / f"{name}.txt").read_text() != text]
    print(f"{len(prints) - len(bad)} of {len(prints)} identical" + (f"; differ: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
