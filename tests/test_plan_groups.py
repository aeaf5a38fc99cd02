"""`plan` counts a group of candidates ruled out by a shared rule without building them: the same totals, reasons,
examples and ranking as checking every candidate of the plain product one by one."""

from __future__ import annotations

from collections import Counter

import pytest

from planner.hardware import make_cluster
from planner.model import get_preset
from planner.rank import plan, prepare
from planner.rules import Checker, Reason, knob_values, target_of
from planner.enumeration import enumerate_candidates, enumerate_groups
from planner.space import TrainingSpec

CASES = [  # (model, GPUs, GPU, training)
    ("176B", 384, "A100-80GB", dict(global_batch=2048, seq_len=2048, flash_attention=False)),
    ("mixtral-8x7b", 256, "H100", dict(global_batch=256, seq_len=4096, framework="megatron-lm")),
    ("llama3-8b", 64, "H100", dict(global_batch=512, seq_len=32768, framework="megatron-lm", precision="fp8")),
    ("llama3-8b", 64, "A100-80GB", dict(global_batch=512, seq_len=8192, framework="fsdp")),
]


def _one_by_one(model, cluster, training):
    """What plan() counted before groups: every candidate's first layout rule."""
    model = prepare(model, training)
    target = target_of(training)
    checker = Checker(model, cluster, training, (target,))
    firsts, examples = Counter(), {}
    cands = list(enumerate_candidates(model, cluster.world_size, cluster.gpus_per_node, training,
                                      knob_values(target, training)))
    for c in cands:
        v = checker.first(c)
        if v is not None:
            firsts[v.reason] += 1
            examples.setdefault(v.reason, (c, v))
    return cands, firsts, examples


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES)
def test_groups_hold_one_degree_and_batch_each_and_no_layout_twice(name, gpus, gpu, kw):
    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    model = prepare(model, training)
    knobs = knob_values(target_of(training), training)
    groups = list(enumerate_groups(model, gpus, cluster.gpus_per_node, training, knobs))
    flat = [c for g in groups for c in g.candidates()]
    assert len(flat) == len(set(flat))                       # no layout twice
    for g in groups:                                         # a group is one (TP, PP, CP, MBS) with one DP and GAS
        members = list(g.candidates())
        assert len({(c.tp, c.pp, c.cp, c.mbs, c.dp, c.gas) for c in members}) == 1
        assert all(c.world == gpus for c in members)
    assert [g.size for g in groups] == [len(list(g.candidates())) for g in groups]


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES)
def test_plan_counts_every_candidate_with_its_first_reason(name, gpus, gpu, kw):
    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    p = plan(model, cluster, training, allow_empty=True)
    cands, firsts, examples = _one_by_one(model, cluster, training)
    assert p.total == len(cands)
    scored = len(cands) - sum(firsts.values())   # the candidates that reach the memory model
    assert set(p.pruned) - set(firsts) <= {Reason.MEMORY_TOTAL}
    assert len(p.candidates) + p.pruned.get(Reason.MEMORY_TOTAL, 0) == scored
    for reason, n in firsts.items():
        assert p.pruned[reason] == n
        assert p.examples[reason][0] == examples[reason][0]


@pytest.fixture(scope="module")
def whole_plans():
    """Each case's whole plan (free_best), built once for the module: the `keep` parametrizations compare with it."""
    return {}


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES + [
    ("mixtral-8x7b", 64, "H100", dict(global_batch=256, seq_len=4096, framework="megatron-lm",
                                      recompute_options=("none", "selective", "full", "block", "modules"))),
    # DualPipe's bubble and stage compute, and layouts that fit by the activation offload search (4 of 78 survivors)
    ("deepseek-v3", 256, "H100-SXM", dict(global_batch=1024, seq_len=4096, framework="megatron-lm",
                                          pp_schedule="DualPipe"))])
