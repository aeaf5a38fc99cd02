"""Score candidates and rank them: `estimate()` for one, `plan()` for the whole space.

    >>> from planner import plan, load_model, make_cluster, TrainingSpec
    >>> p = plan(load_model("1B3"), make_cluster(gpu="V100-32GB", gpus=8, gpus_per_node=4),
    ...          TrainingSpec(global_batch=512, seq_len=2048, precision="fp16"))
    >>> p.candidates[0].rank
    1
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

from planner import flops, offload, recompute as recompute_modes
from planner.cost import (CostParams, attention_kernel, Throughput, TimeBreakdown, estimate_time, layer_op_rows, term_rows,
                          ceiling_group, tflops_ceilings, throughput)
from planner.errors import DoesNotFitError
from planner.hardware import ClusterSpec, make_cluster
from planner.memory import MemoryBreakdown, PlanMemory, host_offload_bytes, memory_breakdown
from planner.model import ModelSpec
from planner.rules import (Checker, Reason, Target, Violation, host_memory_of, host_memory_violations, iter_violations,
                           knob_values, memory_advice, memory_violations, target_of)
from planner.enumeration import Group, enumerate_groups
from planner.space import DIMENSIONS, Candidate, TrainingSpec
from planner.topology import Topology


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """One candidate's prediction, or the reasons it is ruled out (both when asked to explain)."""

    candidate: Candidate
    memory: MemoryBreakdown | None = None
    time: TimeBreakdown | None = None
    throughput: Throughput | None = None
    reasons: tuple[Violation, ...] = ()
    advice: tuple[Violation, ...] = ()
    """marks that do not rule the candidate out (seed 004's 75% model-states guess)"""
    rank: int | None = None
    layer_ops: tuple[dict, ...] = ()
    """one layer's operations on the busiest GPU for one micro-batch (`planner.cost.layer_op_rows`): what
    `estimate` (--explain) shows; empty in a ranked plan"""
    offload_saved_bytes: float = 0.0
    """GPU memory the layout's own activation offload (``candidate.offload``, plan's search) saves against the same
    layout without it"""
    opt_offload_saved_bytes: float = 0.0
    """GPU memory the layout's own CPU optimizer offload (``candidate.opt_offload``, plan's search) saves against the
    same layout without it"""
    opt_offload_added_s: float = 0.0
    """step seconds the layout's own CPU optimizer offload adds against the same layout without it (the host's
    pipelined D2H, CPU Adam and H2D in place of the GPU's share of the step: `planner.offload.host_step_s`)"""
    host_gb_per_node: float | None = None
    """pinned host memory a node's offloads take (`planner.memory.host_offload_bytes` x GPUs a node), GB; None when
    nothing is offloaded"""

    @property
    def opt_offload_cost(self) -> dict | None:
        """What the layout's CPU optimizer offload costs: GPU memory saved, step seconds added, the node's pinned host
        memory; None without one."""
        if not self.candidate.opt_offload or self.time is None:
            return None
        return {"fraction": self.candidate.opt_offload, "saves_gb": _r(self.opt_offload_saved_bytes / 1e9),
                "added_s": _r(self.opt_offload_added_s, 4), "host_gb_per_node": _r(self.host_gb_per_node)}

    @property
    def offload_cost(self) -> dict | None:
        """What the layout's activation offload costs: GPU memory saved, and the seconds of the step its PCIe copies
        take, exposed (beyond the compute they run beside) and hidden; None without one."""
        if not self.candidate.offload or self.time is None or self.time.terms is None:
            return None
        exposed, hidden = self.time.terms.step_seconds_by_term(self.time.params).get("activation_offload", (0.0, 0.0))
        return {"modules": self.candidate.offload.split("+"), "saves_gb": _r(self.offload_saved_bytes / 1e9),
                "exposed_s": _r(exposed, 4), "hidden_s": _r(hidden, 4)}

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def memory_gb_per_gpu(self) -> float | None:
        return self.memory.total_gb if self.memory else None

    @property
    def step_time_s(self) -> float | None:
        return self.time.step_time_s if self.time else None

    @property
    def model_tflops_per_gpu(self) -> float | None:
        return self.throughput.model_tflops_per_gpu if self.throughput else None

    def to_dict(self, *, detail: bool = False) -> dict:
        """The machine-readable contract: one object per candidate (see README)."""
        c, t, m = self.candidate, self.throughput, self.memory
        d = {dim.name: getattr(c, dim.name) for dim in DIMENSIONS}
        d.update({"memory_gb_per_gpu": _r(m.total_gb if m else None),
             "step_time_s": _r(self.time.step_time_s if self.time else None),
             "model_tflops_per_gpu": _r(t.model_tflops_per_gpu if t else None),
             "hardware_tflops_per_gpu": _r(t.hardware_tflops_per_gpu if t else None),
             "mfu": _r(t.mfu if t else None, 4), "rank": self.rank,
             "advice": [v.reason.value for v in self.advice]})
        if t:
            d.update(samples_per_s=_r(t.samples_per_s), tokens_per_s=_r(t.tokens_per_s, 1),
                     days_to_train=_r(t.days_to_train), gpu_hours_to_train=_r(t.gpu_hours_to_train, 0))
        if self.offload_cost is not None:
            d["offload_cost"] = self.offload_cost
        if self.opt_offload_cost is not None:
            d["opt_offload_cost"] = self.opt_offload_cost
        if detail:
            d["fits"] = self.fits
            d["reasons"] = [v.to_dict() for v in self.reasons]
            d["advice"] = [v.to_dict() for v in self.advice]
            if m:
                d["memory_breakdown_gb"] = {k: _r(getattr(m, k) / 1e9) for k in (
                    "weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
                    "buffers_bytes", "context_bytes", "step_bytes", "pinned_bytes", "reserved_bytes")} | {
                    "stage": m.stage, "params_on_gpu": m.params_on_gpu}
            if self.time:
                d["time_breakdown_s"] = {k: _r(getattr(self.time, k), 4) for k in (
                    "compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_bubble_s", "pp_p2p_s", "dp_comm_s",
                    "optimizer_s")}
                d["terms"] = [{k: _r(v, 4) if isinstance(v, float) else v for k, v in row.items()}
                              for row in term_rows(self.time)]
            if self.layer_ops:
                d["layer_ops"] = [{k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in row.items()}
                                  for row in self.layer_ops]
        return d


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A plan: the ranked survivors, and what was ruled out and why."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    candidates: list[Estimate]
    """survivors, ranked best first (with ``plan(..., keep=N)``: the N best)"""
    survivors: int
    """how many candidates fit and pass every rule (``len(candidates)`` unless ``keep`` left some unscored)"""
    targets: tuple[Target, ...] = ()
    """what the survivors were checked for (framework and flavour, the probe, an --emit target)"""
    pruned: dict[Reason, int]
    """ruled-out candidates counted by their first reason"""
    examples: dict[Reason, tuple[Candidate, Violation]] = field(default_factory=dict)
    total: int = 0
    free_best: Estimate | None = None
    """with ``plan(..., free_best=True)``: the best layout the same plan gives without its rampup rule (what
    ``plan(model, cluster, replace(training, rampup=None)).best`` is, found in the same pass); None otherwise"""

    @property
    def best(self) -> Estimate:
        return self.candidates[0]

    def to_dict(self, top: int | None = None) -> dict:
        cands = self.candidates if top is None else self.candidates[:top]
        return {"model": self.model.name, "cluster": self.cluster.to_dict(), "global_batch": self.training.global_batch,
                "seq_len": self.training.seq_len, "framework": self.training.framework,
                "targets": [str(t) for t in self.targets],
                "precision": self.training.precision, "flops_attention": self.training.flops_attention,
                "attention_kernel": attention_kernel(self.model, self.cluster, self.training)[0],
                "flops_definition": "model: 3 x forward matmuls, no recompute; hardware: with the recomputed "
                                    f"forward; {flops.ATTENTION_COUNT_WORDS[self.training.flops_attention]}",
                "enumerated": self.total, "survivors": self.survivors,
                "candidates": [e.to_dict() for e in cands],
                "pruned": {r.value: n for r, n in self.pruned.items()},
                "pruned_examples": {r.value: {"candidate": c.label(), "detail": v.detail}
                                    for r, (c, v) in self.examples.items()}}


