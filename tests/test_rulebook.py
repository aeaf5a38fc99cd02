"""The contract of the one rulebook: what `plan` ranks can be emitted, read back and probed.

For every framework and fork flavour and a few models (GQA 32 heads / 4 KV heads, Llama 3 405B's
126 layers, a VPP-friendly Llama 2 70B, BLOOM), every survivor of `plan`:
- renders for its target without a refusal, reads back from plan.yaml identical and re-renders byte-identical;
- resolves as a torch-native probe layout (one DP replica, PP*VPP layers: what `tune` runs reduced);
and with the probe as a target, resolves at full depth. A `--from` file is checked by the same rules
and the same memory model as `plan`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from planner.cli import main as plan_main
from planner.emit import RunSetup, load_plan_yaml, plan_yaml_dict, render
from planner.emit.write import emit
from planner.files import yaml_loaders
from planner.hardware import make_cluster
from planner.model import get_preset
from planner.rank import plan
from planner.rules import (PROBE, Reason, Target, layout_violations, megatron_lm_stages, model_violations,
                           setup_violations)
from planner.space import Candidate, TrainingSpec
from probes.layout import LayoutError, resolve_layout
from probes.result import ProbeSpec

GQA = replace(get_preset("llama3-8b"), name="gqa-32h-4kv", kv_heads=4)

MODELS = {
    # name: (model, gpus, gpu, global batch, seq)
    "gqa-32h-4kv": (GQA, 64, "H100-SXM", 512, 4096),
    "llama3-405b-126-layers": (get_preset("llama3-405b"), 2048, "H100-SXM", 2048, 8192),
    "llama2-70b-vpp": (get_preset("llama2-70b"), 256, "H100-SXM", 1024, 4096),
    "bloom-176b": (get_preset("176B"), 384, "A100-80GB", 2048, 2048),
}
TARGETS = [Target("megatron-deepspeed", "bigscience"), Target("megatron-deepspeed", "microsoft"),
           Target("megatron-lm"), Target("fsdp")]
MAX_PER_CASE = 40
"""survivors checked per case (best first); every case here has fewer or about as many"""


def _training(target: Target, gbs: int, seq: int, model) -> TrainingSpec:
    flash = not (target.framework == "megatron-deepspeed" and target.flavor == "bigscience")
    return TrainingSpec(global_batch=gbs, seq_len=seq, framework=target.framework,
                        flavor=target.flavor or "bigscience", flash_attention=flash, rampup=None,
                        train_tokens=model.train_tokens, recompute_options=("selective", "full"))


def _reduced_probe(model, cand: Candidate, precision: str):
    """The probe `tune` runs for a layout that is too big: one DP replica, PP*VPP layers."""
    layers = cand.pp * cand.vpp if cand.pp > 1 else 1
    spec = ProbeSpec(model=model.to_dict(), candidate=cand.to_dict(), precision=precision, layers_run=layers)
    return resolve_layout(spec, world=cand.tp * cand.pp)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_every_survivor_emits_reads_back_and_probes(name, target, tmp_path):
    model, gpus, gpu, gbs, seq = MODELS[name]
    cluster = make_cluster(gpu=gpu, gpus=gpus)
    training = _training(target, gbs, seq, model)
    if model_violations(model, training, cluster, target):
        pytest.skip(f"{target} cannot express {name} (test_inexpressible_models_are_refused_up_front)")
    p = plan(model, cluster, training, targets=(target,), allow_empty=True)
    assert p.total > 0
    for est in p.candidates[:MAX_PER_CASE]:
        setup = RunSetup(model=p.model, cluster=cluster, training=training, candidate=est.candidate)
        files = render(setup, target.framework, flavor=target.flavor or "bigscience")
        out = tmp_path / est.candidate.label().replace(",", "_").replace("=", "")
        emit(setup, target.framework, out, flavor=target.flavor or "bigscience")
        loaded = load_plan_yaml(out / "plan.yaml")
        assert loaded == setup
        assert plan_yaml_dict(loaded, kind=target.framework, flavor=target.flavor) == \
            yaml.load((out / "plan.yaml").read_text(), Loader=yaml_loaders()[1])
        assert render(loaded, target.framework, flavor=target.flavor or "bigscience") == files
        c = est.candidate
        if c.pp * c.vpp > p.model.layers:   # Megatron runs an embedding-/loss-only chunk (126 + 2 = 16 x 8): the
            with pytest.raises(LayoutError, match="layers_run"):   # probe builds whole layers per chunk and says so
                _reduced_probe(p.model, c, training.precision)
            continue
        layout = _reduced_probe(p.model, c, training.precision)
        assert (layout.tp, layout.pp, layout.dp_full) == (c.tp, c.pp, c.dp)


@pytest.mark.parametrize("name", MODELS)
def test_probe_target_survivors_resolve_at_full_depth(name):
    model, gpus, gpu, gbs, seq = MODELS[name]
    cluster = make_cluster(gpu=gpu, gpus=gpus)
    training = _training(Target("megatron-lm"), gbs, seq, model)
    targets = (Target("megatron-lm"), Target(PROBE))
    if model_violations(model, training, cluster, targets[0]):
        pytest.skip("Megatron-LM cannot express it")
    p = plan(model, cluster, training, targets=targets, allow_empty=True)
    for est in p.candidates[:MAX_PER_CASE]:
        c = est.candidate
        spec = ProbeSpec(model=p.model.to_dict(), candidate=c.to_dict(), precision=training.precision)
        layout = resolve_layout(spec, world=c.world)
        assert layout.layers_run == p.model.layers and not layout.reduced


def test_survivors_exist_for_every_target_somewhere():
    """The contract above must not pass vacuously: each target has survivors on at least one model."""
    for target in TARGETS:
        total = 0
        for model, gpus, gpu, gbs, seq in MODELS.values():
            cluster = make_cluster(gpu=gpu, gpus=gpus)
            training = _training(target, gbs, seq, model)
            if not model_violations(model, training, cluster, target):
                total += len(plan(model, cluster, training, targets=(target,), allow_empty=True).candidates)
        assert total > 0, target


def test_inexpressible_models_are_refused_up_front(capsys):
    code = plan_main(["--model", "405B", "--gpus", "2048", "--gpu", "H100-SXM", "--framework", "megatron-deepspeed"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot express grouped-query attention" in err and "--framework megatron-lm" in err


# -- the cases -------------------------------------------------------------------------------------

def test_405b_megatron_lm_ranked_layouts_all_emit(tmp_path, capsys):
    """126 layers: PP=8/16 layouts rank and emit (uneven first/last stages), for every --pick."""
    for k in range(1, 6):
        code = plan_main(["--model", "llama3-405b", "--gpus", "2048", "--gpu", "H100-SXM", "--framework",
                          "megatron-lm", "--emit", "megatron-lm", "--pick", str(k), "--out", str(tmp_path / str(k)),
                          "--format", "json"])
        assert code == 0, capsys.readouterr().err
    capsys.readouterr()


def test_megatron_lm_stage_split():
    assert megatron_lm_stages(126, 16) == (7, 8, 7)         # Llama 3 405B on PP=16
    assert megatron_lm_stages(126, 8) == (15, 16, 15)
    assert megatron_lm_stages(80, 4, 2) == (20, 20, 20)
    assert megatron_lm_stages(80, 32) is None                 # edges would exceed the middle stages
    first, middle, last = megatron_lm_stages(70, 12)
    assert first + 10 * middle + last == 70


def test_megatron_lm_split_flags():
    from planner.pipeline_split import StageSplit, layout_problem, megatron_lm_split, parse_layout

    # 126 + embedding + loss = 128 = 16 x 4 x 2: Llama 3 405B on PP 16 with interleaving (7, 8, 7 layers)
    assert megatron_lm_split(126, 16, 4) == StageSplit(7, 8, 7, account_embedding=True, account_loss=True)
    assert megatron_lm_split(126, 8, 8) == StageSplit(15, 16, 15, account_embedding=True, account_loss=True)
    # VPP 8 (Llama 3 Table 4's 16K-GPU rows): the embedding's and the loss's model chunks build no layer, which
    # Megatron accepts (transformer_block.get_num_layers_to_build asserts >= 0)
    assert megatron_lm_split(126, 16, 8) == StageSplit(7, 8, 7, account_embedding=True, account_loss=True)
    assert megatron_lm_split(126, 16, 16) is None     # 128 / (16 x 16): half a layer per chunk
    assert megatron_lm_split(126, 16).first_last       # VPP 1: --decoder-first/last-pipeline-num-layers 7
    assert megatron_lm_split(80, 4, 2) == StageSplit(20, 20, 20)   # even: no flag
    # unequal first and last stages: 61 layers (DeepSeek-V3) on PP 16 / 4 / 2; the last (LM head) the smaller
    assert megatron_lm_split(61, 16) == StageSplit(3, 4, 2, first_last=True)
    assert megatron_lm_split(61, 4) == StageSplit(15, 16, 14, first_last=True)
    assert megatron_lm_split(61, 2) == StageSplit(31, 0, 30, first_last=True)
    # every split: Megatron's own checks (transformer_config.py): whole layers, multiples of VPP, flags exclusive
    for layers, pp, vpp in [(l, p, v) for l in (61, 70, 80, 95, 126) for p in (2, 3, 4, 8, 16) for v in (1, 2, 4)]:
        s = megatron_lm_split(layers, pp, vpp)
        if s is None:
            continue
        assert s.first + max(pp - 2, 0) * s.middle + s.last == layers
        assert not (s.first_last and (s.account_embedding or s.account_loss))
        if s.layout:   # a layout: Megatron's own layout checks, and the chunks hold the split's layers
            chunks = parse_layout(s.layout)
            assert layout_problem(chunks, pp, layers, 0) is None and len(chunks) == pp * vpp
            assert not (s.first_last or s.account_embedding or s.account_loss)
        elif s.first_last:
            assert s.first % vpp == s.last % vpp == s.middle % vpp == 0 and s.first > 0 and s.last > 0
        else:
            total = layers + s.account_embedding + s.account_loss
            assert total % pp == 0 and (total // pp) % vpp == 0


# NVIDIA's published DeepSeek-V3 layouts (61 decoder layers + 1 MTP layer): Megatron-Bridge
# scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (DGX-H100 1,024 GPUs TP2 PP8 VP4 EP64
# pp_layout "Et|(tt|)*30mL"; DGX-B200 MXFP8 PP8 VP2 EP32 and GB300 PP2 VP8 "Et*4|(t*4|)*14tmL") and the recipe's map for
# PP4 x VP4 (GB200), PP16 (B200), PP8 x VP2 (src/megatron/bridge/recipes/deepseek/deepseek_v3.py
# set_deepseek_v3_pipeline_model_parallel_layout: [E + t*4] + [t*4] * 14 + [t, mtp, loss]; PP8 / PP4 x VP2:
# [E + t*8] + [t*8] * 6 + [t*5, mtp, loss]; PP4: [E + t*16], [t*16] * 2, [t*13, mtp, loss]).
DEEPSEEK_V3_LAYOUTS = {(4, 4): "Et*4|(t*4|)*14tmL", (8, 2): "Et*4|(t*4|)*14tmL", (16, 1): "Et*4|(t*4|)*14tmL",
                       (2, 8): "Et*4|(t*4|)*14tmL", (8, 4): "Et|(tt|)*30mL", (8, 1): "Et*8|(t*8|)*6t*5mL",
                       (4, 2): "Et*8|(t*8|)*6t*5mL", (4, 1): "Et*16|(t*16|)*2t*13mL"}


@pytest.mark.parametrize("pp_vpp", sorted(DEEPSEEK_V3_LAYOUTS))
def test_deepseek_v3_splits_as_nvidia_publishes(pp_vpp):
    from planner.pipeline_split import layout_problem, megatron_lm_split, parse_layout

    pp, vpp = pp_vpp
    s = megatron_lm_split(61, pp, vpp, 1)
    assert s.layout == DEEPSEEK_V3_LAYOUTS[pp_vpp]
    chunks = parse_layout(s.layout)
    assert len(chunks) == pp * vpp and layout_problem(chunks, pp, 61, 1) is None
    assert s.first + max(pp - 2, 0) * s.middle + s.last == 61 and s.last < s.middle or pp == 2
    # the layout is the only split of 61 layers on these PP x VPP > 1 (61 is prime: no flag gives one)
    if vpp > 1:
        plain = megatron_lm_split(61, pp, vpp)
        assert plain == s.__class__(s.first, s.middle, s.last, layout=s.layout.replace("m", ""))


def test_layout_strings_round_trip_and_megatron_refusals():
    from planner.pipeline_split import format_layout, layout_problem, parse_layout

    # Megatron-Bridge's DeepEP variant of the H100 run (Megatron-LM docs, flexible asymmetric VPP)
    chunks = parse_layout("Et*3|(tt|)*29m|L")
    assert chunks[:2] == ["Ettt", "tt"] and chunks[-2:] == ["m", "L"] and len(chunks) == 32
    assert format_layout(chunks) == "Et*3|(tt|)*29m|L" and layout_problem(chunks, 8, 61, 1) is None
    assert parse_layout("Et,t|tL") == ["Ett", "tL"] and parse_layout("Ex|L") is None
    assert "multiple of PP" in layout_problem(chunks, 3, 61, 1)
    assert "decoder layers" in layout_problem(chunks, 8, 60, 1)
    assert "before the MTP" in layout_problem(["Et", "mtL"], 2, 2, 1)
    assert "first and the loss" in layout_problem(["tE", "tL"], 2, 2, 0)
    assert "other than the first" in layout_problem(["Et", "t", "tm", "L"], 2, 3, 1)   # m on PP rank 0


def test_gqa_kv_heads_rule_agrees_between_explain_and_emit(capsys, tmp_path):
    """32 heads, 4 KV heads, TP=8: --explain and --emit give the same answer (ruled out)."""
    cluster = make_cluster(gpu="H100-SXM", gpus=64)
    training = _training(Target("megatron-lm"), 512, 4096, GQA)
    cand = Candidate(tp=8, pp=1, dp=8, mbs=1, gas=64, recompute="full", zero=1)
    reasons = {v.reason for v in setup_violations(GQA, cand, cluster, training, Target("megatron-lm"))}
    assert Reason.TP_KV_HEADS in reasons
    from planner.rank import estimate
    assert not estimate(GQA, cluster, training, cand).fits


def test_microsoft_flavour_allows_zero23_selective_and_sp(capsys):
    base = ["--model", "70b", "--gpus", "256", "--gpu", "H100-SXM", "--emit-flavor", "microsoft", "--format", "json",
            "--top", "200"]
    import json
    for extra, check in ((["--zero", "2,3"], lambda c: c["zero"] in (2, 3) and c["dp"] > 1),
                         (["--recompute", "selective"], lambda c: c["recompute"] == "selective"),
                         ([], lambda c: c["sp"])):
        assert plan_main(base + extra) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["targets"] == ["megatron-deepspeed (microsoft fork)"]
        assert any(check(c) for c in doc["candidates"]), extra


def test_from_file_is_checked_by_the_same_rules_and_memory(tmp_path, capsys):
    assert plan_main(["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=2,recompute=full,zero=1",
                      "--emit", "megatron-deepspeed", "--out", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    doc = yaml.safe_load((tmp_path / "ok" / "plan.yaml").read_text())
    doc["micro_batch_size"], doc["gradient_accumulation_steps"] = 2, 128
    doc["recompute_granularity"] = None      # no recompute at MBS 2 on PP=12: > 80 GB predicted
    doc["plantune"]["cluster"]["gpu"] = "A100-40GB"
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc, sort_keys=False))
    code = plan_main(["--from", str(edited), "--emit", "megatron-deepspeed", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and "memory_total" in err and not (tmp_path / "bad").exists()


def test_from_file_honours_emit_flavor(tmp_path, capsys):
    assert plan_main(["--model", "70b", "--gpus", "256", "--gpu", "H100-SXM", "--emit-flavor", "microsoft",
                      "--emit", "megatron-deepspeed", "--out", str(tmp_path / "ms")]) == 0
    capsys.readouterr()
    # the microsoft plan asks for the bigscience fork, which cannot express Llama's GQA: refused, not ignored
    code = plan_main(["--from", str(tmp_path / "ms" / "plan.yaml"), "--emit", "megatron-deepspeed",
                      "--emit-flavor", "bigscience", "--out", str(tmp_path / "bs")])
    assert code == 2 and "bigscience fork" in capsys.readouterr().err


def test_pins_fix_degrees(capsys):
    import json
    assert plan_main(["--model", "70b", "--gpus", "256", "--gpu", "H100-SXM", "--framework", "megatron-lm",
                      "--tp", "4", "--pp", "4", "--mbs", "2", "--format", "json", "--top", "50"]) == 0
    cands = json.loads(capsys.readouterr().out)["candidates"]
    assert cands and all((c["tp"], c["pp"], c["dp"], c["mbs"]) == (4, 4, 16, 2) for c in cands)
    assert plan_main(["--model", "70b", "--gpus", "256", "--tp", "3"]) == 2
    assert "--tp 3 does not divide the 256 GPUs" in capsys.readouterr().err


def test_non_power_of_two_micro_batches_are_enumerated():
    model = get_preset("176B")
    training = TrainingSpec(global_batch=2304, seq_len=2048, flash_attention=False, rampup=None, max_mbs=8)
    p = plan(model, make_cluster(gpu="A100-80GB", gpus=384), training, allow_empty=True)
    assert {e.candidate.mbs for e in p.candidates} & {3, 6}


def test_memory_fraction_is_advice_not_a_wall():
    model = get_preset("176B")
    cluster = make_cluster(gpu="A100-80GB", gpus=384)
    training = TrainingSpec(global_batch=2048, seq_len=2048, flash_attention=False, rampup=None, memory_fraction=0.1)
    p = plan(model, cluster, training)
    assert p.candidates and all(e.advice and e.advice[0].reason is Reason.MEMORY_STATIC for e in p.candidates)
    assert all(e.memory.total_bytes <= 0.95 * cluster.gpu.memory_bytes for e in p.candidates)


def test_tune_plans_with_the_emit_target(tmp_path):
    """tune --emit fsdp: the space holds only what torchtitan can write, and a model it cannot express is
    refused before any probe (not after the study, on the winner)."""
    import argparse

    from search.cli import _targets

    model, gpus, gpu, gbs, seq = MODELS["gqa-32h-4kv"]
    cluster = make_cluster(gpu=gpu, gpus=gpus)
    args = argparse.Namespace(probe="megatron", emit="fsdp", emit_flavor="microsoft")
    # --probe megatron under a Megatron-LM plan runs Megatron-LM's pretrain_gpt.py (search.cli._megatron_probe_flavor)
    assert _targets(args, _training(Target("megatron-lm"), gbs, seq, model)) == (Target("megatron-lm"), Target("fsdp"))
    assert _targets(args, _training(Target("megatron-deepspeed", "microsoft"), gbs, seq, model)) == (
        Target("megatron-deepspeed", "microsoft"), Target("fsdp"))
    training = _training(Target("fsdp"), gbs, seq, model)      # tune --emit fsdp plans FSDP (no --framework)
    local = argparse.Namespace(probe="train", emit="fsdp", emit_flavor="bigscience", backend="local")
    assert _targets(local, training) == (Target("fsdp"), Target(PROBE))   # probing: also the probe's rules
    args = argparse.Namespace(probe="train", emit="fsdp", emit_flavor="bigscience", backend="replay")
    targets = _targets(args, training)
    assert targets == (Target("fsdp"),)
    p = plan(model, cluster, training, targets=targets, allow_empty=True)
    assert p.candidates
    for est in p.candidates:
        setup = RunSetup(model=p.model, cluster=cluster, training=training, candidate=est.candidate)
        assert render(setup, "fsdp")          # every point of the study can be emitted

    from search.cli import main as tune_main
    tiny = tmp_path / "tiny.yaml"   # GELU, LayerNorm, learned positions: not torchtitan's Llama
    tiny.write_text("name: tiny\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 128\n"
                    "seq_len: 32\n")
    code = tune_main(["--model", str(tiny), "--gpu", "CPU", "--gpus", "2", "--gpus-per-node", "2",
                      "--global-batch", "8", "--precision", "fp32", "--no-rampup", "--emit", "fsdp",
                      "--storage", f"sqlite:///{tmp_path}/t.db", "--workdir", str(tmp_path / "runs"),
                      "--no-progress"])
    assert code == 2 and not (tmp_path / "runs").exists()


# -- context parallel and experts (planner.context_parallel, planner.moe) ------------------------------------

PARALLEL_CASES = {
    # name: (model, gpus, global batch, seq, target, which extra degree must appear among the survivors)
    "mixtral-8x7b-megatron-lm": (get_preset("mixtral-8x7b"), 64, 512, 4096, Target("megatron-lm"), "ep"),
    "llama3-8b-32k-cp-megatron-lm": (get_preset("llama3-8b").with_overrides(seq_len=32768), 64, 64, 32768,
                                     Target("megatron-lm"), "cp"),
    "llama3-8b-32k-cp-fsdp": (get_preset("llama3-8b").with_overrides(seq_len=32768), 64, 64, 32768, Target("fsdp"),
                              "cp"),
}


@pytest.mark.parametrize("name", PARALLEL_CASES)
def test_cp_and_moe_survivors_emit_and_read_back(name, tmp_path):
    """MoE (EP/ETP) and CP layouts: every survivor renders for its target, reads back identical and re-renders
    byte-identical; the torch-native probe target refuses exactly what the probe cannot run."""
    model, gpus, gbs, seq, target, extra = PARALLEL_CASES[name]
    cluster = make_cluster(gpu="H100-SXM", gpus=gpus)
    training = _training(target, gbs, seq, model)
    assert model_violations(model, training, cluster, target) == []
    p = plan(model, cluster, training, targets=(target,), allow_empty=True)
    survivors = p.candidates[:MAX_PER_CASE]
    assert any(getattr(e.candidate, extra) > 1 for e in p.candidates), f"no {extra} > 1 among the survivors"
    with_extra = [e for e in p.candidates if getattr(e.candidate, extra) > 1][:10]
    for est in {e.candidate.label(): e for e in survivors + with_extra}.values():   # each layout once
        setup = RunSetup(model=p.model, cluster=cluster, training=training, candidate=est.candidate)
        files = render(setup, target.framework)
        out = tmp_path / est.candidate.label().replace(",", "_").replace("=", "")
        emit(setup, target.framework, out)
        loaded = load_plan_yaml(out / "plan.yaml")
        assert loaded == setup
        assert render(loaded, target.framework) == files
        c = est.candidate
        if c.cp > 1 or c.ep > 1 or model.num_experts:
            _probe_rules_agree(p.model, c, cluster, training)


def _probe_rules_agree(model, c, cluster, training):
    """What `plan` prunes for the torch-native probe target is what the probe itself refuses (probes.extent), on the
    full layout; the plan may refuse more only for a model feature the probe's GPT cannot build."""
    from probes.extent import resolve_probe

    planned = layout_violations(model, c, cluster, training, Target(PROBE))
    spec = ProbeSpec(model=model.to_dict(), candidate=c.to_dict(), precision="bf16", cp=c.cp, ep=c.ep,
                     num_experts=model.num_experts, **({"moe_top_k": model.moe_topk} if model.num_experts else {}))
    try:
        resolve_probe(spec, world=c.world)
        refused = ""
    except LayoutError as err:
        refused = str(err)
    if refused:
        assert planned, f"{c.label()}: the probe refuses ({refused}) what the plan keeps"
    else:
        assert all(v.reason == Reason.MODEL_FEATURE for v in planned), (c.label(), planned)


