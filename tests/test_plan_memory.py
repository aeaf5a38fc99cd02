"""`plan()`'s shortcuts change no result: `PlanMemory` gives `memory_breakdown`'s floats exactly, and `plan()` ranks,
counts and exemplifies as scoring every candidate one by one with `memory_breakdown`, `memory_violations` and
`estimate_time` does."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from planner import offload
from planner.cost import CostParams, estimate_time, throughput
from planner.hardware import make_cluster
from planner.memory import PlanMemory, host_offload_bytes, memory_breakdown
from planner.model import Rampup, get_preset
from planner.rank import Estimate, plan, prepare, rank_key
from planner.rules import (Checker, Reason, host_memory_violations, knob_values, memory_advice, memory_violations,
                           target_of)
from planner.enumeration import enumerate_candidates
from planner.space import Candidate, TrainingSpec, candidate_of
from planner.topology import Topology

CASES = [  # (model, GPUs, GPU, training): PP and not, MoE with EP/ETP, CP, FP8, ZeRO-3/FSDP, DeepSpeed, rampup
    ("mixtral-8x7b", 32, "H100", dict(global_batch=128, seq_len=8192, framework="megatron-lm", max_mbs=4)),
    ("mixtral-8x7b", 32, "H100", dict(global_batch=128, seq_len=8192, framework="megatron-lm", max_mbs=4,
                                      precision="fp8")),
    ("llama3-8b", 16, "H100", dict(global_batch=64, seq_len=32768, framework="megatron-lm", max_mbs=4)),
    ("llama3-8b", 32, "A100-80GB", dict(global_batch=256, seq_len=8192, framework="fsdp")),
    ("1B3", 16, "V100-32GB", dict(global_batch=512, seq_len=2048, precision="fp16", flash_attention=False,
                                  rampup=Rampup(start=32, increment=32, samples=2_000_000))),
    # MoE under CP: PlanMemory keys the model states by DP x CP (the states of one TP and PP whatever the CP), the
    # dynamic memory's parts by the fields each reads
    ("mixtral-8x7b", 16, "H100", dict(global_batch=16, seq_len=32768, framework="megatron-lm", max_mbs=1)),
]


def _setup(name, gpus, gpu, kw):
    training = TrainingSpec(**kw)
    return prepare(get_preset(name), training), make_cluster(gpu=gpu, gpus=gpus), training


def _passing(model, cluster, training):
    """The candidates that pass every layout rule, in enumeration order."""
    target = target_of(training)
    checker = Checker(model, cluster, training, (target,))
    return [c for c in enumerate_candidates(model, cluster.world_size, cluster.gpus_per_node, training,
                                            knob_values(target, training)) if checker.first(c) is None]


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES)
def test_plan_memory_is_memory_breakdown_to_the_last_bit(name, gpus, gpu, kw):
    model, cluster, training = _setup(name, gpus, gpu, kw)
    memory = PlanMemory(model, cluster, training)
    cands = _passing(model, cluster, training)
    assert cands
    for c in cands:
        mem = memory_breakdown(model, c, cluster, training)
        assert memory.breakdown(c) == mem
        assert memory.total_bytes(c) == mem.total_bytes
        assert memory.fits(c) == (not memory_violations(mem, cluster, training))
    head = cands[0]   # a row: one candidate with other (EP, ETP), none of them built by PlanMemory
    eps = ((1, 1), (2, 1), (1, 2), (4, 2))
    assert memory.row_fits(head, eps) == [memory.fits(replace(head, ep=ep, etp=etp)) for ep, etp in eps]
    modes = ("none", "full", "selective", "block-1", "block-3", "uniform-2")   # partial_mode's tries
    for c in cands[:50]:
        fits = [memory.fits(replace(c, recompute=m)) for m in modes]
        assert fits == [not memory_violations(memory_breakdown(model, replace(c, recompute=m), cluster, training),
                                              cluster, training) for m in modes]
        assert [memory.fits_under(c)(m) for m in modes] == fits
        other = replace(c, ep=1, etp=1)   # a row's head with c's (EP, ETP): c not built
        assert [memory.fits_under(other, (c.ep, c.etp))(m) for m in modes] == fits


def _first_fitting(c, mem, reasons, field, values, model, cluster, training):
    """``c`` with the first of ``values`` for ``field`` under which memory fits: (candidate, breakdown, reasons, bytes
    saved); ``c`` as it was when none does."""
    for value in values:
        offloaded = replace(c, **{field: value})
        with_it = memory_breakdown(model, offloaded, cluster, training)
        if not memory_violations(with_it, cluster, training):
            return offloaded, with_it, [], mem.total_bytes - with_it.total_bytes
    return c, mem, reasons, 0.0


def _first_fitting_pair(c, mem, reasons, sets, fractions, model, cluster, training):
    """``c`` with the first (fraction, then module set) under which memory fits with both offloads: (candidate,
    breakdown, reasons, bytes the activation offload saves, bytes the optimizer offload saves), each saving against
    the candidate without that one offload, as `planner.rank.estimate` reports them; ``c`` as it was when none does."""
    for fraction in fractions:
        for modules in sets:
            both = replace(c, offload=modules, opt_offload=fraction)
            with_them = memory_breakdown(model, both, cluster, training)
            if not memory_violations(with_them, cluster, training):
                total = with_them.total_bytes
                return (both, with_them, [],
                        memory_breakdown(model, replace(both, offload=""), cluster, training).total_bytes - total,
                        memory_breakdown(model, replace(both, opt_offload=0.0), cluster, training).total_bytes - total)
    return c, mem, reasons, 0.0, 0.0


def _one_by_one(model, cluster, training):
    """plan() as the plain product scored one candidate at a time."""
    target = target_of(training)
    checker = Checker(model, cluster, training, (target,))
    topology, params = Topology(cluster), CostParams()
    pruned, examples, survivors, total = Counter(), {}, [], 0
    for c in enumerate_candidates(model, cluster.world_size, cluster.gpus_per_node, training,
                                  knob_values(target, training)):
        total += 1
        first = checker.first(c)
        if first is None:
            mem = memory_breakdown(model, c, cluster, training)
            reasons = memory_violations(mem, cluster, training)
            saved = opt_saved = 0.0
            if reasons and offload.searched_on(c.recompute, c.ep, c.etp, cluster.gpus_per_node):
                # the first activation-offload set that fits, if any
                c, mem, reasons, saved = _first_fitting(c, mem, reasons, "offload",
                                                        offload.searched_sets(model, training), model, cluster, training)
            if reasons and offload.optimizer_searched_on(c.zero) and offload.optimizer_searched_where(cluster):
                # else the smallest optimizer fraction that fits
                c, mem, reasons, opt_saved = _first_fitting(c, mem, reasons, "opt_offload",
                                                            offload.optimizer_searched(model, training),
                                                            model, cluster, training)
            if reasons and offload.searched_on(c.recompute, c.ep, c.etp, cluster.gpus_per_node) and \
                    offload.optimizer_searched_on(c.zero) and offload.optimizer_searched_where(cluster):
                # else both at once: the smallest fraction with which a set fits, then the smallest such set
                c, mem, reasons, saved, opt_saved = _first_fitting_pair(
                    c, mem, reasons, offload.searched_sets(model, training),
                    offload.optimizer_searched(model, training), model, cluster, training)
            if not reasons:   # and the node's host memory holds what it offloads
                reasons = host_memory_violations(model, c, cluster, training)
            if not reasons:
                time = estimate_time(model, c, cluster, training, topology, params)
                added = time.step_time_s - estimate_time(model, replace(c, opt_offload=0.0), cluster, training,
                                                         topology, params).step_time_s if c.opt_offload else 0.0
                host = host_offload_bytes(model, c, cluster, training) * cluster.gpus_per_node / 1e9 \
                    if c.offload or c.opt_offload else None
                survivors.append(Estimate(candidate=c, memory=mem, time=time,
                                          throughput=throughput(model, c, cluster, training, time),
                                          advice=tuple(memory_advice(mem, cluster, training)),
                                          offload_saved_bytes=saved, opt_offload_saved_bytes=opt_saved,
                                          opt_offload_added_s=added, host_gb_per_node=host))
                continue
            first = reasons[0]
        pruned[first.reason] += 1
        examples.setdefault(first.reason, (c, first))
    return total, pruned, examples, survivors


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES)
def test_plan_ranks_counts_and_exemplifies_as_one_by_one(name, gpus, gpu, kw):
    model, cluster, training = _setup(name, gpus, gpu, kw)
    p = plan(model, cluster, training, allow_empty=True)
    total, pruned, examples, survivors = _one_by_one(model, cluster, training)
    assert p.total == total
    assert p.pruned == dict(pruned)
    assert p.examples == examples
    assert Reason.MEMORY_TOTAL in p.pruned or training.rampup is not None
    ranked = [replace(e, rank=i + 1) for i, e in enumerate(sorted(survivors, key=rank_key))]   # stable: ties in order
    assert p.candidates == ranked


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES[:3])
def test_row_lookups_answer_as_each_candidate_does(name, gpus, gpu, kw):
    """plan()'s per-row lookups (`Checker.row_extras`, `PlanMemory.row_states`, `offload_fitting` given a row's
    states, `extras` with a resolved recompute mode) answer what each (EP, ETP) of the row asked alone does."""
    model, cluster, training = _setup(name, gpus, gpu, kw)
    target = target_of(training)
    checker, alone = Checker(model, cluster, training, (target,)), Checker(model, cluster, training, (target,))
    memory, fresh = PlanMemory(model, cluster, training), PlanMemory(model, cluster, training)
    eps = ((1, 1), (2, 1), (1, 2), (4, 2), (8, 1))
    cands = _passing(model, cluster, training)[:40]
    assert cands
    for c in cands:
        assert checker.row_extras(c, eps) == tuple(alone.extras(replace(c, ep=ep, etp=etp), ep, etp)
                                                   for ep, etp in eps)
        for mode in ("full", "block-2"):
            assert checker.extras(c, c.ep, c.etp, mode) == alone.extras(replace(c, recompute=mode), c.ep, c.etp)
        states = memory.row_states(c, eps)
        assert states == tuple(fresh.states_of(replace(c, ep=ep, etp=etp), ep, etp) for ep, etp in eps)
        for (ep, etp), s in zip(eps, states):
            assert memory.offload_fitting(c, ep, etp, offload.SEARCHED_SETS, s) == \
                fresh.offload_fitting(replace(c, ep=ep, etp=etp), ep, etp, offload.SEARCHED_SETS)
        # the row-level first tests plan() asks before `offload_fitting` and `both_offloads_fitting`: never False
        # where those find a fit, and each the fit of the candidate built with the largest module set
        most = offload.SEARCHED_SETS[-1]
        states_fit, most_fits = memory.row_states_fit(c, eps), memory.row_fits(c, eps, offload=most)
        both_room = memory.row_fits_optimizer_off(c, eps, offload=most)
        for i, (ep, etp) in enumerate(eps):
            with_ep = replace(c, ep=ep, etp=etp)
            assert most_fits[i] == fresh.fits(replace(with_ep, offload=most))
            if fresh.offload_fitting(with_ep, ep, etp, offload.SEARCHED_SETS) is not None:
                assert states_fit[i] and most_fits[i]
            if fresh.both_offloads_fitting(with_ep, ep, etp, offload.SEARCHED_SETS, (0.25, 0.5, 1.0)) is not None:
                assert both_room[i]


def test_candidate_of_builds_the_candidate_the_dataclass_does():
    """`candidate_of` (plan's fast constructor) gives an object equal, equally hashed, printed and frozen as
    `Candidate(...)` with the same fields, for every field set away from its default."""
    values = dict(tp=2, pp=4, dp=8, mbs=2, gas=16, recompute="block-3", zero=1, sp=True, vpp=2, hybrid=True, cp=2,
                  ep=4, etp=2, offload="attn_norm+mlp_norm", opt_offload=0.5)
    fast, slow = candidate_of(*values.values()), Candidate(**values)
    assert type(fast) is Candidate and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert candidate_of(*list(values.values())[:13]) == Candidate(**{k: values[k] for k in list(values)[:13]})
    with pytest.raises(AttributeError):
        fast.tp = 1


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES[:3] + [
    ("mixtral-8x7b", 32, "H100", dict(global_batch=128, seq_len=8192, framework="megatron-lm", max_mbs=4,
                                      activation_offload=("attn_norm",)))])
def test_no_room_means_no_recompute_mode_fits(name, gpus, gpu, kw):
    """`PlanMemory.leave_room` (plan skips a candidate's recompute search where it is False) is False only where no
    mode fits: every mode of every rule-passing candidate, and with EP 1 (the largest expert states), is asked."""
    model, cluster, training = _setup(name, gpus, gpu, kw)
    memory = PlanMemory(model, cluster, training)
    modes = ("none", "selective", "full", "block-1", "block-2", "modules:moe_act", "modules:moe")
    cands = _passing(model, cluster, training)
    assert cands
    seen = Counter()
    for c in cands:
        for ep, etp in {(c.ep, c.etp), (1, 1)}:
            states = memory.states_of(c, ep, etp)
            room = memory.leave_room(states)
            seen[room] += 1
            if not room:
                assert not any(memory.fits_under(c, (ep, etp))(mode) for mode in modes)
    assert seen[False] or training.activation_offload, "a case where the states leave no room"