def prepare(model: ModelSpec, training: TrainingSpec) -> ModelSpec:
    """The model as trained: the training's sequence length wins over the preset's."""
    return model.with_overrides(seq_len=training.seq_len)


def estimate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, candidate: Candidate, *,
             params: CostParams = CostParams(), topology: Topology | None = None,
             targets: Target | tuple[Target, ...] | None = None) -> Estimate:
    """Memory, time and every rule of the targets (default: the training's) for one candidate, computed
    even when a rule is broken."""
    model = prepare(model, training)
    topology = topology or Topology(cluster)
    reasons = list(iter_violations(model, candidate, cluster, training, targets))
    if any(r.reason is Reason.INVALID for r in reasons) or candidate.world > cluster.world_size \
            or candidate.world <= 0:
        return Estimate(candidate=candidate, reasons=tuple(reasons))
    mem = memory_breakdown(model, candidate, cluster, training)
    reasons += memory_violations(mem, cluster, training)
    reasons += host_memory_violations(model, candidate, cluster, training)
    time = estimate_time(model, candidate, cluster, training, topology, params)
    saved = (memory_breakdown(model, replace(candidate, offload=""), cluster, training).total_bytes - mem.total_bytes
             if candidate.offload else 0.0)
    opt_saved, opt_added = 0.0, 0.0
    if candidate.opt_offload:
        without = replace(candidate, opt_offload=0.0)
        opt_saved = memory_breakdown(model, without, cluster, training).total_bytes - mem.total_bytes
        opt_added = time.step_time_s - estimate_time(model, without, cluster, training, topology, params).step_time_s
    return Estimate(candidate=candidate, memory=mem, time=time, offload_saved_bytes=saved,
                    opt_offload_saved_bytes=opt_saved, opt_offload_added_s=opt_added,
                    host_gb_per_node=_host_gb(model, candidate, cluster, training),
                    throughput=throughput(model, candidate, cluster, training, time), reasons=tuple(reasons),
                    advice=tuple(memory_advice(mem, cluster, training)),
                    layer_ops=tuple(layer_op_rows(model, candidate, cluster, training)))


