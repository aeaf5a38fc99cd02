"""plan(keep=N) ranks its survivors by TFLOPs ceilings computed a `ceiling_group` at a time
(`planner.cost.tflops_ceilings`): the same floats as `tflops_ceiling` candidate by candidate, each at least the
candidate's scored model TFLOPs, and the busiest stages it leaves in plan()'s memo the ones scoring computes."""

from __future__ import annotations

from collections import defaultdict

import pytest

from planner.cost import busiest_stage, ceiling_group, tflops_ceiling, tflops_ceilings
from planner.hardware import make_cluster
from planner.model import get_preset
from planner.rank import plan, prepare
from planner.space import TrainingSpec

CASES = [  # (model, GPUs, GPU, training)
    ("mixtral-8x7b", 256, "H100", dict(global_batch=256, seq_len=4096, framework="megatron-lm")),   # MoE, Megatron
    ("llama3-8b", 64, "H100", dict(global_batch=512, seq_len=32768, framework="megatron-lm", precision="fp8")),
    ("176B", 384, "A100-80GB", dict(global_batch=2048, seq_len=2048, flash_attention=False)),   # DeepSpeed's engine
    ("llama3-8b", 64, "A100-80GB", dict(global_batch=512, seq_len=8192, framework="fsdp",   # a bubble that reads
                                        pp_schedule="InterleavedZeroBubble")),              # the recompute mode
]


@pytest.mark.parametrize("name, gpus, gpu, kw", CASES)
def test_group_ceilings_are_each_candidates_ceiling_and_bound_its_tflops(name, gpus, gpu, kw):
    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    whole = plan(model, cluster, training, allow_empty=True)
    model = prepare(model, training)
    groups = defaultdict(list)
    for e in whole.candidates:
        groups[ceiling_group(e.candidate)].append(e)
    assert len(whole.candidates) > 10 and len(groups) < len(whole.candidates)   # groups of several candidates
    assert any(len({e.candidate.recompute for e in held}) > 1 for held in groups.values())
    memo, alone = {}, {}
    for held in groups.values():
        ceilings = tflops_ceilings(model, [e.candidate for e in held], cluster, training, memo)
        for e, ceiling in zip(held, ceilings, strict=True):
            assert ceiling == tflops_ceiling(model, e.candidate, cluster, training, alone), e.candidate.label()
            assert ceiling >= e.throughput.model_tflops_per_gpu, e.candidate.label()
            # what the ceilings left in the memo for the candidate's score: the stage a fresh memo computes
            assert busiest_stage(model, e.candidate, cluster, training, memo) == \
                busiest_stage(model, e.candidate, cluster, training, {}), e.candidate.label()


def test_plan_keeping_its_top_rows_ranks_as_the_whole_plan():
    """Under the grouped ceilings plan(keep=N)'s rows are the whole plan's first N, and the ceilings bound most of
    Mixtral's survivors out of them unscored."""
    import planner.rank as rank

    name, gpus, gpu, kw = CASES[0]
    model, cluster, training = get_preset(name), make_cluster(gpu=gpu, gpus=gpus), TrainingSpec(**kw)
    whole = plan(model, cluster, training, allow_empty=True)
    scored = []
    score = rank._score
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rank, "_score", lambda *a, **k: scored.append(a[3]) or score(*a, **k))
        top = plan(model, cluster, training, allow_empty=True, keep=5)
    assert repr(top.candidates) == repr(whole.candidates[:5])
    assert top.survivors == len(whole.candidates) and len(scored) < len(whole.candidates) / 2