@pytest.mark.parametrize("keep", [1, 3, 10])
def test_plan_keeping_its_top_rows_ranks_them_as_the_whole_plan(name, gpus, gpu, kw, keep, monkeypatch, whole_plans):
    """plan(keep=N) (what `plan` prints) is the whole plan's first N rows, counts, reasons, examples and free_best,
    with fewer candidates scored in full: those whose compute alone keeps them out of the top rows are not."""
    import planner.rank as rank

    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    key = repr((name, gpus, gpu, kw))
    if key not in whole_plans:
        whole_plans[key] = plan(model, cluster, training, allow_empty=True, free_best=True)
    whole = whole_plans[key]
    scored = []
    score = rank._score
    monkeypatch.setattr(rank, "_score", lambda *a, **k: scored.append(a[3]) or score(*a, **k))
    top = plan(model, cluster, training, allow_empty=True, free_best=True, keep=keep)
    assert repr(top.candidates) == repr(whole.candidates[:keep])
    assert (top.survivors, top.total, top.pruned, top.examples) == (len(whole.candidates), whole.total, whole.pruned,
                                                                    whole.examples)
    assert repr(top.free_best) == repr(whole.free_best)
    assert top.to_dict(keep) == whole.to_dict(keep)
    if name.startswith("mixtral"):   # (BLOOM's DeepSpeed pipeline: its compute alone bounds none out)
        assert len(scored) < len(whole.candidates)


def test_plan_keeping_its_top_rows_under_fitted_params_scores_them_all():
    """The compute-only ceiling holds under the default CostParams: under tune's refit ones plan(keep=N) scores every
    survivor, and its rows are still the whole plan's first N."""
    from planner.cost import CostParams

    name, gpus, gpu, kw = CASES[1]
    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    params = CostParams(compute_scale=0.6, comm_scale=1.7)
    whole = plan(model, cluster, training, params=params, allow_empty=True, free_best=True)
    top = plan(model, cluster, training, params=params, allow_empty=True, free_best=True, keep=4)
    assert repr(top.candidates) == repr(whole.candidates[:4]) and repr(top.free_best) == repr(whole.free_best)
    assert top.survivors == len(whole.candidates) > 4


@pytest.mark.parametrize("name, gpus, gpu, kw", [
    CASES[0],   # BLOOM-176B: DeepSpeed's pipeline engine (bigscience)
    ("175B", 1024, "A100-80GB", dict(global_batch=1536, seq_len=2048, framework="megatron-deepspeed",
                                     flavor="microsoft")),
    CASES[1]])
def test_the_tflops_ceiling_bounds_every_survivor(name, gpus, gpu, kw):
    """`planner.cost.tflops_ceiling` is at least every survivor's model TFLOPs (what plan(keep=N) relies on), under
    DeepSpeed's pipeline engine too, where it counts GAS - 1 slots of the busiest stage and one pass of every stage
    (the engine's bubble); there it bounds some layouts out of Megatron-DeepSpeed 175B's top rows."""
    import planner.rank as rank
    from planner.cost import tflops_ceiling

    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    whole = plan(model, cluster, training, allow_empty=True)
    assert len(whole.candidates) > 10
    memo: dict = {}
    for e in whole.candidates:
        ceiling = tflops_ceiling(prepare(model, training), e.candidate, cluster, training, memo)
        assert ceiling >= e.throughput.model_tflops_per_gpu, e.candidate
    if name == "175B":
        scored = []
        score = rank._score
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(rank, "_score", lambda *a, **k: scored.append(a[3]) or score(*a, **k))
            top = plan(model, cluster, training, allow_empty=True, keep=10)
        assert repr(top.candidates) == repr(whole.candidates[:10]) and len(scored) < len(whole.candidates)


@pytest.mark.parametrize("name, gpus, gpu, kw", [CASES[1], CASES[2]])
def test_megatron_lm_rows_answered_once_per_row_key_name_each_candidate_s_own_rule(name, gpus, gpu, kw):
    """Under Megatron-LM the checker answers a row once per TP == 1, DP x CP == 1 and the rest of its key
    (`Checker.row_key`): on every candidate of the plain product its cached first rule is the rule, words and all,
    that `iter_violations` finds checking that candidate alone."""
    from planner.rules import iter_violations

    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    model = prepare(model, training)
    target = target_of(training)
    checker = Checker(model, cluster, training, (target,))
    shared = set()
    for c in enumerate_candidates(model, cluster.world_size, cluster.gpus_per_node, training,
                                  knob_values(target, training)):
        assert checker.first(c) == next(iter_violations(model, c, cluster, training, (target,)), None), c.label()
        if checker.shared(c) is None:
            shared.add((c.tp, c.dp, c.cp))
    assert len(shared) > 4   # rows of several TP, DP and CP reached the row rules, sharing answers
