"""Enumeration: the plain product of a target's degrees and knobs (`enumerate_candidates`), grouped by (TP, PP, CP,
MBS) (`enumerate_groups`, `Group`).

Enumeration is deliberately dumb: it yields the Cartesian product of divisors and the knobs the target has
(`planner.rules.knob_values`); every rule lives in `planner.rules` so that a ruled-out candidate can say why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from planner import context_parallel, moe, recompute
from planner.model import ModelSpec
from planner.pipeline_split import vpp_choices
from planner.rules import knob_values, target_of
from planner.space import Candidate, TrainingSpec, candidate_of, divisors


def mbs_values(per_replica: int, max_mbs: int) -> list[int]:
    """Every micro-batch up to ``max_mbs`` that divides the per-replica batch (tables measured MBS 6)."""
    return [m for m in range(1, max_mbs + 1) if per_replica % m == 0] or [1]


def enumerate_candidates(model: ModelSpec, world: int, gpus_per_node: int, training: TrainingSpec,
                         knobs: dict[str, tuple] | None = None) -> Iterator[Candidate]:
    """The plain product of TP, PP, MBS and the target's knobs, with TP*PP dividing the world size.

    TP runs over divisors of the world up to 2x ``gpus_per_node``, the NVLink domain (the node, or a GB200 NVL72
    rack: `ClusterSpec.domain_gpus`), so "TP inside the NVLink domain" is a visible reason, not a silent
    omission; PP over divisors of world/TP up to the layer count + 1 (one
    "PP exceeds layers" example); MBS over every value up to ``max_mbs`` dividing GBS/DP (GBS/DP not
    an integer gives MBS 1, which the batch rule then explains). ``knobs`` (recompute, zero, sp, vpp,
    hybrid value tuples; cp and ep: None where the target has them, then `planner.context_parallel.cp_choices`
    and `planner.moe.ep_choices` give the sizes) come from `planner.rules.knob_values`; pinned degrees
    replace their axis.
    Every rule is applied afterwards, by `planner.rules`.
    """
    if knobs is None:
        knobs = knob_values(target_of(training), training)
    for group in enumerate_groups(model, world, gpus_per_node, training, knobs):
        yield from group.candidates()


def enumerate_groups(model: ModelSpec, world: int, gpus_per_node: int, training: TrainingSpec,
                     knobs: dict[str, tuple]) -> Iterator[Group]:
    """`enumerate_candidates`' product in the same order, as groups of one (TP, PP, CP, MBS): the candidates of a
    group share DP and GAS, so every rule on degrees and batches has one answer for the whole group (`plan`
    counts a group those rules rule out without building its candidates)."""
    pins = dict(training.pins)
    tps = [pins["tp"]] if "tp" in pins else [t for t in divisors(world) if t <= 2 * gpus_per_node]
    for tp in tps:
        if world % tp:
            continue
        pps = [pins["pp"]] if "pp" in pins else [p for p in divisors(world // tp) if p <= model.layers + 1]
        for pp in pps:
            if world % (tp * pp):
                continue
            cps = knobs["cp"] or context_parallel.cp_choices(training.seq_len, world // (tp * pp), training.cp_options)
            for cp in cps:
                if world % (tp * pp * cp):
                    continue
                yield from _groups(model, world, training, knobs, pins, tp, pp, cp)


@dataclass(frozen=True, slots=True)
class Group:
    """The candidates of one (TP, PP, CP, MBS) in enumeration order: the product of the remaining knobs."""

    tp: int
    pp: int
    cp: int
    dp: int
    mbs: int
    gas: int
    recompute: tuple[str, ...]
    zero: tuple[int, ...]
    sp: tuple[bool, ...]
    vpp: tuple[int, ...]
    hybrid: tuple[bool, ...]
    ep_etps: tuple[tuple[int, int], ...]
    ep_no_sp: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        """How many candidates the group holds (without building them)."""
        eps = sum(len(self.ep_etps if sp else self.ep_no_sp) for sp in self.sp)
        return len(self.recompute) * len(self.zero) * len(self.vpp) * len(self.hybrid) * eps

    def first(self) -> Candidate:
        return next(self.candidates())

    def rows(self) -> Iterator[tuple[str, int, bool, int, bool, tuple[tuple[int, int], ...]]]:
        """(recompute, ZeRO, SP, VPP, hybrid, its (EP, ETP) pairs) in order: a row's candidates differ only in EP/ETP."""
        for recompute in self.recompute:
            for zero in self.zero:
                for sp in self.sp:
                    eps = self.ep_etps if sp else self.ep_no_sp
                    for vpp in self.vpp:
                        for hybrid in self.hybrid:
                            yield recompute, zero, sp, vpp, hybrid, eps

    def make(self, recompute: str, zero: int, sp: bool, vpp: int, hybrid: bool, ep: int, etp: int) -> Candidate:
        return candidate_of(self.tp, self.pp, self.dp, self.mbs, self.gas, recompute, zero, sp, vpp, hybrid, self.cp,
                            ep, etp)

    def candidates(self) -> Iterator[Candidate]:
        for recompute, zero, sp, vpp, hybrid, eps in self.rows():
            for ep, etp in eps:
                yield self.make(recompute, zero, sp, vpp, hybrid, ep, etp)


def _groups(model: ModelSpec, world: int, training: TrainingSpec, knobs: dict[str, tuple], pins: dict[str, int],
            tp: int, pp: int, cp: int) -> Iterator[Group]:
    """The rest of the product for one (TP, PP, CP), one group per MBS."""
    dp = world // (tp * pp * cp)
    if "dp" in pins and dp != pins["dp"]:
        return
    per_replica = training.global_batch // dp if training.global_batch % dp == 0 else 0
    mbss = [pins["mbs"]] if "mbs" in pins else mbs_values(per_replica, training.max_mbs)
    vpps = (pins["vpp"],) if "vpp" in pins else knobs["vpp"] or vpp_choices(model.layers, pp, model.mtp_layers)
    ep_etps = tuple(knobs["ep"] or moe.ep_choices(model, tp, cp, dp, training.ep_options))
    # Megatron needs SP under MoE with EP and TP (planner.moe.violations): sp=0 is enumerated with EP=1 only
    ep_no_sp = tuple(pe for pe in ep_etps if pe[0] == 1) if knobs["moe_needs_sp"] and tp > 1 else ep_etps
    # the module-recompute search token only for a model with modules to recompute (MoE, MLA)
    recomputes = tuple(r for r in knobs["recompute"] if r != "modules" or recompute.module_sets(model))
    for mbs in mbss:
        gas = max(training.global_batch // (mbs * dp), 1)
        if "gas" in pins and gas != pins["gas"]:
            continue
        yield Group(tp=tp, pp=pp, cp=cp, dp=dp, mbs=mbs, gas=gas, recompute=recomputes,
                    zero=tuple(knobs["zero"]), sp=tuple(knobs["sp"]), vpp=tuple(vpps), hybrid=tuple(knobs["hybrid"]),
                    ep_etps=ep_etps, ep_no_sp=ep_no_sp)
