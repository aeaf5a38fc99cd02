"""`tune --probe auto` (the default) measures the program the plan emits for when it can run here, else the stand-in,
and says which one measured (search.probe_choice). Multi-process: torchrun per probe.

- Megatron-LM from ``--megatron-path``: a checkout whose ``pretrain_gpt.py`` is tests/fake_megatron.py, run with the
  emitted arguments and Megatron-LM's mock-data arguments;
- torchtitan: tests/fake_torchtitan (a ``torchtitan`` package whose ``train`` prints torchtitan's metrics lines) for
  the whole loop, and the real torchtitan 0.3.0 trainer (build/torchtitan-0.3.0) on the probe's files: on a
  machine without CUDA it loads the probe's config module and stops at ``torch.cuda.set_device`` in
  Trainer.__init__, recorded as a crash saying so; with CUDA it measures (a lent GPU's check);
- the stand-in, saying why, when torchtitan cannot run on this CPU.

    flock /tmp/plantune-slow.lock python -m pytest -q -m slow tests/test_tune_fwprobe.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
FAKE_MEGATRON = ROOT / "tests" / "fake_megatron.py"
FAKE_TORCHTITAN = ROOT / "tests" / "fake_torchtitan"
TT3 = Path(os.environ.get("TORCHTITAN3_SRC", ROOT / "build" / "torchtitan-0.3.0"))
TT3_INSTALLED = (TT3 / "torchtitan" / "trainer.py").exists()
TINY_TIED_YAML = "name: tinyt\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 128\nseq_len: 32\n"
TINY_LLAMA_YAML = ("name: tinyl\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 192\nvocab: 256\n"
                   "seq_len: 32\ntied_embeddings: false\nnorm: rmsnorm\nposition: rope\nbias: false\nglu: true\n")


def tune(tmp: Path, model_yaml: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    model = tmp / "model.yaml"
    model.write_text(model_yaml)
    argv = [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "2",
            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32", "--precision", "fp32",
            "--recompute", "none", "--max-mbs", "4", "--no-rampup", "--probe-device", "cpu", "--probe-steps", "3",
            "--probe-warmup", "1", "--confirm-top", "0", "--study", "fw", "--storage", f"sqlite:///{tmp}/tune.db",
            "--workdir", str(tmp / "runs"), "--no-progress", "--format", "json", *extra]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={**os.environ, **(env or {})})


def probed(out: dict) -> list[dict]:
    return [t for t in out["trials"] if t.get("program")]


@pytest.mark.slow
def test_auto_measures_megatron_lm_from_megatron_path_on_mock_data(tmp_path):
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    shutil.copy(FAKE_MEGATRON, checkout / "pretrain_gpt.py")
    done = tune(tmp_path, TINY_TIED_YAML, "--framework", "megatron-lm", "--zero", "0", "--megatron-path",
                str(checkout), "--max-probes", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"probes measured by Megatron-LM: --megatron-path {checkout.resolve()}, mock data" in done.stderr
    out = json.loads(done.stdout)
    ok = [t for t in probed(out) if t["outcome"] == "ok"]
    assert len(ok) == 2 and {t["program"] for t in ok} == {"megatron-lm"}
    assert all(t["measured_step_s"] == pytest.approx(0.1, rel=0.2) for t in ok)     # the fake's 100 ms steps
    for command in (tmp_path / "runs").glob("trial-*/command.json"):
        argv = json.loads(command.read_text())["argv"]
        assert str((checkout / "pretrain_gpt.py").resolve()) in argv and "--use-mcore-models" in argv
        i = argv.index("--mock-data")
        assert argv[i:i + 5] == ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]


@pytest.mark.slow
def test_probe_torchtitan_runs_the_trainer_on_the_emitted_config(tmp_path):
    done = tune(tmp_path, TINY_LLAMA_YAML, "--framework", "fsdp", "--probe", "torchtitan", "--max-probes", "2",
                env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(FAKE_TORCHTITAN)]),
                     "FAKE_TORCHTITAN_STEP_MS": "60"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "probes measured by torchtitan: --probe torchtitan (torchtitan 0.3.0)" in done.stderr
    out = json.loads(done.stdout)
    ok = [t for t in probed(out) if t["outcome"] == "ok"]
    assert len(ok) == 2 and {t["program"] for t in ok} == {"torchtitan"}
    assert all(t["measured_step_s"] == pytest.approx(0.06, rel=0.25) for t in ok)
    for trial in (tmp_path / "runs").glob("trial-*"):
        if (trial / "result.json").is_file():
            assert "import plantune_torchtitan as job" in (trial / "plantune_probe.py").read_text()
            assert "def plantune() -> Trainer.Config" in (trial / "plantune_torchtitan.py").read_text()


@pytest.mark.slow
def test_auto_on_this_cpu_falls_back_to_the_stand_in_and_says_why(tmp_path):
    """torchtitan importable (the fake) but probes on the CPU: the stand-in measures, and every output says why."""
    done = tune(tmp_path, TINY_LLAMA_YAML, "--framework", "fsdp", "--zero", "0", "--max-probes", "1",
                env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(FAKE_TORCHTITAN)])})
    assert done.returncode == 0, done.stderr[-3000:]
    why = "torchtitan's trainer needs a CUDA device and probes run on the cpu"
    assert f"probes measured by stand-in (plantune's torch GPT): {why}" in done.stderr
    trials = probed(json.loads(done.stdout))
    assert trials and all(t["program"] == "stand-in" and t["program_reason"].startswith(why) for t in trials)
    import optuna

    study = optuna.load_study(study_name="fw", storage=f"sqlite:///{tmp_path}/tune.db")
    assert study.user_attrs["probe_program"]["program"] == "stand-in"
    report = subprocess.run([sys.executable, "-m", "search.cli", "report", "--study", "fw", "--workdir",
                             str(tmp_path / "runs"), "--storage", f"sqlite:///{tmp_path}/tune.db", "--no-plots"],
                            cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"tune: measured by: stand-in (plantune's torch GPT) (1 probe: {why}" in report.stdout


@pytest.mark.slow
@pytest.mark.skipif(not TT3_INSTALLED, reason="torchtitan 0.3.0 is not installed in build/torchtitan-0.3.0")
def test_real_torchtitan_trainer_on_the_probe_files(tmp_path, monkeypatch):
    """torchtitan 0.3.0's own ``torchtitan.train`` on the probe's files. Without CUDA it gets through its config
    manager (our probe module, the emitted module, the mock data classes imported) into Trainer.__init__ and stops at
    torch.cuda.set_device: a crash whose reason says torchtitan needs CUDA. With CUDA it measures the steps."""
    import torch

    from planner import make_cluster
    from planner.model import load_model
    from planner.space import Candidate, TrainingSpec
    from probes.backend import LocalBackend
    from probes.torchtitan import TorchtitanProbe

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TT3), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "m.yaml").write_text(TINY_LLAMA_YAML)
    cuda = torch.cuda.is_available()
    probe = TorchtitanProbe(LocalBackend(), cluster=make_cluster(gpu="H100-SXM" if cuda else "CPU", gpus=1,
                                                                 gpus_per_node=1),
                            training=TrainingSpec(global_batch=2, seq_len=32, precision="bf16" if cuda else "fp32",
                                                  framework="fsdp"), max_local_procs=1)
    result = probe.run_candidate(load_model(str(tmp_path / "m.yaml")),
                                 Candidate(tp=1, pp=1, dp=1, mbs=2, gas=1, recompute="none", zero=0),
                                 precision="bf16" if cuda else "fp32", workdir=tmp_path / "trial-0000",
                                 timeout_s=HANG_GUARD_S, warmup_iters=1, measure_iters=2)
    log = (tmp_path / "trial-0000" / "torchrun.stderr").read_text() + \
        (tmp_path / "trial-0000" / "torchrun.stdout").read_text()
    if cuda:
        assert result.status == "ok", result.reason
        assert len(result.step_times_s) == 2 and result.memory_kind == "cuda_max_reserved"
        return
    assert result.status == "crash"
    assert "_cuda_setDevice" in result.reason and "torchtitan's trainer needs a CUDA device" in result.reason
    assert "torchtitan/trainer.py" in log and "device_module.set_device(self.device)" in log
    assert "config.build()" in log             # ConfigManager parsed plantune_probe and built Trainer.Config first