def _score(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cand: Candidate, topology: Topology,
           params: CostParams, memory: PlanMemory, layer_memo: dict) -> Estimate:
    """Like estimate() for a candidate that passed every layout rule and the memory rule (``memory.fits``): plan()'s
    path (``layer_memo``: plan()'s memo for `estimate_time`)."""
    mem = memory.breakdown(cand)
    time = estimate_time(model, cand, cluster, training, topology, params, layer_memo)
    saved = memory.total_bytes(replace(cand, offload="")) - mem.total_bytes if cand.offload else 0.0
    opt_saved, opt_added = 0.0, 0.0
    if cand.opt_offload:
        without = replace(cand, opt_offload=0.0)
        opt_saved = memory.total_bytes(without) - mem.total_bytes
        opt_added = time.step_time_s - estimate_time(model, without, cluster, training, topology, params,
                                                     layer_memo).step_time_s
    return Estimate(candidate=cand, memory=mem, time=time, throughput=throughput(model, cand, cluster, training, time),
                    advice=tuple(memory_advice(mem, cluster, training)), offload_saved_bytes=saved,
                    opt_offload_saved_bytes=opt_saved, opt_offload_added_s=opt_added,
                    host_gb_per_node=_host_gb(model, cand, cluster, training, memory))


def _host_gb(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
             memory: PlanMemory | None = None) -> float | None:
    """`Estimate.host_gb_per_node`: a node's pinned host memory for its offloads, GB; None without an offload."""
    if not (cand.offload or cand.opt_offload or training.activation_offload or training.optimizer_offload):
        return None
    per_gpu = memory.host_offload_bytes(cand) if memory else host_offload_bytes(model, cand, cluster, training)
    return per_gpu * cluster.gpus_per_node / 1e9


def _memory_example(cand: Candidate, memory: PlanMemory) -> tuple[Candidate, Violation]:
    """A candidate that passed every layout rule but not the memory rule, with the rule's words (which need the
    breakdown: `plan` builds them for its example only)."""
    return cand, memory_violations(memory.breakdown(cand), memory.cluster, memory.training)[0]


def _survivors_of_shared_rules(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, knobs: dict,
                               checker: Checker, pruned: Counter, examples: dict, *, keep_rampup: bool):
    """`enumerate_candidates`' product in its order, row by row (one TP, PP, CP, MBS, recompute, ZeRO, SP, VPP, hybrid:
    its candidates differ only in EP/ETP). A group (one TP, PP, CP, MBS) broken by a rule on its degrees or batches,
    which all its candidates share, or a row broken by a redundancy or framework rule, which read no EP/ETP, is counted
    under that rule (with its first candidate as the example, as one by one would) and yielded as its size; a row that
    passes them is yielded as a `_Row`, its candidates not built. ``keep_rampup``: the candidates of groups broken only
    by the rampup are yielded one by one (`plan`'s free_best scores them without the rampup). Groups whose rows read
    alike (`_RowOutcome`) are answered from the first one's outcome, in the same order, when every reason it counts
    has its example already."""
    outcomes: dict[tuple, _RowOutcome] = {}
    for group in enumerate_groups(model, cluster.world_size, cluster.domain_gpus, training, knobs):
        size = group.size
        if not size:
            continue
        first_cand = group.first()
        v = checker.shared(first_cand)
        if keep_rampup and v is not None and v.reason is Reason.RAMPUP:
            yield from group.candidates()
            continue
        if v is None:   # then per row (one recompute, ZeRO, SP, VPP, hybrid): the rules that read no EP/ETP
            group_key = checker.group_key(group.tp, group.pp, group.dp, group.cp, group.gas)
            signature = (group_key, group.recompute, group.zero, group.sp, group.vpp, group.hybrid,
                         len(group.ep_etps), len(group.ep_no_sp))
            seen = outcomes.get(signature)
            if seen is not None and all(reason in examples for reason, _ in seen.counts):
                for reason, n in seen.counts:
                    pruned[reason] += n
                for before, fields in seen.passing:   # the rows between, counted; each passing row as the first saw it
                    if before:
                        yield before
                    eps = group.ep_etps if fields[2] else group.ep_no_sp
                    yield _Row(group, (*fields, eps), group.make(*fields, *eps[0]))
                if seen.tail:
                    yield seen.tail
                continue
            counts: Counter[Reason] = Counter()
            passing, run = [], 0
            for row in group.rows():
                recompute, zero, sp, vpp, hybrid, eps = row
                if not eps:
                    continue
                known, w = checker.row_known(checker.row_key(group_key, recompute, zero, sp, vpp, hybrid))
                if known and w is not None and w.reason in examples:   # broken like a row seen before: counted,
                    pruned[w.reason] += len(eps)                         # no candidate built
                    counts[w.reason] += len(eps)
                    run += len(eps)
                    yield len(eps)
                    continue
                head = group.make(recompute, zero, sp, vpp, hybrid, *eps[0])
                if not known:
                    w = checker.row(head)
                if w is None:
                    passing.append((run, row[:5]))
                    run = 0
                    yield _Row(group, row, head)
                    continue
                pruned[w.reason] += len(eps)
                counts[w.reason] += len(eps)
                run += len(eps)
                if w.reason not in examples:
                    examples[w.reason] = (head, w)
                yield len(eps)
            outcomes[signature] = _RowOutcome(tuple(counts.items()), tuple(passing), run)
            continue
        pruned[v.reason] += size
        if v.reason not in examples:
            examples[v.reason] = (first_cand, v)
        yield size


