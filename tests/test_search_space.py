"""The search space over the planner's survivors and the OOM implication rule (fast, no optuna trials).

    python -m pytest tests/test_search_space.py -q
"""

from __future__ import annotations

import pytest

from planner import Candidate, TrainingSpec, load_model, make_cluster, plan
from search.space import SearchSpace, config_key, distance, needs_more_memory, params_of


def cand(**kw) -> Candidate:
    base = dict(tp=1, pp=2, dp=4, mbs=4, gas=16, recompute="selective", zero=1)
    return Candidate(**{**base, **kw})


OOM = cand()


@pytest.mark.parametrize("other, implied", [
    (cand(mbs=8, gas=8), True),                          # larger MBS
    (cand(recompute="none"), True),                      # less recompute keeps more activations
    (cand(zero=0), True),                                # less sharding
    (cand(mbs=8, gas=8, recompute="none", zero=0), True),
    (cand(), False),                                     # the OOM'd configuration itself
    (cand(mbs=2, gas=32), False),                        # smaller MBS may fit
    (cand(recompute="full"), False),                     # more recompute may fit
    (cand(zero=2), False),                               # more sharding may fit
    (cand(mbs=8, gas=8, recompute="full"), False),       # one dimension better: unknown
    (cand(tp=2, dp=2, mbs=8, gas=16), False),            # another layout
    (cand(pp=4, dp=2, mbs=8, gas=16), False),
    (cand(recompute="selective-op"), False),             # op-level SAC keeps less than selective (the probe measures)
    (cand(recompute="block-1"), False),                  # a partial mode is ordered against no other
])
def test_oom_implication(other, implied):
    assert needs_more_memory(other, than=OOM) is implied


def test_oom_implication_op_level_sac():
    """full < selective-op < selective < none in kept activations (tests/test_probes_op_sac.py measures it)."""
    op = cand(recompute="selective-op")
    assert needs_more_memory(cand(recompute="selective"), than=op)
    assert needs_more_memory(cand(recompute="none"), than=op)
    assert not needs_more_memory(cand(recompute="full"), than=op)
    assert not needs_more_memory(op, than=cand(recompute="block-2"))
    assert needs_more_memory(cand(recompute="block-2", mbs=8, gas=8), than=cand(recompute="block-2"))


def test_oom_implication_sequence_parallel():
    with_sp = cand(tp=2, dp=2, sp=True)
    assert needs_more_memory(cand(tp=2, dp=2, sp=False), than=with_sp)
    assert not needs_more_memory(cand(tp=2, dp=2, sp=True, mbs=8, gas=8), than=cand(tp=2, dp=2, sp=False))


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    p = plan(load_model("1B3"), make_cluster(gpu="V100-32GB", gpus=8, gpus_per_node=4),
             TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", recompute_options=("full", "none"),
                          zero_options=(0, 1)))
    return SearchSpace.from_plan(p)


def test_every_survivor_is_a_point(space):
    assert len(space) == len(space.plan.candidates) > 6
    for e in space.survivors:
        assert space.lookup(params_of(e.candidate)) is e


def test_ruled_out_is_not_a_point(space):
    assert space.lookup({**params_of(space.survivors[0].candidate), "tp": 8}) is None   # TP beyond the node


def test_distributions_cover_the_survivors(space):
    dists = space.distributions()
    for e in space.survivors:
        for name, value in params_of(e.candidate).items():
            assert dists[name]._contains(dists[name].to_internal_repr(value)), (name, value)


def test_nearest_maps_a_ruled_out_proposal_to_a_survivor(space):
    proposal = {**params_of(space.survivors[0].candidate), "tp": 8, "mbs": 3}
    est = space.nearest(proposal, exclude=set())
    assert est is not None and est in space.survivors
    assert distance(proposal, params_of(est.candidate)) > 0


def test_nearest_skips_excluded_and_prefers_rank(space):
    first = space.survivors[0]
    target = params_of(first.candidate)
    assert space.nearest(target, exclude=set()) is first
    other = space.nearest(target, exclude={config_key(first.candidate)})
    assert other is not first and other in space.survivors


def test_restriction(space):
    keep = {config_key(e.candidate) for e in space.survivors[:3]}
    small = SearchSpace.from_plan(space.plan, keep=keep)
    assert set(small.keys) == keep


def test_implied_oom(space):
    survivors = [e.candidate for e in space.survivors]
    # the leanest of the smallest layout (full recompute, most sharding), whatever the ranking order
    small = min(survivors, key=lambda c: (c.mbs, c.tp, c.pp, c.recompute != "full", -c.zero))
    implied = [c for c in survivors if space.implied_oom(c, [small])]
    assert implied and all(c.mbs >= small.mbs and (c.tp, c.pp) == (small.tp, small.pp) for c in implied)
    assert small not in implied


def test_space_keeps_torchtitan_op_level_sac():
    """tune --framework fsdp --recompute none,selective-op,full: selective-op is a point and a sampler value."""
    from search.sampler import grid_order

    p = plan(load_model("1B3"), make_cluster(gpu="V100-32GB", gpus=8, gpus_per_node=4),
             TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", framework="fsdp",
                          recompute_options=("none", "selective-op", "full"), zero_options=(3,)))
    s = SearchSpace.from_plan(p)
    assert s.values("recompute") == ["none", "full", "selective-op"]
    assert sorted(grid_order(s)) == sorted(s.keys)
