"""`tune` over context- and expert-parallel layouts of a mixture-of-experts model.

    python -m pytest tests/test_tune_moe.py -q                  # fast: parameters, replay, the probe's rules
    python -m pytest tests/test_tune_moe.py -q -m slow          # two CPU tunes (EP 2, CP 2), real gloo probes

A tiny 4-expert top-2 model on 4 CPU "GPUs", planned for Megatron-LM with CP 1/2 and EP 1/2/4: layouts that
differ only in CP or EP must stay separate trials (search.space keys and Optuna parameters), replay must
answer each from its own row (cp/ep columns), and a local tune must plan with the torch probe's rules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from planner import plan
from planner.hardware import make_cluster
from planner.model import load_model
from planner.rules import PROBE, Target, probe_dp_impl
from planner.space import Candidate, TrainingSpec
from probes.layout import resolve_layout
from probes.result import ProbeSpec
from search.cli import main
from search.space import PARAMS, SearchSpace, config_key, params_of

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 3600
"""a local tune that has not ended after this long hangs (it takes a few minutes on 2 busy cores)"""
MOE_YAML = """name: tiny-moe
layers: 4
hidden: 64
heads: 4
kv_heads: 4
ffn_hidden: 128
vocab: 128
seq_len: 64
tied_embeddings: false
num_experts: 4
moe_topk: 2
"""
SETUP = ["--gpu", "CPU", "--gpus", "4", "--gpus-per-node", "4", "--global-batch", "8", "--seq-len", "64",
         "--precision", "fp32", "--recompute", "none", "--zero", "0", "--max-mbs", "2", "--no-rampup",
         "--framework", "megatron-lm", "--cp", "1,2"]


def moe_yaml(tmp: Path) -> Path:
    path = tmp / "moe.yaml"
    path.write_text(MOE_YAML)
    return path


def moe_plan(tmp: Path, targets=None):
    model = load_model(str(moe_yaml(tmp)))
    cluster = make_cluster(gpu="CPU", gpus=4, gpus_per_node=4)
    training = TrainingSpec(global_batch=8, seq_len=64, precision="fp32", recompute_options=("none",),
                            zero_options=(0,), max_mbs=2, rampup=None, framework="megatron-lm", cp_options=(1, 2))
    return plan(model, cluster, training, targets=targets)


# -- parameters --------------------------------------------------------------------------------------------

def test_config_key_and_params_round_trip_with_cp_and_ep(tmp_path):
    p = moe_plan(tmp_path)
    space = SearchSpace.from_plan(p)
    assert {e.candidate.cp for e in space.survivors} == {1, 2}
    assert {e.candidate.ep for e in space.survivors} >= {1, 2, 4}
    keys = [config_key(e.candidate) for e in space.survivors]
    assert len(set(keys)) == len(keys)
    params = [tuple(sorted(params_of(e.candidate).items())) for e in space.survivors]
    assert len(set(params)) == len(params), "two layouts share one set of trial parameters"
    for est in space.survivors:
        c = est.candidate
        assert set(params_of(c)) == set(PARAMS) and {"cp", "ep", "etp"} <= set(PARAMS)
        assert space.lookup(params_of(c)) is est
        assert space.by_key(config_key(c)) is est
    dists = space.distributions()
    for est in space.survivors:      # every survivor's parameters lie inside the Optuna distributions
        for name, value in params_of(est.candidate).items():
            assert dists[name]._contains(dists[name].to_internal_repr(value)), (name, value)


def test_a_trial_stored_without_cp_ep_etp_reads_as_one(tmp_path):
    space = SearchSpace.from_plan(moe_plan(tmp_path))
    dense = next(e for e in space.survivors if (e.candidate.cp, e.candidate.ep, e.candidate.etp) == (1, 1, 1))
    old = {k: v for k, v in params_of(dense.candidate).items() if k not in ("cp", "ep", "etp")}
    assert space.lookup(old) is dense
    expert = next(e for e in space.survivors if e.candidate.ep > 1)
    assert space.nearest(params_of(expert.candidate), exclude=set()) is expert


# -- the probe's rules -----------------------------------------------------------------------------------

def test_probe_dp_impl_is_the_layouts():
    model = {"name": "t", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 128, "vocab": 128,
             "seq_len": 64, "tied_embeddings": False}
    for tp, pp, dp, zero, hybrid in [(1, 1, 4, 0, False), (1, 1, 4, 1, False), (1, 1, 4, 3, True),
                                     (2, 1, 2, 0, False), (1, 2, 2, 0, False), (1, 1, 1, 0, False),
                                     (1, 2, 1, 3, False)]:
        c = Candidate(tp=tp, pp=pp, dp=dp, mbs=1, gas=8 // dp, zero=zero, hybrid=hybrid)
        spec = ProbeSpec(model=model, candidate=c.to_dict(), precision="fp32")
        assert probe_dp_impl(c, dp) == resolve_layout(spec, world=c.world).dp_impl, c.label()


def test_planning_for_the_probe_keeps_only_what_it_runs(tmp_path):
    from probes.extent import resolve_probe
    from probes.layout import LayoutError

    full = moe_plan(tmp_path)
    probed = moe_plan(tmp_path, targets=(Target("megatron-lm"), Target(PROBE)))
    kept = {config_key(e.candidate) for e in probed.candidates}
    assert kept < {config_key(e.candidate) for e in full.candidates}
    assert any(e.candidate.ep > 1 for e in probed.candidates)
    m = probed.model
    for est in full.candidates:
        c = est.candidate
        spec = ProbeSpec(model=m.to_dict(), candidate=c.to_dict(), precision="fp32", cp=c.cp, ep=c.ep,
                         num_experts=m.num_experts, moe_top_k=m.moe_topk)
        try:
            resolve_probe(spec, world=c.world)
            runs = True
        except LayoutError:
            runs = False
        assert runs == (config_key(c) in kept), c.label()


def test_a_probe_model_it_cannot_build_is_refused_with_the_reason(tmp_path, capsys):
    from planner.rules import Reason

    path = tmp_path / "shared.yaml"
    path.write_text(MOE_YAML + "shared_experts: 1\n")
    model = load_model(str(path))
    training = TrainingSpec(global_batch=8, seq_len=64, precision="fp32", recompute_options=("none",),
                            zero_options=(0,), max_mbs=2, rampup=None, framework="megatron-lm")
    p = plan(model, make_cluster(gpu="CPU", gpus=4, gpus_per_node=4), training,
             targets=(Target("megatron-lm"), Target(PROBE)), allow_empty=True)
    assert not p.candidates and "shared experts" in p.examples[Reason.MODEL_FEATURE][1].detail
    argv = ["--model", str(path), *SETUP, "--probe-device", "cpu", "--study", "x", "--workdir", str(tmp_path / "w"),
            "--no-progress"]
    assert main(argv) == 2          # refused before any probe, one line naming the feature
    err = capsys.readouterr().err
    assert "shared experts" in err and "--probe megatron" in err and "Traceback" not in err


# -- replay ------------------------------------------------------------------------------------------------

def _table(tmp: Path) -> tuple[Path, dict[str, float], str]:
    """One row per survivor without TP or interleaving (the CSV has no VPP column), step times the reverse of the planner's order (its last is the measured
    best); the replay's space is these rows."""
    survivors = [e.candidate for e in moe_plan(tmp).candidates if e.candidate.tp == 1 and e.candidate.vpp == 1]
    lines = ["tp,pp,dp,micro_batch,context_parallel,expert_parallel,expert_tensor_parallel,status,"
             "seconds_per_iteration,global_batch,seq_len"]
    steps = {}
    for i, c in enumerate(survivors):
        step = round(1.0 / (1 + 0.1 * i), 4)
        steps[c.label()] = step
        lines.append(f"{c.tp},{c.pp},{c.dp},{c.mbs},{c.cp},{c.ep},{c.etp},ok,{step},8,64")
    path = tmp / "moe.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, steps, survivors[-1].label()


