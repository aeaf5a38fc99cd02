"""The one table of a layout's dimensions (planner.space.DIMENSIONS) is what Candidate holds, and what the label,
--explain, the JSON row and tune's study read."""

from __future__ import annotations

from dataclasses import fields

from planner.rank import Estimate
from planner.space import DIMENSIONS, Candidate, parse_explain
from search.space import LOG2_PARAMS, PARAMS


def test_the_table_is_candidates_fields():
    assert [d.name for d in DIMENSIONS] == [f.name for f in fields(Candidate)]
    defaults = {f.name: f.default for f in fields(Candidate)}
    for d in DIMENSIONS:
        assert d.default is None or d.default == defaults[d.name], d.name


def test_label_and_explain_read_it_both_ways():
    """Every dimension set away from its default shows in the label, and --explain reads the label back."""
    c = Candidate(tp=4, pp=12, dp=2, mbs=2, gas=16, recompute="full", zero=1, sp=True, vpp=2, hybrid=True, cp=2,
                  ep=4, etp=2, offload="expert_fc1+moe_act", opt_offload=0.5)
    label = c.label()
    assert [part.split("=")[0] for part in label.split(",")] == [d.name for d in DIMENSIONS]
    assert parse_explain(label, world=c.world, global_batch=c.global_batch) == c
    plain = Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1)
    assert plain.label() == "tp=1,pp=1,dp=8,mbs=1,gas=1,recompute=none,zero=0"


def test_json_row_and_study_params_follow_it():
    c = Candidate(tp=2, pp=1, dp=4, mbs=1, gas=2, ep=2)
    row = Estimate(candidate=c).to_dict()
    assert list(row)[:len(DIMENSIONS)] == [d.name for d in DIMENSIONS]
    assert set(PARAMS) == {d.name for d in DIMENSIONS} - {"dp", "gas"}
    assert set(LOG2_PARAMS) <= set(PARAMS)