@dataclass(frozen=True, slots=True)
class _RowOutcome:
    """How the rows of a group that passed the shared rules fared (`_survivors_of_shared_rules`): the same for every
    group with the same `Checker.group_key`, knob values and EP/ETP counts, whose rows have the same `Checker.row_key`s
    in the same order and as many candidates each."""

    counts: tuple[tuple[Reason, int], ...]
    """the candidates of the rows a rule broke, by reason"""
    passing: tuple[tuple[int, tuple], ...]
    """each row that passed, in order: (the candidates of the broken rows since the one before, its recompute, ZeRO,
    SP, VPP and hybrid)"""
    tail: int
    """the candidates of the broken rows after the last that passed"""


@dataclass(frozen=True, slots=True)
class _Row:
    """A row of a `planner.enumeration.Group` that passed every rule but the CP / EP / FP8 ones: its candidates differ only
    in (EP, ETP), ``row[5]``; ``head`` is the first."""

    group: Group
    row: tuple
    head: Candidate

    @property
    def eps(self) -> tuple[tuple[int, int], ...]:
        return self.row[5]

    def candidate(self, i: int, recompute: str | None = None) -> Candidate:
        """The row's ``i``-th candidate (``eps[i]``), with ``recompute`` instead of the row's when given."""
        if recompute is None or recompute == self.row[0]:
            return self.head if i == 0 else self.group.make(*self.row[:5], *self.row[5][i])
        return self.group.make(recompute, *self.row[1:5], *self.row[5][i])


_UNWORDED_MEMORY = Violation(Reason.MEMORY_TOTAL, "")
"""`partial_mode`'s reason when no N fits: `_memory_example` words it (plan() for its one example only)"""


def _fits_none(recompute: str) -> bool:
    """`PlanMemory.fits_under` of a candidate whose model states leave no room (`PlanMemory.leave_room`)."""
    return False


def smallest_partial(model: ModelSpec, cand: Candidate, memory: PlanMemory, framework: str,
                     ) -> tuple[Candidate, Violation | None]:
    """``cand`` (recompute ``block`` or ``uniform``, no N) at the smallest N that fits: a larger N only re-runs more
    of the forward (block) or holds more layers at once (uniform). block-N's memory falls as N grows (each
    checkpointed layer keeps its input only), so N is bisected over 1 .. chunk-1 (chunk: full). Ruled out, with the
    candidate and the reason, when a cheaper mode fits already (none for block, full for uniform) or nothing does."""
    mode, why = partial_mode(model, cand, memory, framework)
    if mode != cand.recompute:
        cand = replace(cand, recompute=mode)
    return (cand, _memory_example(cand, memory)[1]) if why is _UNWORDED_MEMORY else (cand, why)


@dataclass(frozen=True, slots=True)
class PartialSearch:
    """What `partial_mode` tries for one recompute kind (``block``, ``uniform``, ``modules``) on one PP and VPP:
    built once per row by plan() (a row's candidates differ only in EP and ETP), its words once with it."""

    kind: str
    cheaper: str
    """the mode whose fit makes the search redundant (none for block and modules, full for uniform)"""
    modes: tuple[str, ...]
    """the modes tried, in order: block-1 .. block-(chunk-1), uniform-2 .. uniform-chunk, the model's module sets"""
    redundant: Violation
    """the reason when ``cheaper`` fits already"""
    empty: Violation | None
    """the reason when ``modes`` is empty (None: it is not)"""


