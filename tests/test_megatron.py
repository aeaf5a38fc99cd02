"""The Megatron-DeepSpeed probe: log parsing (real lines), command rendering, end-to-end runs.

    python -m pytest tests/test_megatron.py -q
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from planner.flops import model_flops_per_iteration, tflops_per_gpu
from planner.model import get_preset
from planner.space import Candidate
from probes.backend import LocalBackend, ProbeBackend
from probes.megatron import (MegatronProbe, parse_iteration_line, parse_log, parse_memory_line, probe_args,
                             render_command, split_template, summarize, worker_argv)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest_probes import PROBE_TIMEOUT_S, no_process_left, tiny_model, tiny_spec  # noqa: E402

LOGS = Path(__file__).resolve().parent / "fixtures" / "megatron_logs"
FAKE = Path(__file__).resolve().parent / "fake_megatron.py"


def _log(name: str) -> str:
    return (LOGS / name).read_text()


# -- parsing ------------------------------------------------------------------------------------------

def test_bloom_line_from_the_facts_sheet():
    line = ("iteration 12695/ 115311 | consumed samples: 9841584 | elapsed time per iteration (s): 104.70 | "
            "learning rate: 5.969E-05 | global batch size: 2048 | lm loss: 2.463556E+00 | "
            "samples per second: 19.561 | TFLOPs: 149.77 |")
    it = parse_iteration_line(line)
    assert it is not None
    assert (it.iteration, it.total, it.format) == (12695, 115311, "bigscience")
    assert it.step_time_s == pytest.approx(104.70)
    assert it.global_batch == 2048
    assert it.samples_per_s == pytest.approx(19.561)
    assert it.reported_tflops == pytest.approx(149.77)


def test_bigscience_log_with_torchrun_prefix_and_warmup():
    log = parse_log(_log("bigscience_tr11_176b.log"))
    assert [it.iteration for it in log.iterations] == [94768, 94769, 94770]
    assert all(it.format == "bigscience" for it in log.iterations)
    model = get_preset("176B")
    cand = Candidate(tp=2, pp=36, dp=4, mbs=1, gas=512, recompute="full")
    out = summarize(log, model=model, candidate=cand, global_batch=2048, world=288, warmup_iters=1)
    # the slow first iteration after the restart (178.44 s) is warm-up and is skipped
    assert out["step_times_s"] == pytest.approx([141.94, 141.22])
    assert out["step_time_median_s"] == pytest.approx(141.58)
    assert out["samples_per_s"] == pytest.approx(2048 / 141.58)
    # model TFLOPs from planner.flops (factor 3), not the fork's recompute-inflated figure (factor 4)
    expected = tflops_per_gpu(model_flops_per_iteration(model, 2048), 141.58, 288)
    assert out["model_tflops_per_device"] == pytest.approx(expected)
    reported = out["extra"]["reported_tflops"]
    assert reported == pytest.approx((147.29 + 148.04) / 2)
    assert out["model_tflops_per_device"] / reported == pytest.approx(0.75, rel=0.01)
    assert out["hardware_tflops_per_device"] == pytest.approx(reported, rel=0.01)


def test_bigscience_four_decimals():
    (it,) = parse_log(_log("bigscience_13b_jube.log")).iterations
    assert it.step_time_s == pytest.approx(7.2310)
    assert it.global_batch == 96


def test_microsoft_log_ms_tgs_and_memory():
    log = parse_log(_log("microsoft_gpt3_175b.log"))
    assert [it.iteration for it in log.iterations] == [5, 6]
    first = log.iterations[0]
    assert first.format == "microsoft"
    assert first.step_time_s == pytest.approx(344.6561)
    assert first.tokens_per_gpu_per_s == pytest.approx(142.612)
    assert first.global_batch == 1536
    (mem,) = log.memory
    assert (mem.rank, mem.after_iterations) == (0, 1)
    assert mem.max_allocated_mb == pytest.approx(41299.50146484375)
    assert mem.max_reserved_mb == pytest.approx(46764.0)
    # DeepSpeed's "[Rank 0] time (ms) | fwd_microstep: ..." line is neither an iteration nor a memory line
    assert log.oom_line is None


def test_megatron_lm_log_timestamps_and_throughput():
    log = parse_log(_log("megatron_lm.log"))
    assert [it.iteration for it in log.iterations] == [1, 5, 10]
    by_iter = {it.iteration: it for it in log.iterations}
    assert by_iter[10].format == "megatron-lm"
    assert by_iter[10].step_time_s == pytest.approx(13.0353)
    assert by_iter[10].reported_tflops == pytest.approx(812.5)
    assert by_iter[10].lm_loss is None  # that run logged no lm loss
    assert log.memory[0].max_allocated_mb == pytest.approx(63359.77001953125)


def test_memory_line_alone():
    mem = parse_memory_line("[default0]:[Rank 3] (after 10 iterations) memory (MB) | allocated: 1.5 | "
                            "max allocated: 2.5 | reserved: 4.0 | max reserved: 4.0")
    assert mem is not None and (mem.rank, mem.after_iterations, mem.max_allocated_mb) == (3, 10, 2.5)
    assert parse_memory_line("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.0") is None


def test_oom_detected():
    log = parse_log(_log("oom.log"))
    assert log.oom_line is not None and "CUDA out of memory" in log.oom_line
    assert not log.oom_line.startswith("[default0]")


def test_non_iteration_lines_ignored():
    assert parse_iteration_line("iteration 3 of the loop | nothing here") is None
    assert parse_iteration_line("[default0]: iteration 3/ 10 | consumed samples: 4 |") is None


# -- the command ----------------------------------------------------------------------------------------

def test_template_split_and_render_never_uses_a_shell():
    tokens = split_template("python pretrain_gpt.py {args} --data-path '/data/my corpus' --note '$(rm -rf /)' "
                            "--deepspeed_config={ds_config} --tag n{nproc}")
    argv = render_command(tokens, {"args": ["--num-layers", "4", "--bf16"], "ds_config": "/w/ds.json",
                                   "nproc": "8"})
    assert argv == ["python", "pretrain_gpt.py", "--num-layers", "4", "--bf16", "--data-path", "/data/my corpus",
                    "--note", "$(rm -rf /)", "--deepspeed_config=/w/ds.json", "--tag", "n8"]


def test_template_errors():
    with pytest.raises(ValueError, match=r"\{args\}"):
        split_template("python pretrain_gpt.py --data-path x")
    with pytest.raises(ValueError, match="unknown placeholder"):
        render_command(split_template("python p.py {args} {nope}"), {"args": []})
    with pytest.raises(ValueError, match="stand alone"):
        render_command(["--x={args}"], {"args": ["a", "b"]})
    with pytest.raises(ValueError, match="Python interpreter"):
        worker_argv(["bash", "run.sh"])
    with pytest.raises(ValueError, match="unknown placeholder"):  # at construction, before any probe
        MegatronProbe("python p.py {args} --x {data}", LocalBackend(nproc=1))
    with pytest.raises(ValueError, match="Python interpreter"):
        MegatronProbe("deepspeed pretrain_gpt.py {args}", LocalBackend(nproc=1))
    assert worker_argv(["/usr/bin/python3.11", "-u", "pretrain_gpt.py", "--x"]) == ["pretrain_gpt.py", "--x"]
    assert worker_argv(["python", "-m", "megatron.train", "--x"]) == ["-m", "megatron.train", "--x"]


def _bloom_like_probe(flavor: str = "bigscience") -> MegatronProbe:
    # tune passes the plan's flash_attention (True by default); the bigscience fork has none
    return MegatronProbe(f"python {FAKE} {{args}} --data-path /nonexistent", LocalBackend(nproc=2), flavor,
                         flash_attention=True)


def test_probe_args_are_the_emitters_probe_variant(tmp_path):
    model = tiny_model(tied_embeddings=True)
    cand = Candidate(tp=1, pp=2, dp=1, mbs=2, gas=4, recompute="full")
    setup = _bloom_like_probe().probe_setup(model, cand, precision="bf16", procs=2)
    args = probe_args(setup, "bigscience", train_iters=7, ds_config_path=tmp_path / "ds_config.json")
    flat = {a[0]: a[1:] for a in args}
    assert flat["--train-iters"] == ("7",)
    assert flat["--log-interval"] == ("1",)
    assert int(flat["--eval-interval"][0]) > 7
    assert flat["--deepspeed_config"] == (str(tmp_path / "ds_config.json"),)
    assert flat["--pipeline-model-parallel-size"] == ("2",)
    assert flat["--global-batch-size"] == ("8",)
    assert "--checkpoint-activations" in flat
    assert not {"--rampup-batch-size", "--train-samples", "--save"} & set(flat)
    assert setup.training.flash_attention is False
    ms = MegatronProbe(f"python {FAKE} {{args}}", LocalBackend(nproc=2), "microsoft")
    ms_setup = ms.probe_setup(model, cand, precision="bf16", procs=2)
    assert ("--use-flash-attn-v2",) in probe_args(ms_setup, "microsoft", train_iters=7, ds_config_path=tmp_path)
    # the plan's --attention-kernel fa1 reaches the probe's arguments (Megatron-DeepSpeed's flash-attn v1 flag)
    fa1 = MegatronProbe(f"python {FAKE} {{args}}", LocalBackend(nproc=2), "microsoft", attention_kernel="fa1")
    fa1_args = probe_args(fa1.probe_setup(model, cand, precision="bf16", procs=2), "microsoft", train_iters=7,
                          ds_config_path=tmp_path)
    assert ("--use-flash-attn-v1",) in fa1_args and ("--use-flash-attn-v2",) not in fa1_args


def test_megatron_lm_probes_run_plan_emit_megatron_lms_arguments(tmp_path):
    """--framework megatron-lm --probe megatron: NVIDIA Megatron-LM's pretrain_gpt.py, no DeepSpeed config."""
    probe = MegatronProbe(f"python {FAKE} {{args}} --mock-data", LocalBackend(nproc=2), "megatron-lm")
    cand = Candidate(tp=2, pp=1, dp=1, mbs=2, gas=4, recompute="selective", sp=True)
    setup = probe.probe_setup(tiny_model(), cand, precision="bf16", procs=2)
    assert setup.training.framework == "megatron-lm"
    args = probe_args(setup, "megatron-lm", train_iters=7)
    flat = {a[0]: a[1:] for a in args}
    assert flat["--train-iters"] == ("7",) and flat["--log-interval"] == ("1",) and int(flat["--eval-interval"][0]) > 7
    assert {"--use-mcore-models", "--sequence-parallel", "--untie-embeddings-and-output-weights"} <= set(flat)
    assert flat["--tensor-model-parallel-size"] == ("2",) and flat["--recompute-granularity"] == ("selective",)
    assert not {"--deepspeed", "--deepspeed_config", "--rampup-batch-size", "--train-samples"} & set(flat)
    argv = probe.command_for(setup, workdir=tmp_path, train_iters=7)
    assert argv[-1] == "--mock-data" and not (tmp_path / "ds_config.json").exists()
    with pytest.raises(ValueError, match="Megatron-LM takes no DeepSpeed config"):
        MegatronProbe(f"python {FAKE} {{args}} --deepspeed_config {{ds_config}}", LocalBackend(nproc=2), "megatron-lm")