@pytest.mark.slow   # a whole tuning study (10-40 s on 2 cores)
def test_replay_over_ep_layouts_finds_the_measured_best_and_keeps_layouts_apart(tmp_path, capsys):
    csv_path, steps, best = _table(tmp_path)
    assert "ep=" in best
    argv = ["--model", str(moe_yaml(tmp_path)), *SETUP, "--backend", "replay", "--results", str(csv_path),
            "--study", "moe", "--storage", f"sqlite:///{tmp_path}/t.db", "--no-progress", "--confirm-top", "0",
            "--seed", "0", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["config"] == best
    probes = [t for t in out["trials"] if t["outcome"] == "ok"]
    configs = [t["config"] for t in probes]
    assert len(configs) == len(set(configs)) == len(steps), "a layout probed twice, or one never probed"
    study = optuna.load_study(study_name="moe", storage=f"sqlite:///{tmp_path}/t.db")
    seen = {}
    for t in study.trials:
        if t.user_attrs.get("outcome") != "ok":
            continue
        key = tuple(sorted(t.params.items()))
        assert key not in seen, f"trials {seen.get(key)} and {t.number} share parameters"
        seen[key] = t.number
        c = t.user_attrs["candidate"]
        assert (t.params["cp"], t.params["ep"], t.params["etp"]) == (c["cp"], c["ep"], c["etp"])
        assert t.user_attrs["measured_step_s"] == steps[t.user_attrs["config"]]   # its own row answered it


def test_a_trial_queued_by_an_older_tune_probes_its_cp1_ep1_layout(tmp_path, capsys):
    """A study made before cp/ep/etp were parameters: its queued trial names none of them and means 1, never a
    sampled degree (the sampler would pick another layout's EP)."""
    csv_path, steps, _ = _table(tmp_path)
    space = SearchSpace.from_plan(moe_plan(tmp_path), keep=set(steps))
    dense = [e.candidate for e in space.survivors if (e.candidate.cp, e.candidate.ep) == (1, 1)
             and any(o.candidate.ep > 1 and (o.candidate.pp, o.candidate.dp, o.candidate.mbs) ==
                     (e.candidate.pp, e.candidate.dp, e.candidate.mbs) for o in space.survivors)][-1]
    storage = f"sqlite:///{tmp_path}/t.db"
    old = optuna.create_study(study_name="moe", storage=storage, direction="maximize")
    old.enqueue_trial({k: v for k, v in params_of(dense).items() if k not in ("cp", "ep", "etp")},
                      user_attrs={"phase": "analytic"})
    argv = ["--model", str(moe_yaml(tmp_path)), *SETUP, "--backend", "replay", "--results", str(csv_path),
            "--study", "moe", "--storage", storage, "--no-progress", "--confirm-top", "0", "--top-k", "0",
            "--max-probes", "1", "--sampler", "random", "--seed", "3", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    first = min(out["trials"], key=lambda t: t["number"])
    assert first["config"] == dense.label()
    assert first["measured_step_s"] == steps[dense.label()]


def test_replay_without_an_ep_column_reads_every_row_as_ep_1(tmp_path, capsys):
    survivors = [e.candidate for e in moe_plan(tmp_path).candidates]
    rows = ["tp,pp,dp,micro_batch,context_parallel,status,seconds_per_iteration"]
    rows += [f"{c.tp},{c.pp},{c.dp},{c.mbs},{c.cp},ok,1.0" for c in survivors if c.ep == 1]
    path = tmp_path / "no-ep.csv"
    path.write_text("\n".join(rows) + "\n")
    argv = ["--model", str(moe_yaml(tmp_path)), *SETUP, "--backend", "replay", "--results", str(path),
            "--study", "moe", "--storage", f"sqlite:///{tmp_path}/t.db", "--no-progress", "--confirm-top", "0",
            "--max-probes", "2", "--format", "json"]
    assert main(argv) == 0          # an absent ep column is EP 1: every row is its EP-1 layout only
    out = json.loads(capsys.readouterr().out)
    assert all("ep=" not in t["config"] for t in out["trials"] if t.get("config"))


# -- a real local tune ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("degree,flags", [("ep", ("--ep", "2")), ("cp", ("--cp", "2", "--ep", "1"))])
def test_local_cpu_tune_measures_an_expert_or_context_parallel_layout(degree, flags, tmp_path):
    """4 gloo processes, the tiny MoE, the probe's rules: an EP 2 (or CP 2) layout is probed end to end."""
    argv = [sys.executable, "-m", "search.cli", "--model", str(moe_yaml(tmp_path)), *SETUP, *flags,
            "--probe-device", "cpu", "--probe-steps", "2", "--probe-warmup", "1", "--probe-timeout", "900",
            "--top-k", "1", "--max-probes", "1", "--confirm-top", "0", "--sampler", "analytic", "--study", "moe",
            "--storage", f"sqlite:///{tmp_path}/t.db", "--workdir", str(tmp_path / "runs"), "--seed", "0",
            "--format", "json", "--no-progress"]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert [t for t in out["trials"] if t["outcome"] == "ok"], out["trials"]
    assert all(t["outcome"] != "invalid" for t in out["trials"]), "probed a layout the probe refuses"
    study = optuna.load_study(study_name="moe", storage=f"sqlite:///{tmp_path}/t.db")
    measured = [t for t in study.trials if t.user_attrs.get("outcome") == "ok" and t.params.get(degree, 1) > 1]
    assert measured, [t.user_attrs.get("config") for t in study.trials]
    t = measured[0]
    result = json.loads((Path(t.user_attrs["workdir"]) / "result.json").read_text())
    assert result["extra"]["extent"][degree] == 2 and result["extra"]["extent"]["num_experts"] == 4
    c = t.user_attrs["candidate"]
    assert result["world_size"] == c["tp"] * c["cp"] * c["pp"] * c["dp"] == 4