def partial_search(model: ModelSpec, cand: Candidate, framework: str) -> PartialSearch:
    """`partial_mode`'s modes and words for ``cand``'s recompute kind, PP and VPP."""
    kind = cand.recompute
    if kind == "modules":   # Megatron's --recompute-modules: the first of MODULE_SETS the model has that fits
        sets = tuple(recompute_modes.module_sets(model))
        return PartialSearch(kind, "none", sets, Violation(
            Reason.REDUNDANT, "recompute=none fits already: module recompute would only re-run more of the forward"),
            None if sets else Violation(Reason.MODEL_FEATURE, f"{model.name} has none of the modules plan recomputes"))
    chunk = recompute_modes.chunk_layers(model, cand.pp, cand.vpp, framework)
    cheaper = "none" if kind == "block" else "full"
    ns = range(1, chunk) if kind == "block" else range(2, chunk + 1)
    return PartialSearch(kind, cheaper, tuple(f"{kind}-{n}" for n in ns), Violation(
        Reason.REDUNDANT, f"recompute={cheaper} fits already: {kind} recompute would only re-run more of the forward"),
        None if ns else Violation(Reason.REDUNDANT, f"{chunk}-layer model chunks: {kind} recompute is full recompute"))


def partial_mode(model: ModelSpec, cand: Candidate, memory: PlanMemory, framework: str,
                 ep_etp: tuple[int, int] | None = None, fits: Callable[[str], bool] | None = None,
                 search: PartialSearch | None = None, cheaper_fits: bool | None = None) -> tuple[str, Violation | None]:
    """`smallest_partial`'s recompute mode for ``cand`` (with EP, ETP ``ep_etp`` when given: plan() builds no
    candidate it tries), and why it is ruled out (`_UNWORDED_MEMORY` when no N fits). ``fits``: ``memory.fits_under(
    cand, ep_etp)`` when the caller has it (plan() makes it from the states and dynamic memory it looks up per row);
    ``search``: `partial_search` of ``cand`` when the caller has it (plan(): one per row); ``cheaper_fits``:
    ``fits(search.cheaper)`` when the caller has it (plan(): `PlanMemory.row_fits` of the row under that mode)."""
    if fits is None:
        fits = memory.fits_under(cand, ep_etp)
    if search is None:
        search = partial_search(model, cand, framework)
    kind, modes = search.kind, search.modes
    if fits(search.cheaper) if cheaper_fits is None else cheaper_fits:
        return kind, search.redundant
    if kind == "block":
        # the first index whose N fits (len: none); none fits when the largest N does not (memory falls with N)
        lo, hi = (0, len(modes) - 1) if modes and fits(modes[-1]) else (len(modes), len(modes))
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(modes[mid]):
                hi = mid
            else:
                lo = mid + 1
        found = modes[lo] if lo < len(modes) else None
    else:   # uniform-N's memory is not monotone in N (fewer inputs kept, more layers re-run at once); module sets
        found = next((m for m in modes if fits(m)), None)   # in MODULE_SETS' order
    if found is None:
        if not modes:
            return ("modules" if kind == "modules" else f"{kind}-1"), search.empty
        return modes[-1], _UNWORDED_MEMORY
    return found, None


def rank_key(e: Estimate) -> tuple:
    """Model TFLOPs first; ties (same to 0.1%) toward less memory, then fewer GPUs per replica."""
    assert e.throughput is not None and e.memory is not None
    return (-_bucket(e.throughput.model_tflops_per_gpu), e.memory.total_bytes, e.candidate.tp * e.candidate.pp)


def _bucket(tflops: float) -> int:
    """`rank_key`'s TFLOPs, in 0.1% buckets (a rounding of a monotone function: never smaller for more TFLOPs)."""
    return round(math.log(max(tflops, 1e-12)) / math.log(1.001))


def _best(pending: list[tuple[int, Candidate]], keep: int | None, score: Callable[[Candidate], Estimate],
          ceilings: Callable[[list[Candidate]], list[float]], group: Callable[[Candidate], tuple],
          found: tuple[tuple[tuple, Estimate], ...] = ()) -> list[tuple[tuple, Estimate]]:
    """The ``keep`` best (every one when None) of ``found`` ((rank_key, enumeration index), estimate) and of
    ``pending`` ((enumeration index, candidate), not scored), as ((rank_key, index), estimate) best first: plan()'s
    stable sort by `rank_key`. With ``keep``, pending candidates are scored highest TFLOPs ceiling first
    (``ceilings`` of the candidates of one ``group`` key, in their order), until the next one's ceiling
    falls in a lower `_bucket` than the keep-th best's TFLOPs: that one and those after it cannot rank among the
    ``keep`` (rank_key leads with the bucket), so they are never scored."""
    if keep is None or len(pending) + len(found) <= keep:
        best = list(found) + [((rank_key(est), i), est) for i, est in ((i, score(c)) for i, c in pending)]
        best.sort(key=lambda entry: entry[0])
        return best
    members: dict[tuple, list[tuple[int, Candidate]]] = {}
    for entry in pending:
        key = group(entry[1])
        held = members.get(key)
        if held is None:
            members[key] = [entry]
        else:
            held.append(entry)
    ranked = []   # (rank_key's first field at the ceiling, -inf without a bound; index; candidate)
    firsts: dict[float, float] = {}
    for key, held in members.items():
        for (i, cand), most in zip(held, ceilings([c for _, c in held])):
            top = firsts.get(most)
            if top is None:
                top = firsts[most] = -_bucket(most) if math.isfinite(most) else -math.inf
            ranked.append((top, i, cand))
    ranked.sort()
    best = sorted(found, key=lambda entry: entry[0])[:keep]
    for top, i, cand in ranked:
        if len(best) == keep and top > best[-1][0][0][0]:   # its bucket is below the keep-th best's
            break
        est = score(cand)
        entry = ((rank_key(est), i), est)
        if len(best) < keep or entry[0] < best[-1][0]:
            bisect.insort(best, entry, key=lambda e: e[0])
            del best[keep:]
    return best