def test_probe_setup_keeps_one_replica_when_the_backend_is_smaller():
    cand = Candidate(tp=1, pp=2, dp=8, mbs=1, gas=16)
    setup = _bloom_like_probe().probe_setup(tiny_model(tied_embeddings=True), cand, precision="bf16", procs=2)
    assert (setup.candidate.dp, setup.candidate.gas, setup.training.global_batch) == (1, 16, 16)
    assert setup.cluster.world_size == 2


# -- end to end through the local backend (torchrun + tests/fake_megatron.py) -----------------------------

@pytest.mark.slow
@pytest.mark.parametrize("fmt,flavor", [("bigscience", "bigscience"), ("microsoft", "microsoft"),
                                        ("megatron-lm", "microsoft"), ("megatron-lm", "megatron-lm")])
def test_end_to_end_local(tmp_path, fmt, flavor):
    probe = MegatronProbe(f"python -u {FAKE} {{args}} --data-path /nonexistent --fake-format {fmt} "
                          "--fake-step-ms 120", LocalBackend(nproc=2), flavor)
    spec = tiny_spec(model=tiny_model(tied_embeddings=True), tp=1, pp=2, dp=1, mbs=2, gas=2, precision="bf16",
                     warmup_steps=1, steps=3)
    result = probe.run(spec, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "ok", result.reason
    assert result.extra["log_format"] == fmt
    assert len(result.step_times_s) == 3  # 4 iterations, the first skipped
    assert result.step_time_median_s == pytest.approx(0.12, rel=0.05)
    assert result.world_size == 2
    assert result.samples_per_s == pytest.approx(4 / result.step_time_median_s)
    model = tiny_model(tied_embeddings=True)
    assert result.model_tflops_per_device == pytest.approx(
        tflops_per_gpu(model_flops_per_iteration(model, 4), result.step_time_median_s, 2))
    assert result.peak_memory_bytes_per_rank and result.memory_kind == "cuda_max_allocated"
    assert result.stable is True and result.step_time_cv < 0.05
    if flavor == "megatron-lm":
        assert not (tmp_path / "ds_config.json").exists()
        assert "--use-mcore-models" in (tmp_path / "args.txt").read_text()
    else:
        ds = json.loads((tmp_path / "ds_config.json").read_text())
        batch = (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"])
        assert batch == (4, 2, 2)
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "ok"


@pytest.mark.slow
def test_oom_and_crash_and_timeout_local(tmp_path):
    spec = tiny_spec(model=tiny_model(tied_embeddings=True), dp=2, mbs=1, gas=2, precision="bf16")

    def run(extra: str, name: str, timeout_s: float = 60):
        probe = MegatronProbe(f"python {FAKE} {{args}} --fake-step-ms 50 {extra}", LocalBackend(nproc=2))
        return probe.run(spec, workdir=tmp_path / name, timeout_s=timeout_s)

    oom = run("--fake-oom-at 2", "oom")
    assert oom.status == "oom" and "CUDA out of memory" in oom.reason
    crash = run("--fake-crash-at 1", "crash")
    assert crash.status == "crash" and "crash requested" in crash.reason
    hang = run("--fake-hang-at 1", "hang", timeout_s=8)
    assert hang.status == "timeout"
    assert hang.extra["pids"] and no_process_left(hang) == []


@pytest.mark.slow
def test_layout_the_fork_refuses_is_a_crash_with_its_message(tmp_path):
    # ds_config.json edited to disagree: the fake (like DeepSpeed) asserts at start-up
    probe = MegatronProbe(f"python {FAKE} {{args}} --global-batch-size 6", LocalBackend(nproc=2))
    spec = tiny_spec(model=tiny_model(tied_embeddings=True), dp=2, mbs=1, gas=2, precision="bf16")
    result = probe.run(spec, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "crash"
    assert "AssertionError" in result.reason


@pytest.mark.slow
def test_any_backend_without_run_command_runs_here_one_replica_when_too_big(tmp_path):
    class Wrapper(ProbeBackend):  # e.g. tune's one-node wrapper around LocalBackend: no run_command of its own
        name = "wrapper"

        def run(self, spec, *, workdir, timeout_s):   # the probe runs Megatron here, never through this
            raise AssertionError("MegatronProbe must run the command itself on a backend without run_command")

    probe = MegatronProbe(f"python {FAKE} {{args}} --fake-step-ms 50", Wrapper(), max_local_procs=2)
    spec = tiny_spec(model=tiny_model(tied_embeddings=True), tp=1, pp=2, dp=4, mbs=1, gas=2, precision="bf16")
    result = probe.run(spec, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "ok", result.reason
    assert result.world_size == 2 and result.reduced  # one DP replica of the 8-rank candidate
    assert result.extra["global_batch"] == 2  # MBS 1 x DP 1 x GAS 2
    # tune ranks a reduced probe by its projection: same step time, the full candidate's batch and world
    assert result.projected["step_time_s"] == result.step_time_median_s
    assert result.projected["world_size"] == 8 and result.projected["global_batch"] == 8


def test_invalid_candidate_is_refused_before_running(tmp_path):
    probe = _bloom_like_probe()
    spec = tiny_spec(model=tiny_model(), dp=2, precision="bf16")  # untied embeddings: not in the bigscience fork
    result = probe.run(spec, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "invalid" and "untied" in result.reason


def test_a_reduced_run_projects_the_full_candidate(tmp_path):
    """One DP replica of a DP=4 candidate (issue 10): a projected step time, so tune does not record a crash."""
    from probes.slurm import StepOutcome

    probe = _bloom_like_probe()
    model = tiny_model(tied_embeddings=True)
    full = Candidate(tp=1, pp=2, dp=4, mbs=1, gas=2, recompute="full")
    setup = probe.probe_setup(model, full, precision="bf16", procs=2)
    log = (LOGS / "microsoft_gpt3_175b.log").read_text()
    step = StepOutcome(returncode=0, timed_out=False, stdout=log, stderr="", wall_s=1.0, hosts=("localhost",),
                       world=2, job_id="", step_name="")
    result = probe._result(step, setup, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S, warmup_iters=1, reduced=True,
                           max_cv=1.0, full=full)
    assert result.status == "ok" and result.reduced
    assert result.projected["step_time_s"] == result.step_time_median_s > 0
    assert result.projected["world_size"] == 8 and result.projected["global_batch"] == 8
    gbs_tflops = tflops_per_gpu(model_flops_per_iteration(model, 8), result.step_time_median_s, 8)
    assert result.projected["model_tflops_per_device"] == pytest.approx(gbs_tflops)
