"""The emitted torchtitan.toml parsed by torchtitan's own ConfigManager (v0.2.2, pinned in .ci/run, installed into
build/torchtitan with tyro; skipped where it is not installed), the way tests/test_megatron_parser.py runs
Megatron-LM's parse_args. torchtitan's package __init__ imports its quantization components (torchao); the driver
loads torchtitan.config without it, exactly as shipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner import load_model, make_cluster
from planner.emit import emit, fsdp
from planner.space import Candidate, TrainingSpec
from planner.emit.setup import RunSetup

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(os.environ.get("TORCHTITAN_SRC", ROOT / "build" / "torchtitan"))
pytestmark = pytest.mark.skipif(not (SRC / "torchtitan" / "config" / "manager.py").exists(),
                                reason=f"torchtitan {fsdp.TORCHTITAN_VERSION} not installed in {SRC} (.ci/run)")

DRIVER = """
import dataclasses, json, sys, types
sys.path.insert(0, sys.argv[1])
pkg = types.ModuleType("torchtitan"); pkg.__path__ = [sys.argv[1] + "/torchtitan"]; sys.modules["torchtitan"] = pkg
from torchtitan.config import ConfigManager
cfg = ConfigManager().parse_args(["--job.config_file", sys.argv[2]])
print(json.dumps(dataclasses.asdict(cfg), default=str))
"""


def _setup(model: str, gpus: int, cand: Candidate, **training) -> RunSetup:
    m = load_model(model)
    t = TrainingSpec(global_batch=cand.mbs * cand.dp * cand.gas, seq_len=m.seq_len, framework="fsdp", **training)
    return RunSetup(model=m, cluster=make_cluster(gpu="H100-SXM", gpus=gpus), training=t, candidate=cand)


CASES = {
    "70b-tp8-fsdp32": _setup("llama3-70b", 256, Candidate(tp=8, pp=1, dp=32, mbs=2, gas=8, recompute="full", zero=3,
                                                          sp=True), precision="fp8", fp8_recipe="tensorwise",
                             torch_compile=True, async_tp=True),
    "405b-tp8-pp8-interleaved": _setup("llama3-405b", 512, Candidate(tp=8, pp=8, dp=8, mbs=1, gas=16, vpp=2,
                                                                     recompute="full", zero=3, sp=True)),
    "8b-fsdp-rowwise-float8": _setup("llama3-8b", 8, Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, recompute="selective",
                                                                zero=3), precision="fp8", fp8_recipe="rowwise",
                                     torch_compile=True),
    "llama2-7b-hsdp-custom-flavor": _setup("llama2-7b", 32, Candidate(tp=1, pp=1, dp=32, mbs=2, gas=4,
                                                                      recompute="selective", zero=3, hybrid=True)),
}


@pytest.mark.parametrize("name", CASES)
def test_torchtitan_parses_the_emitted_config(name, tmp_path) -> None:
    setup = CASES[name]
    emit(setup, "fsdp", tmp_path, torchtitan_version=fsdp.TORCHTITAN_VERSION)
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SRC), str(tmp_path / fsdp.FILE_NAME)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = json.loads(proc.stdout.strip().splitlines()[-1])
    c, par = setup.candidate, cfg["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (
        c.tp, c.pp, c.cp)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == c.dp
    assert cfg["training"]["global_batch_size"] == setup.training.global_batch
    assert cfg["activation_checkpoint"]["mode"] == c.recompute
    assert cfg["compile"]["enable"] == setup.training.torch_compile
    if c.pp > 1:
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if c.vpp > 1 else "1F1B")
        assert cfg["training"]["local_batch_size"] == c.mbs * c.gas
        assert par["pipeline_parallel_microbatch_size"] == c.mbs
    flavor = fsdp.LLAMA3_FLAVORS.get(setup.model.name, fsdp.CUSTOM_FLAVOR)
    assert cfg["model"]["flavor"] == flavor
    if flavor == fsdp.CUSTOM_FLAVOR:
        assert cfg["experimental"]["custom_import"] == "plantune_model"
        assert (tmp_path / fsdp.MODEL_FILE).exists()
    assert cfg["training"]["dataset"].startswith(fsdp.PLACEHOLDER)   # the launcher fills it
    if setup.training.precision == "fp8":
        assert cfg["model"]["converters"] == ["quantize.linear.float8"]
        assert cfg["quantize"]["linear"]["float8"]["recipe_name"] == setup.training.fp8_recipe


def test_model_args_give_the_model_ffn() -> None:
    for name in ("llama2-7b", "llama2-70b", "llama3-8b", "llama3-405b"):
        m = load_model(name)
        assert fsdp.model_args(m).ffn_hidden == m.ffn_hidden, name


def test_launcher_refuses_unset_placeholders(tmp_path) -> None:
    setup = CASES["llama2-7b-hsdp-custom-flavor"]
    emit(setup, "fsdp", tmp_path, torchtitan_version=fsdp.TORCHTITAN_VERSION)
    env = {k: v for k, v in os.environ.items() if k not in ("DATASET", "DATASET_PATH", "HF_ASSETS_PATH")}
    proc = subprocess.run(["bash", str(tmp_path / fsdp.LAUNCHER)], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "set DATASET" in proc.stderr
    # filled: the config it would run holds no placeholder; PYTHON=echo prints the command instead of running it
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")} | {
        "DATASET": "c4", "DATASET_PATH": "/data/c4", "HF_ASSETS_PATH": "/assets/tok", "PYTHON": "echo",
        "NODE_RANK": "3", "MASTER_ADDR": "node0", "TRAIN_STEPS": "1000"}   # no token budget: the launcher asks
    proc = subprocess.run(["bash", str(tmp_path / fsdp.LAUNCHER)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    cl = setup.cluster
    assert proc.stdout.split() == ["-m", "torch.distributed.run", "--nnodes", str(cl.nodes), "--nproc_per_node",
                                   str(cl.gpus_per_node), "--node_rank", "3", "--rdzv_backend", "c10d",
                                   "--rdzv_endpoint", "node0:29500", "-m", "torchtitan.train", "--job.config_file",
                                   str(tmp_path / "outputs" / fsdp.FILE_NAME), "--training.steps", "1000"]
    text = (tmp_path / "outputs" / fsdp.FILE_NAME).read_text()
    assert all(fsdp.PLACEHOLDER not in line for line in text.splitlines() if not line.startswith("#"))
    assert 'dataset_path = "/data/c4"' in text
