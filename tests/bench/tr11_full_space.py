"""The BLOOM tr11 dev tables' model shapes planned over the full space on Jean Zay's network: where does the layout
BigScience measured fastest rank among everything plan considers (not only among the rows they measured)?

    python tests/bench/tr11_full_space.py          # one line per model shape, then the summary
    python tests/bench/tr11_full_space.py --why    # and, per shape, what puts each layout ranked above the measured
                                                   # best ahead of it: the step's terms, their difference in seconds

For every tr11 model shape (hidden, layers, heads) of tests/data/published_dev.yaml that the source measured in
two layouts or more (the 9 shapes of validate.py's per-shape regret; rows the source flags left out): the measured
best run of that shape; `plan` over its full default space for that run's model, global batch
and GPU count on the jean-zay-a100 preset (8 A100-80GB per node, 4 x 100 Gb/s Omni-Path); the rank of the
measured best among plan's distinct layouts (TP, PP, DP, MBS, recompute: ZeRO 0 and 1 of one layout count once,
BigScience compared layouts, not ZeRO stages), and whether it is tied with plan's first pick (planner.cost.tied).
Then BigScience's own pick on the same network: `plan --model 176B --gpus 384 --cluster jean-zay-a100` and the rank
of TP4 PP12 MBS2 (104.70 s per iteration logged). Issue 23 asks for both in plan's top 3.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from published import DevCase, dev_cases  # noqa: E402

from planner.cost import tied  # noqa: E402
from planner.hardware import preset_cluster  # noqa: E402
from planner.model import get_preset  # noqa: E402
from planner.rank import Estimate, plan  # noqa: E402
from planner.space import TrainingSpec  # noqa: E402

TOP = 3


@dataclass(frozen=True)
class ShapePick:
    shape: str
    best: DevCase
    """the measured best run of the shape"""
    rank: int | None
    """its rank among plan's distinct layouts (None: plan rules it out)"""
    tied: bool
    """within the model's ranking error of plan's first pick"""
    top: tuple[Estimate, ...]
    """plan's first TOP distinct layouts"""
    ahead: tuple[Estimate, ...] = ()
    """every distinct layout plan ranks above the measured best, and the measured best itself last"""


def layout(e_or_case) -> tuple:
    c = e_or_case.candidate if isinstance(e_or_case, Estimate) else e_or_case.cand
    return c.tp, c.pp, c.dp, c.mbs, c.recompute


def shapes() -> dict[str, list[DevCase]]:
    """tr11 runs by model shape, the shapes measured in two layouts or more"""
    out: dict[str, list[DevCase]] = {}
    for c in dev_cases():
        if c.table.startswith("bloom tr11") and c.tokens_per_s_per_gpu and c.caveat is None:
            m = c.model
            out.setdefault(f"h{m.hidden} L{m.layers} a{m.heads}", []).append(c)
    return {k: v for k, v in out.items() if len({(c.cand, c.cand.world) for c in v}) >= 2}


def shape_pick(shape: str, runs: list[DevCase]) -> ShapePick:
    best = max(runs, key=lambda c: c.tokens_per_s_per_gpu)
    cluster = preset_cluster("jean-zay-a100", gpus=best.cand.world)
    p = plan(best.model, cluster, replace(best.training, rampup=None), allow_empty=True)
    distinct: list[Estimate] = []
    seen: set[tuple] = set()
    for e in p.candidates:
        if layout(e) not in seen:
            seen.add(layout(e))
            distinct.append(e)
    rank = next((i + 1 for i, e in enumerate(distinct) if layout(e) == layout(best)), None)
    is_tied = rank is not None and tied(distinct[0].step_time_s, distinct[rank - 1].step_time_s)
    return ShapePick(shape=shape, best=best, rank=rank, tied=is_tied, top=tuple(distinct[:TOP]),
                     ahead=tuple(distinct[:rank]) if rank else ())


def picks() -> list[ShapePick]:
    return [shape_pick(k, v) for k, v in sorted(shapes().items())]


def bloom_rank() -> tuple[int, Estimate, Estimate]:
    """(rank, estimate of TP4 PP12 MBS2 full recompute, plan's first) of BLOOM-176B on 48 x 8 A100 of Jean Zay."""
    model = get_preset("176B")
    training = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-deepspeed", flash_attention=False,
                            rampup=model.rampup)
    p = plan(model, preset_cluster("jean-zay-a100", gpus=384), training)
    bloom = next(e for e in p.candidates if layout(e)[:2] + layout(e)[3:] == (4, 12, 2, "full"))
    return bloom.rank, bloom, p.best


def _label(lay: tuple) -> str:
    tp, pp, dp, mbs, rc = lay
    return f"TP{tp} PP{pp} DP{dp} MBS{mbs} {rc}"


WHY_TERMS = (("compute", "compute_s"), ("TP", "tp_comm_s"), ("bubble", "pp_bubble_s"), ("p2p+engine", "pp_p2p_s"),
             ("DP", "dp_comm_s"), ("optimizer", "optimizer_s"))
"""TimeBreakdown lines --why compares (p2p+engine: pipeline sends and DeepSpeed's per-micro-batch cost)"""


def why_lines(p: ShapePick) -> list[str]:
    """Each layout ranked above the measured best: its step's lines minus the measured best's, seconds (negative:
    where it is faster), and its predicted memory."""
    if not p.ahead:
        return []
    ref = p.ahead[-1].time
    head = f"    {'layout ahead of ' + _label(layout(p.best)):40}" + "".join(f"{n:>11}" for n, _ in WHY_TERMS)
    out = [head + f"{'step':>9}{'mem GB':>8}"]
    for e in p.ahead[:-1]:
        t = e.time
        out.append(f"    {_label(layout(e)) + f' z{e.candidate.zero}':40}"
                   + "".join(f"{getattr(t, a) - getattr(ref, a):+11.1f}" for _, a in WHY_TERMS)
                   + f"{t.step_time_s - ref.step_time_s:+9.1f}{e.memory_gb_per_gpu:8.1f}")
    return out


def main() -> int:
    why = "--why" in sys.argv[1:]
    ps = picks()
    print(f"{'shape':22} {'GPUs':>4} {'measured best':32} {'rank':>4} tied  plan's top {TOP}")
    for p in ps:
        print(f"{p.shape:22} {p.best.cand.world:4} {_label(layout(p.best)):32} {p.rank or '-':>4} "
              f"{'~' if p.tied else ' ':4}  " + "; ".join(f"{_label(layout(e))} {e.step_time_s:.0f}s" for e in p.top))
        if why:
            print("\n".join(why_lines(p)))
    n = sum(p.rank is not None and p.rank <= TOP for p in ps)
    print(f"\nmeasured best in plan's top {TOP} of the full space: {n} of {len(ps)} tr11 model shapes; "
          f"tied with plan's first: {sum(p.tied for p in ps)} of {len(ps)}")
    rank, bloom, best = bloom_rank()
    print(f"BLOOM-176B on jean-zay-a100 (384 GPUs): BigScience's TP4 PP12 MBS2 ranks {rank}, {bloom.step_time_s:.1f} s "
          f"predicted (104.70 s logged); plan's first {_label(layout(best))} {best.step_time_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
