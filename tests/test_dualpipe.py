"""DeepSeek's DualPipe and DualPipeV (planner.dualpipe): the DeepSeek-V3 report's Table 2, the schedule's rules, its
memory and its time on DeepSeek-V3's own run (2,048 H800, PP16 EP64: tests/bench/validate_moe_cp.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from planner import dualpipe, load_model, make_cluster
from planner.errors import InputError
from planner.memory import memory_breakdown, stage_memory
from planner.rank import estimate
from planner.rules import Reason, Target, layout_violations, model_violations
from planner.space import Candidate, TrainingSpec


def test_table2_rows_at_the_readme_example():
    """DeepSeek-V3 report Table 2 (and deepseek-ai/DualPipe's README) on its example of 8 PP ranks, with a chunk's
    F = 1, full backward B = 2, weight part W = 1 and F&B = F + B: 1F1B (PP-1)(F+B) = 21, ZB1P (PP-1)(F+B-2W) = 7,
    DualPipe (PP/2-1)(F&B+B-3W) = 6."""
    f, b, w = dualpipe.chunk_times()
    assert (f, b, w) == (1.0, 2.0, 1.0)
    assert dualpipe.bubble_1f1b(8, f, b) == 21
    assert dualpipe.bubble_zb1p(8, f, b, w) == 7
    assert dualpipe.bubble_dualpipe(8, f + b, b, w) == 6
    # in plantune's slots (F + B of a rank): 1F1B's PP - 1, DualPipe's (PP - 2) / 3
    assert dualpipe.bubble_slots("DualPipe", 8) == pytest.approx(2.0)
    assert dualpipe.bubble_slots("DualPipe", 16) == pytest.approx(14 / 3)
    # PP = 2: no bubble left (PP/2 - 1 = 0)
    assert dualpipe.bubble_slots("DualPipe", 2) == 0.0


def test_dualpipev_is_dualpipe_over_twice_the_stages():
    """README: DualPipeV runs PP stages on PP/2 devices with DualPipe's bubble in stage units: on 4 ranks (8 stages) the
    bubble is (8/2 - 1)(F&B + B - 3W) of half-rank chunks, = 6 half-chunks = 1 slot of a rank's F + B (= 6 chunks)."""
    assert dualpipe.bubble_slots("DualPipeV", 4) == pytest.approx(dualpipe.bubble_dualpipe(8, 3, 2, 1) / 6)
    assert dualpipe.bubble_slots("DualPipeV", 4) == pytest.approx(1.0)


def test_full_recompute_grows_the_backward():
    """A re-run forward inside B (B = 3): (PP/2-1)(F&B + B - 3W) = (PP/2-1)·4 over F + B = 4 a slot."""
    assert dualpipe.bubble_slots("DualPipe", 8, "full") == pytest.approx(3 * (1 + 3 + 3 - 3) / 4)


def test_parameters_and_activations_per_device():
    """Table 2: DualPipe holds 2x parameters and PP + 1 micro-batches of activations; DualPipeV's two stages are the
    rank's own (1x) and 2·PP + 1 half-size chunks."""
    assert dualpipe.parameter_copies("DualPipe", 16) == 2
    assert dualpipe.parameter_copies("DualPipe", 1) == 1
    assert dualpipe.parameter_copies("DualPipeV", 16) == 1
    assert dualpipe.in_flight_microbatches("DualPipe", 16, 120) == 17
    assert dualpipe.in_flight_microbatches("DualPipeV", 8, 64) == 8.5


def test_unmerged_share_counts_dualpipe_py_steps():
    """dualpipe.py on rank 0: steps 4 and 5 merge gas - 3PP/2 + 1 forward-backward pairs of gas; PP 16, gas 120:
    23 of 120 run alone."""
    assert dualpipe.unmerged_share("DualPipe", 16, 120) == pytest.approx(23 / 120)
    assert dualpipe.unmerged_share("DualPipeV", 8, 64) == pytest.approx(23 / 128)


@pytest.mark.parametrize("pp,vpp,gas,reason", [(3, 1, 12, "pipeline_schedule"), (4, 1, 9, "microbatches_lt_stages"),
                                               (4, 1, 6, "microbatches_lt_stages"), (4, 2, 16, "virtual_pipeline")])
def test_rules_refuse_what_dualpipe_py_asserts(pp, vpp, gas, reason):
    assert reason in [r for r, _ in dualpipe.problems("DualPipe", pp, vpp, gas)]


def test_rules_accept_deepseek_layout():
    assert dualpipe.problems("DualPipe", 16, 1, 120) == []
    assert dualpipe.problems("DualPipe", 1, 1, 3) == []   # no pipeline: nothing to run
    assert [r for r, _ in dualpipe.problems("DualPipeV", 4, 1, 16)] == ["virtual_pipeline"]
    assert dualpipe.problems("DualPipeV", 4, 2, 8) == []


def _deepseek(schedule: str, *, mbs: int = 1) -> tuple:
    m = load_model("deepseek-v3")
    cluster = make_cluster(gpu="H800", gpus=2048)
    t = TrainingSpec(global_batch=15360, seq_len=4096, precision="fp8", fp8_recipe="blockwise", framework="megatron-lm",
                     pp_schedule=schedule)
    c = Candidate(tp=1, pp=16, dp=128, ep=64, mbs=mbs, gas=15360 // (128 * mbs),
                  recompute="modules:layernorm+mla_up_proj", zero=1)
    return m, cluster, t, c


def test_deepseek_v3_run_dualpipe_against_1f1b():
    """DeepSeek-V3's run (report Sec. 3.2: PP16 EP64 ZeRO-1 on 2,048 H800, 1,543 tokens/s a GPU from 180K GPU-hours a
    trillion tokens): 1F1B leaves the cross-node all-to-all exposed (about half the published throughput); DualPipe
    hides it under the other micro-batch's compute and shrinks the bubble, within 10% of the published rate."""
    m, cluster, t, c = _deepseek("DualPipe")
    dual = estimate(m, cluster, t, c)
    plain = estimate(m, cluster, replace(t, pp_schedule=""), c)
    tok = dual.throughput.tokens_per_s / 2048
    assert plain.throughput.tokens_per_s / 2048 < 0.6 * 1543
    assert 0.9 < tok / 1543 < 1.1
    assert dual.time.pp_bubble_s < plain.time.pp_bubble_s
    assert dual.time.ep_comm_s < 0.5 * plain.time.ep_comm_s


def test_peak_chunks_follow_dualpipe_py_steps():
    """dualpipe.py DualPipe.step on PP 16: half-rank r runs 2(8-r-1) + r + 1 forwards of its shallower stage and r + 1 of
    its deeper one before step 4's first pair adds one more: rank 0 holds 16 chunks of the first stage and one of the
    last, rank 7 (a middle rank) 9 and 8; PP + 1 = 17 on every rank (Table 2); rank 15 mirrors rank 0."""
    assert dualpipe.peak_chunks(16, 120, 0) == (16, 1)
    assert dualpipe.peak_chunks(16, 120, 1) == (15, 2)
    assert dualpipe.peak_chunks(16, 120, 7) == (9, 8)
    assert dualpipe.peak_chunks(16, 120, 15) == (16, 1)
    assert {sum(dualpipe.peak_chunks(16, 120, r)) for r in range(16)} == {17}
    assert dualpipe.ranks(16) == ("end", "middle") and dualpipe.ranks(2) == ("end",)


def test_deepseek_v3_memory_holds_two_stages():
    """The end rank holds the first and the last stage (Table 2: 2x parameters) and, at its peak, 16 chunks of the
    first stage and one of the last (with the MTP layer and the loss's logits); a middle rank holds two middle stages
    and 17 chunks of them, no logits."""
    from planner.constants import ALLOCATOR_OVERHEAD
    from planner.memory import layer_activations, stage_layers

    m, cluster, t, c = _deepseek("DualPipe")
    end, middle = stage_memory(m, c, cluster, t)
    first, last = stage_memory(m, c, cluster, replace(t, pp_schedule=""))
    assert (end.stage, middle.stage) == ("end", "middle")
    assert memory_breakdown(m, c, cluster, t) == max(end, middle, key=lambda b: b.total_bytes)
    word = 129280 * 7168   # the MTP layer's embedding: the first stage's on the end rank (Megatron: its own copy)
    assert end.params_on_gpu == first.params_on_gpu + last.params_on_gpu - word
    assert end.weights_bytes == pytest.approx(first.weights_bytes + last.weights_bytes - 2 * word)
    assert end.buffers_bytes == first.buffers_bytes   # one GPU's communicators, not two stages'
    act = layer_activations(m, c, t)
    embed = 2.0 * 4096 * 7168
    lf, ll, lm = (stage_layers(m, c, "megatron-lm", s) for s in ("first", "last", "middle"))
    assert (lf, ll, lm) == (4, 1, 4)
    assert end.activations_bytes == pytest.approx(ALLOCATOR_OVERHEAD * (
        16 * (lf * act.stored_bytes + embed) + (ll + m.mtp_layers) * act.stored_bytes + embed + act.working_bytes))
    assert middle.activations_bytes == pytest.approx(ALLOCATOR_OVERHEAD * (17 * (lm * act.stored_bytes + embed)
                                                                           + act.working_bytes))
    assert end.logits_bytes > 0 and middle.logits_bytes == 0
    # 1F1B's first stage holds 16 micro-batches of its 4 layers; the end rank one chunk of the last stage more
    assert end.activations_bytes > first.activations_bytes


def test_layout_rules_on_megatron_target():
    m, cluster, t, c = _deepseek("DualPipe")
    target = Target("megatron-lm")
    assert not [v for v in layout_violations(m, c, cluster, t, target) if v.reason == Reason.MICROBATCHES_LT_STAGES]
    odd = replace(c, mbs=8, gas=15)
    assert Reason.MICROBATCHES_LT_STAGES in [v.reason for v in layout_violations(m, odd, cluster, t, target)]
    inter = replace(c, vpp=2)
    assert Reason.VIRTUAL_PIPELINE in [v.reason for v in layout_violations(m, inter, cluster, t, target)]


def test_emit_refuses_dualpipe_with_the_equivalent():
    """No framework plantune emits for runs DualPipe: --emit megatron-lm refuses it and names Megatron-LM's equivalent
    (the EP all-to-all overlap) and torchtitan's DualPipeV; planning without --emit is not refused."""
    m, cluster, t, _ = _deepseek("DualPipe")
    emitted = [v for v in model_violations(m, t, cluster, Target("megatron-lm"), emit=True)
               if v.reason == Reason.PIPELINE_SCHEDULE]
    assert emitted and "--overlap ep-a2a" in emitted[0].detail and "DualPipeV" in emitted[0].detail
    assert not [v for v in model_violations(m, t, cluster, Target("megatron-lm"), emit=False)
                if v.reason == Reason.PIPELINE_SCHEDULE]


def test_cli_notes_and_refuses(tmp_path):
    base = [sys.executable, "-m", "planner", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "H800",
            "--framework", "megatron-lm", "--precision", "fp8", "--global-batch", "15360", "--pp-schedule", "DualPipe",
            "--explain", "tp=1,pp=16,mbs=1,zero=1,ep=64,recompute=modules:layernorm+mla_up_proj"]
    planned = subprocess.run(base, capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    assert "DualPipe is DeepSeek-V3's schedule" in planned.stderr
    emitted = subprocess.run(base + ["--emit", "megatron-lm", "--out", str(tmp_path / "run")], capture_output=True,
                             text=True)
    assert emitted.returncode == 2
    assert emitted.stderr.count("\n") == 1 and "Megatron-LM cannot run DualPipe" in emitted.stderr


def test_schedule_needs_its_framework():
    with pytest.raises(InputError, match="DeepSeek's schedule"):
        TrainingSpec(global_batch=8, seq_len=128, framework="fsdp", pp_schedule="DualPipe")
    with pytest.raises(InputError, match="torchtitan's"):
        TrainingSpec(global_batch=8, seq_len=128, framework="megatron-lm", pp_schedule="DualPipeV")


def test_torchtitan_runs_dualpipev():
    """torchtitan's DualPipeV (torch ScheduleDualPipeV): exactly two stages a rank, micro-batches at least the
    stages; with EP it refuses activation checkpointing (dual_pipe_v.py); emitted as its pipeline_parallel_schedule."""
    from planner import fsdp_parallel
    from planner.emit import RunSetup, render

    m = load_model("llama3-70b")
    t = TrainingSpec(global_batch=256, seq_len=8192, framework="fsdp", pp_schedule="DualPipeV")
    c = Candidate(tp=8, pp=4, dp=2, mbs=1, gas=128, zero=3, sp=True, vpp=2)
    assert fsdp_parallel.schedule_violations(m, c, t) == []
    assert "virtual_pipeline" in [r for r, _ in fsdp_parallel.schedule_violations(m, replace(c, vpp=4), t)]
    assert "microbatches_lt_stages" in [r for r, _ in fsdp_parallel.schedule_violations(m, replace(c, gas=4), t)]
    moe_c = replace(c, ep=2, recompute="full")
    assert "framework_limit" in [r for r, _ in fsdp_parallel.schedule_violations(m, moe_c, t)]
    assert fsdp_parallel.bubble_slots("DualPipeV", 4, 2, "none") == pytest.approx(1.0)
    toml = render(RunSetup(model=m, cluster=make_cluster(gpu="H100-SXM", gpus=64), training=t, candidate=c), "fsdp",
                  torchtitan_version="0.2.2")["torchtitan.toml"]
    assert 'pipeline_parallel_schedule = "DualPipeV"' in toml


def test_probe_runs_the_nearest_torch_schedule():
    from planner.fsdp_parallel import probe_schedule

    assert probe_schedule(TrainingSpec(global_batch=8, seq_len=128, framework="megatron-lm",
                                       pp_schedule="DualPipe")) == "1F1B"
    assert probe_schedule(TrainingSpec(global_batch=8, seq_len=128, framework="fsdp",
                                       pp_schedule="DualPipeV")) == "Interleaved1F1B"