@contextlib.contextmanager
def _collector_paused():
    """CPython's cyclic garbage collector off while a plan is built: the plan allocates a few hundred thousand
    objects, none of them in a cycle (reference counting frees them), and each collection of the oldest generation
    walks every live one (10-20% of a large plan's time: Mixtral-8x22B at 64K tokens on 1,024 H100). Back on after,
    if it was on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
         params: CostParams = CostParams(), allow_empty: bool = False,
         targets: Target | tuple[Target, ...] | None = None, free_best: bool = False, keep: int | None = None) -> Plan:
    """Enumerate, prune with reasons, score and rank. Raises DoesNotFitError when nothing fits.

    ``targets``: what every survivor must run on (default: the training's framework and flavour);
    `tune` adds the torch-native probe and an ``--emit`` target, so that nothing it measures is unemittable.
    ``free_best``: also find the best layout without the rampup rule (`Plan.free_best`, for the rampup
    schedule) in the same pass: the rampup rule is the only one the two plans differ in, so the rampup-free
    survivors are this plan's survivors plus the candidates whose first broken rule is the rampup and that pass
    every later rule and fit; ties break in enumeration order, as `plan()`'s stable sort does.
    ``keep``: only the best ``keep`` survivors are wanted (`plan` prints its top rows): `Plan.candidates` holds those,
    ranked as in the whole plan, and `Plan.survivors` counts every survivor. Under the default ``params`` the others
    are then not scored when their compute alone bounds them out of the top rows (`_best`); every count, reason and
    example is the same.
    """
    with _collector_paused():
        return _plan(model, cluster, training, params=params, allow_empty=allow_empty, targets=targets,
                     free_best=free_best, keep=keep)


def _plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *, params: CostParams, allow_empty: bool,
          targets: Target | tuple[Target, ...] | None, free_best: bool, keep: int | None) -> Plan:
    """`plan`'s pass, the collector paused."""
    model = prepare(model, training)
    targets = (target_of(training),) if targets is None else (targets,) if isinstance(targets, Target) \
        else tuple(targets)
    topology = Topology(cluster)
    pruned: Counter[Reason] = Counter()
    examples: dict[Reason, tuple[Candidate, Violation]] = {}
    survivors: list[tuple[int, Candidate]] = []   # (enumeration index, candidate), scored at the end (`_best`)
    free_only: list[tuple[int, Candidate]] = []   # the rampup-free plan's survivors that this plan rules out
    total = 0
    knobs = knob_values(targets[0], training)
    checker = Checker(model, cluster, training, targets)
    memory = PlanMemory(model, cluster, training)
    layer_memo: dict[tuple, object] = {}   # planner.cost's memo for this plan: op lists, busiest stages, terms
    searches: dict[tuple, PartialSearch] = {}   # `partial_search` by what it reads: recompute kind, PP, VPP
    no_room: dict[tuple, tuple[str, Violation | None]] = {}   # `partial_mode` where nothing fits, by the same
    partials: dict[tuple, tuple[str, Violation | None]] = {}   # `partial_mode` by what it reads (see the loop)
    megatron_only = all(t.framework == "megatron-lm" for t in targets)
    offload_sets = offload.searched_sets(model, training) if megatron_only else ()
    opt_fractions = offload.optimizer_searched(model, training) if megatron_only and offload.optimizer_searched_where(
        cluster) else ()
    host_checked = bool(training.activation_offload or training.optimizer_offload) and \
        cluster.host_memory_bytes is not None   # the user's offloads: every layout's host memory (planner.rules)
    free = Checker(model, cluster, replace(training, rampup=None), targets) \
        if free_best and training.rampup is not None else None
    for item in _survivors_of_shared_rules(model, cluster, training, knobs, checker, pruned, examples,
                                           keep_rampup=free is not None):
        if type(item) is int:   # a group or row ruled out whole by a rule they share: counted, never built
            total += item
            continue
        if type(item) is Candidate:   # of a group broken by the rampup alone: counted, and scored without the rampup
            total += 1
            first = checker.first(item)
            pruned[first.reason] += 1
            examples.setdefault(first.reason, (item, first))
            if item.recompute in recompute_modes.SEARCHED:
                mode, why = partial_mode(model, item, memory, training.framework)
                if why is not None:
                    continue
                item = replace(item, recompute=mode)
            if free.first(item) is None and memory.fits(item):
                free_only.append((total, item))
            continue
        head, eps = item.head, item.eps   # a row: the CP / EP / FP8 rules and memory of each (EP, ETP) before its
        extras = checker.row_extras(head, eps)   # candidate is built
        if head.recompute in recompute_modes.SEARCHED:   # block / uniform / modules: each at its smallest that fits
            by_mode, row = memory.dynamic_by_mode(head), memory.row(head, eps)
            room, by_mode_id = memory.row_room(head, eps, row), id(by_mode)
            search_key = (head.recompute, head.pp, head.vpp)
            search = searches.get(search_key)
            if search is None:
                search = searches[search_key] = partial_search(model, head, training.framework)
                # where the model states leave no room, no mode fits: `partial_mode`'s answer then, once per search
                no_room[search_key] = partial_mode(model, head, memory, training.framework, None, _fits_none, search)
            none_fits, cheaper = no_room[search_key], None
            for i, (ep, etp) in enumerate(eps):
                total += 1
                mode, first = head.recompute, extras[i]
                if first is None and not room[i]:   # no dynamic memory asked
                    mode, first = none_fits
                elif first is None:
                    if cheaper is None:   # `partial_mode`'s first test, once per row's values
                        cheaper = memory.row_fits(head, eps, row, recompute=search.cheaper)
                    # `partial_mode` reads of the candidate its states' values, its dynamic memory by mode and its
                    # search: answered once for each (by_mode lives as long as the plan's PlanMemory, so its id does)
                    partial_key = (row.numbers[i], by_mode_id, head.recompute)
                    found = partials.get(partial_key)
                    if found is None:
                        found = partials[partial_key] = partial_mode(
                            model, head, memory, training.framework, (ep, etp),
                            memory.fits_under_states(head, row.states[i], by_mode), search, cheaper[i])
                    mode, first = found
                    if first is None and mode != head.recompute:   # the resolved modules against the rules too
                        first = checker.extras(head, ep, etp, mode)   # (e.g. moe + CUDA graphs)
                if first is None and host_checked:   # the user's offloads against the node's host memory
                    first = next(iter(host_memory_of(memory.host_offload_bytes(item.candidate(i, mode)), cluster)),
                                 None)
                if first is not None:
                    pruned[first.reason] += 1
                    if first.reason not in examples:
                        cand = item.candidate(i, mode)
                        examples[first.reason] = _memory_example(cand, memory) if first is _UNWORDED_MEMORY \
                            else (cand, first)
                    continue
                survivors.append((total, item.candidate(i, mode)))
            continue
        row = memory.row(head, eps)
        fits, states = memory.row_fits(head, eps, row), row.states
        opt_room = memory.row_fits_optimizer_off(head, eps, row) if opt_fractions and not all(fits) \
            and offload.optimizer_searched_on(head.zero) else None   # where the optimizer offload could fit it
        most = None   # the row's dynamic memory under the largest offload set, once asked
        # where the states alone fit, and where the largest offload set lets each candidate fit, and the bound of both
        # offloads at once: `offload_fitting`'s and `both_offloads_fitting`'s first tests, once per row's values
        states_fit = most_fits = both_room = None
        if not any(fits) and (opt_room is None or not any(opt_room)) and \
                (not offload_sets or head.recompute != "none") and extras.count(None) == len(eps):
            # the whole row ruled out by memory: none fits as laid out, no optimizer offload could fit one, and no
            # activation offload is searched (`offload.searched_on` needs recompute none): the loop below's outcome
            # for each candidate, counted at once (its example, if the first, is the row's first candidate)
            total += len(eps)
            pruned[Reason.MEMORY_TOTAL] += len(eps)
            if Reason.MEMORY_TOTAL not in examples:
                examples[Reason.MEMORY_TOTAL] = _memory_example(item.candidate(0), memory)
            continue
        for i, (ep, etp) in enumerate(eps):
            total += 1
            first = extras[i]
            cand = None
            if first is not None:
                pruned[first.reason] += 1
                if first.reason not in examples:
                    examples[first.reason] = (item.candidate(i), first)
            elif not fits[i]:
                # activation offload, searched where nothing else lets the layout fit (planner.offload.SEARCHED_SETS)
                searched = offload_sets and offload.searched_on(head.recompute, ep, etp, cluster.gpus_per_node)
                if searched and states_fit is None:
                    states_fit = memory.row_states_fit(head, eps, row)
                    most_fits = memory.row_fits(head, eps, row, offload_sets[-1])
                modules = None
                if searched and states_fit[i] and most_fits[i]:
                    if most is None:
                        most = memory.dynamic_offloaded(head, offload_sets[-1])
                    modules = memory.offload_fitting(head, ep, etp, offload_sets, states[i], most)
                cand = replace(item.candidate(i), offload=modules) if modules else None
                if cand is None and opt_room is not None and opt_room[i]:
                    # else CPU optimizer offload, the smallest fraction that fits (planner.offload.OPTIMIZER_FRACTIONS)
                    fraction = memory.optimizer_offload_fitting(head, ep, etp, opt_fractions)
                    cand = replace(item.candidate(i), opt_offload=fraction) if fraction else None
                if cand is None and modules is None and opt_fractions and searched and \
                        offload.optimizer_searched_on(head.zero):
                    # else both at once, the smallest fraction first (planner.memory.PlanMemory.both_offloads_fitting)
                    if both_room is None:
                        both_room = memory.row_fits_optimizer_off(head, eps, row, offload_sets[-1])
                    pair = None
                    if both_room[i]:
                        if most is None:
                            most = memory.dynamic_offloaded(head, offload_sets[-1])
                        pair = memory.both_offloads_fitting(head, ep, etp, offload_sets, opt_fractions, states[i],
                                                            most)
                    cand = replace(item.candidate(i), offload=pair[0], opt_offload=pair[1]) if pair else None
                if cand is not None and cluster.host_memory_bytes is not None:
                    host = host_memory_of(memory.host_offload_bytes(cand), cluster)
                    if host:   # the node's host memory cannot hold what it offloads
                        pruned[Reason.HOST_MEMORY] += 1
                        examples.setdefault(Reason.HOST_MEMORY, (cand, host[0]))
                        continue
                if cand is None:
                    pruned[Reason.MEMORY_TOTAL] += 1
                    if Reason.MEMORY_TOTAL not in examples:
                        examples[Reason.MEMORY_TOTAL] = _memory_example(item.candidate(i), memory)
            else:
                cand = item.candidate(i)
                if host_checked:
                    host = host_memory_of(memory.host_offload_bytes(cand), cluster)
                    if host:
                        pruned[Reason.HOST_MEMORY] += 1
                        examples.setdefault(Reason.HOST_MEMORY, (cand, host[0]))
                        continue
            if cand is not None:
                survivors.append((total, cand))

    def score(cand: Candidate) -> Estimate:
        return _score(model, cluster, training, cand, topology, params, memory, layer_memo)

    def ceilings(cands: list[Candidate]) -> list[float]:
        return tflops_ceilings(model, cands, cluster, training, layer_memo)
    bounded = params == CostParams()   # the ceiling holds under the default efficiencies only
    best = _best(survivors, keep if bounded else None, score, ceilings, ceiling_group)[:keep]
    best_free = _best(free_only, 1 if bounded else None, score, ceilings, ceiling_group, found=tuple(best[:1]))[0] \
        if free_best and (best or free_only) else None
    if not survivors and not allow_empty:
        raise DoesNotFitError(_no_fit_message(model, cluster, training, pruned, targets))
    return Plan(model=model, cluster=cluster, training=training, candidates=[replace(e, rank=i + 1) for i, (_, e) in
                                                                            enumerate(best)],
                survivors=len(survivors), pruned=dict(pruned), examples=examples, total=total, targets=targets,
                free_best=None if best_free is None else replace(best_free[1], rank=1))


def min_gpus_to_fit(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    targets: tuple[Target, ...] | None = None) -> int | None:
    """Smallest whole number of nodes on which some configuration fits (by doubling, then bisection)."""
    def fits(nodes: int) -> bool:
        c = make_cluster(gpu=cluster.gpu, nodes=nodes, gpus_per_node=cluster.gpus_per_node,
                         inter_node_gbps=cluster.inter_node_bw_bytes_per_s * 8 / 1e9,
                         intra_node_gbps=cluster.intra_node_bw_bytes_per_s * 8 / 1e9,
                         nvlink_domain=cluster.nvlink_domain)
        t = replace(training, rampup=None, recompute_options=("full",), max_mbs=1, pins=())
        probe = plan(model, c, t, allow_empty=True, targets=targets)
        return bool(probe.candidates)

    nodes = cluster.nodes * 2
    while nodes <= 8192 and not fits(nodes):
        nodes *= 2
    if nodes > 8192:
        return None
    lo, hi = nodes // 2, nodes
    while hi - lo > 1 and hi > cluster.nodes:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi * cluster.gpus_per_node


def _no_fit_message(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, pruned: Counter,
                    targets: tuple[Target, ...]) -> str:
    memory = pruned.get(Reason.MEMORY_TOTAL, 0)
    if memory:
        need = min_gpus_to_fit(model, cluster, training, targets)
        more = f"it needs about {need} {cluster.gpu.id} GPUs" if need else "no cluster size up to 8192 nodes fits it"
        return (f"{model.name} ({model.params / 1e9:.1f}B params) does not fit on {cluster.world_size} "
                f"{cluster.gpu.id}: {more}; add GPUs, use a larger GPU, or allow more sharding/recompute")
    top = ", ".join(f"{r.value} ({n})" for r, n in pruned.most_common(3))
    return (f"no configuration of {model.name} on {cluster.world_size} GPUs passes the rules (most common: {top}); "
            "change --global-batch, --rampup or the GPU count")