def test_moe_and_cp_are_refused_by_the_megatron_deepspeed_forks():
    mixtral = get_preset("mixtral-8x7b")
    cluster = make_cluster(gpu="H100-SXM", gpus=64)
    for flavor in ("bigscience", "microsoft"):
        t = _training(Target("megatron-deepspeed", flavor), 512, 4096, mixtral)
        problems = model_violations(mixtral, t, cluster, Target("megatron-deepspeed", flavor))
        assert any("mixture-of-experts" in v.detail for v in problems), flavor
    llama = get_preset("llama3-8b").with_overrides(seq_len=32768)
    t = _training(Target("megatron-deepspeed", "microsoft"), 64, 32768, llama)
    c = Candidate(tp=1, pp=1, dp=32, cp=2, mbs=1, gas=2)
    assert any(v.reason == Reason.FRAMEWORK_LIMIT and "context parallelism" in v.detail
               for v in setup_violations(llama, c, cluster, t, Target("megatron-deepspeed", "microsoft")))


@pytest.mark.parametrize("name", PARALLEL_CASES)
def test_checker_fast_path_agrees_with_the_rules(name):
    """`Checker.first` (cached per degree, batch, framework and CP/EP/ETP key) names the same first rule as
    `iter_violations` on CP and EP candidates, for the plan's target and for the forks that refuse them."""
    from planner.rules import Checker, iter_violations
    from planner.enumeration import enumerate_candidates

    model, gpus, gbs, seq, target, _ = PARALLEL_CASES[name]
    cluster = make_cluster(gpu="H100-SXM", gpus=gpus)
    cands = list(enumerate_candidates(model, cluster.world_size, cluster.gpus_per_node,
                                      _training(target, gbs, seq, model)))
    assert any(c.cp > 1 or c.ep > 1 for c in cands)
    for t in (target, Target("megatron-deepspeed", "microsoft")):
        training = _training(t, gbs, seq, model)
        checker = Checker(model, cluster, training, (t,))
        for c in cands[::7]:
            expected = next(iter_violations(model, c, cluster, training, (t,)), None)
            assert checker.first(c) == expected, c.label()


def test_deepspeed_engine_on_an_eager_model_is_data_parallel_only():
    """`deepspeed` (DeepSpeed's engine on a Hugging Face model, a framework published runs are read as): ZeRO 0-3 over
    DP, no TP/PP/hybrid; `plan --framework` does not offer it (no emitter writes it)."""
    from planner.rules import structural_violations
    from planner.space import FRAMEWORKS, REPLAYED_FRAMEWORKS
    model = get_preset("1B3")
    cluster = make_cluster(gpu="V100-32GB", gpus=16, gpus_per_node=16)
    training = TrainingSpec(global_batch=128, seq_len=1024, precision="fp16", framework="deepspeed")
    for zero in (0, 1, 2, 3):
        assert not structural_violations(model, Candidate(tp=1, pp=1, dp=16, mbs=8, gas=1, zero=zero), cluster,
                                         training)
    tp2 = structural_violations(model, Candidate(tp=2, pp=1, dp=8, mbs=8, gas=2, zero=1), cluster, training)
    assert [v.reason.value for v in tp2] == ["framework_limit"]
    assert "deepspeed" in REPLAYED_FRAMEWORKS and "deepspeed" not in FRAMEWORKS
