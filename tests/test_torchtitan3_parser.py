"""The emitted torchtitan 0.3.0 job loaded by torchtitan 0.3.0's own ConfigManager: ``--module plantune_torchtitan
--config plantune`` plus the launcher's CLI overrides, exactly as ``python -m torchtitan.train`` parses them (its
config function builds Trainer.Config from torchtitan's own classes, then tyro applies the overrides and
Trainer.Config.__post_init__ validates). .ci/run pins 0.3.0 and the packages its config import chain needs into
build/torchtitan-0.3.0 (TORCHTITAN3_SRC); skipped where that is not installed. Nothing is fetched at test time."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import load_model, make_cluster
from planner.emit import emit, fsdp, torchtitan_py
from planner.emit.setup import RunSetup
from planner.errors import InputError
from planner.space import Candidate, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(os.environ.get("TORCHTITAN3_SRC", ROOT / "build" / "torchtitan-0.3.0"))
INSTALLED = (SRC / "torchtitan" / "config" / "manager.py").exists()

# The driver imports torchtitan once and loads each job in turn (its directory first on sys.path, the previous job's
# module forgotten), printing per job what torchtitan made of it: the sections as its dataclasses hold them, the AC
# policy's class, the model spec's flavor and the model it builds (layers, widths), or torchtitan's own error.
DRIVER = """
import dataclasses, importlib, json, sys, traceback
sys.path.insert(0, sys.argv[1])
from torchtitan.config import ConfigManager
for line in sys.stdin:
    job = json.loads(line)
    sys.path.insert(0, job["dir"])
    for name in [n for n in sys.modules if n == job["module"] or n.startswith(job["module"] + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        cfg = ConfigManager().parse_args(job["argv"])
        m = cfg.model_spec.model
        layer = m.layers[0]
        out = {
            "parallelism": dataclasses.asdict(cfg.parallelism), "training": dataclasses.asdict(cfg.training),
            "compile": dataclasses.asdict(cfg.compile), "checkpoint": dataclasses.asdict(cfg.checkpoint),
            "dataloader": {"type": type(cfg.dataloader).__qualname__, "dataset": cfg.dataloader.dataset,
                           "dataset_path": cfg.dataloader.dataset_path},
            "hf_assets_path": cfg.hf_assets_path,
            "ac": type(cfg.activation_checkpoint).__qualname__,
            "flavor": cfg.model_spec.flavor,
            "model": {"layers": len(m.layers), "dim": m.dim, "vocab": m.vocab_size,
                      "ffn": layer.feed_forward.w1.out_features, "heads": layer.attention.n_heads,
                      "kv_heads": layer.attention.n_kv_heads, "eps": layer.ffn_norm.eps,
                      "rope_theta": layer.attention.rope.theta, "rope_scaling": layer.attention.rope.scaling},
            "lr": cfg.optimizer.param_groups[0].optimizer_kwargs["lr"],
        }
        print(json.dumps({"id": job["id"], "config": out}), flush=True)
    except BaseException:
        print(json.dumps({"id": job["id"], "error": traceback.format_exc()}), flush=True)
    finally:
        sys.path.remove(job["dir"])
"""


def _setup(model: str, gpus: int, cand: Candidate, **training) -> RunSetup:
    m = load_model(model)
    t = TrainingSpec(global_batch=cand.mbs * cand.dp * cand.gas, seq_len=m.seq_len, framework="fsdp", **training)
    return RunSetup(model=m, cluster=make_cluster(gpu="H100-SXM", gpus=gpus), training=t, candidate=cand)


CASES = {
    "70b-tp8-fsdp32-async-tp": _setup("llama3-70b", 256, Candidate(tp=8, pp=1, dp=32, mbs=2, gas=8, recompute="full",
                                                                   zero=3, sp=True), torch_compile=True,
                                      async_tp=True),
    "405b-tp8-pp8-interleaved": _setup("llama3-405b", 512, Candidate(tp=8, pp=8, dp=8, mbs=1, gas=16, vpp=2,
                                                                     recompute="full", zero=3, sp=True)),
    "8b-cp4-fsdp": _setup("llama3-8b", 64, Candidate(tp=2, pp=1, dp=8, cp=4, mbs=1, gas=1, recompute="selective",
                                                      zero=3, sp=True)),
    "llama2-7b-hsdp-custom-flavor": _setup("llama2-7b", 32, Candidate(tp=1, pp=1, dp=32, mbs=2, gas=4,
                                                                      recompute="selective", zero=3, hybrid=True)),
    "llama2-7b-grad-op-no-ac": _setup("llama2-7b", 8, Candidate(tp=1, pp=1, dp=8, mbs=1, gas=4, recompute="none",
                                                                 zero=2)),
}
FP8 = _setup("llama3-8b", 8, Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, recompute="selective", zero=3),
             precision="fp8", fp8_recipe="rowwise", torch_compile=True)
FILLED = ["--dataloader.dataset", "c4", "--dataloader.dataset_path", "None", "--hf_assets_path", "/assets/tok"]


JOBS = {**{name: (setup, FILLED) for name, setup in CASES.items()},
        "unfilled": (CASES["8b-cp4-fsdp"], ()), "float8": (FP8, FILLED)}
"""every job the module loads: its setup and the launcher's overrides (none: run without the launcher)"""


@functools.lru_cache(maxsize=None)
def _loaded(root: Path) -> dict[str, dict]:
    """Emit every job under ``root`` and load them all in one interpreter (torchtitan imported once):
    {job: {"config": ...} or {"error": torchtitan's traceback}}."""
    lines = []
    for name, (setup, overrides) in JOBS.items():
        emit(setup, "fsdp", root / name)
        lines.append(json.dumps({"id": name, "dir": str(root / name), "module": torchtitan_py.MODULE,
                                 "argv": ["--module", torchtitan_py.MODULE, "--config", torchtitan_py.CONFIG_FN,
                                          *overrides]}))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SRC)], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"id"')]
    assert [r["id"] for r in results] == list(JOBS), proc.stderr[-3000:]
    return {r["id"]: r for r in results}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict[str, dict]:
    return _loaded(tmp_path_factory.mktemp("torchtitan-jobs"))


def _config(loaded: dict[str, dict], name: str) -> dict:
    assert "config" in loaded[name], loaded[name].get("error", "")[-3000:]
    return loaded[name]["config"]


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason=f"torchtitan {torchtitan_py.VERSION} not installed in {SRC} (.ci/run)")
@pytest.mark.parametrize("name", CASES)
def test_torchtitan_0_3_0_loads_the_emitted_job(name, loaded) -> None:
    setup = CASES[name]
    cfg = _config(loaded, name)
    m, c, t = setup.model, setup.candidate, setup.training
    par, tr = cfg["parallelism"], cfg["training"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (
        c.tp, c.pp, c.cp)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == c.dp
    assert c.tp * c.pp * c.cp * c.dp == setup.cluster.world_size
    if c.hybrid:
        assert par["data_parallel_shard_degree"] == setup.cluster.gpus_per_node
    assert par["fsdp_reshard_after_forward"] == ("never" if c.zero == 2 else "always" if c.pp == 1 else "default")
    assert tr["global_batch_size"] == t.global_batch and tr["seq_len"] == t.seq_len
    if c.pp > 1:
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if c.vpp > 1 else "1F1B")
        assert tr["local_batch_size"] == c.mbs * c.gas and par["pipeline_parallel_microbatch_size"] == c.mbs
        # PP x VPP stages of layers_per_stage, embedding and head counted as the layers the end stages lack
        stages = (m.layers + par["pipeline_parallel_first_stage_less_layers"]
                  + par["pipeline_parallel_last_stage_less_layers"]) / par["pipeline_parallel_layers_per_stage"]
        assert stages == c.pp * c.vpp
        assert tr["disable_cuda_graphs"] is True   # 0.3.0 refuses CUDA graphs under PP
    else:
        assert tr["local_batch_size"] == c.mbs
    assert cfg["ac"] == {"full": "FullAC.Config", "selective": "SelectiveAC.Config", "none": "NoneType"}[c.recompute]
    assert cfg["compile"]["enable"] == (t.torch_compile or t.async_tp)
    assert cfg["compile"]["enable_async_tensor_parallel"] == t.async_tp
    assert cfg["checkpoint"]["enable"] is True
    # the launcher's overrides replaced every placeholder; the loader is torchtitan's HF text loader
    assert cfg["dataloader"] == {"type": "HuggingFaceTextDataLoader.Config", "dataset": "c4", "dataset_path": None}
    assert cfg["hf_assets_path"] == "/assets/tok"
    flavor = fsdp.LLAMA3_FLAVORS.get(m.name, fsdp.CUSTOM_FLAVOR)
    assert cfg["flavor"] == flavor
    model = cfg["model"]   # torchtitan's model config, built by its own llama3 code: the model plantune planned
    assert (model["layers"], model["dim"], model["vocab"], model["ffn"], model["heads"], model["kv_heads"]) == (
        m.layers, m.hidden, m.vocab, m.ffn_hidden, m.heads, m.kv_heads)
    if flavor == fsdp.CUSTOM_FLAVOR:
        args = fsdp.model_args(m)
        assert (model["eps"], model["rope_theta"], model["rope_scaling"]) == (args.norm_eps, args.rope_theta, "none")


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason=f"torchtitan {torchtitan_py.VERSION} not installed in {SRC} (.ci/run)")
def test_unfilled_placeholders_reach_torchtitan_as_placeholders(loaded) -> None:
    """Run without the launcher, the module's own values are the placeholders (torchtitan cannot mistake them)."""
    cfg = _config(loaded, "unfilled")
    assert cfg["dataloader"]["dataset"] == f"{fsdp.PLACEHOLDER}DATASET"
    assert cfg["hf_assets_path"] == f"{fsdp.PLACEHOLDER}HF_ASSETS_PATH"


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason=f"torchtitan {torchtitan_py.VERSION} not installed in {SRC} (.ci/run)")
def test_float8_reaches_torchtitans_converter(loaded, tmp_path) -> None:
    """The float8 converter is built inside the config function (torchtitan's model_registry converts the model
    config then), so on a machine without torchao and an SM89+ GPU torchtitan itself refuses at load time: the
    deepest check here is that the emitted Float8LinearConverter.Config is accepted and reaches that check."""
    emit(FP8, "fsdp", tmp_path)
    assert "Float8LinearConverter.Config(recipe_name='rowwise'" in (tmp_path / torchtitan_py.FILE_NAME).read_text()
    error = loaded["float8"].get("error", "")
    assert "torchao is not installed" in error or "float8 is only supported on" in error, loaded["float8"]


def test_0_3_0_refuses_what_it_lacks() -> None:
    """tensorwise float8 and layer-wise selective AC went with 0.3.0: one line with the fix, nothing written."""
    tensorwise = _setup("llama3-8b", 8, Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, recompute="full", zero=3),
                        precision="fp8", fp8_recipe="tensorwise")
    with pytest.raises(InputError, match="--fp8-recipe rowwise, or --torchtitan-version 0.2.2"):
        torchtitan_py.files(tensorwise)
    assert "quantize.linear.float8" in fsdp.torchtitan_text(tensorwise)   # 0.2.2 still writes it


def test_launcher_passes_the_placeholders_as_overrides(tmp_path) -> None:
    setup = CASES["llama2-7b-hsdp-custom-flavor"]
    emit(setup, "fsdp", tmp_path)
    launcher = tmp_path / fsdp.LAUNCHER
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATASET", "DATASET_PATH", "HF_ASSETS_PATH") and not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "set DATASET" in proc.stderr
    # PYTHON=echo prints the command it would run
    env |= {"DATASET": "c4", "DATASET_PATH": "none", "HF_ASSETS_PATH": "/assets/tok", "PYTHON": "echo",
            "NODE_RANK": "3", "MASTER_ADDR": "node0"}
    # no token budget: the launcher asks for the steps, as launch.sbatch asks for TRAIN_SAMPLES (issue 31.7)
    proc = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "set TRAIN_STEPS" in proc.stderr and "no token budget" in proc.stderr
    env["TRAIN_STEPS"] = "5"
    proc = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    cl = setup.cluster
    assert proc.stdout.split() == [
        "-m", "torch.distributed.run", "--nnodes", str(cl.nodes), "--nproc_per_node", str(cl.gpus_per_node),
        "--node_rank", "3", "--rdzv_backend", "c10d", "--rdzv_endpoint", "node0:29500", "-m", "torchtitan.train",
        "--module", torchtitan_py.MODULE, "--config", torchtitan_py.CONFIG_FN, *FILLED, "--training.steps", "5"]


def test_plan_cli_picks_the_torchtitan_version(tmp_path, capsys) -> None:
    from planner.cli import main

    base = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "H100-SXM", "--emit", "fsdp"]
    assert main([*base, "--out", str(tmp_path / "new")]) == 0
    assert {p.name for p in (tmp_path / "new").iterdir()} == {"plan.yaml", torchtitan_py.FILE_NAME, fsdp.LAUNCHER}
    assert main([*base, "--torchtitan-version", "0.2.2", "--out", str(tmp_path / "old")]) == 0
    assert {p.name for p in (tmp_path / "old").iterdir()} == {"plan.yaml", fsdp.FILE_NAME, fsdp.LAUNCHER}
    capsys.readouterr()
    code = main([*base, "--precision", "fp8", "--fp8-recipe", "tensorwise", "--out", str(tmp_path / "fp8")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--fp8-recipe rowwise" in err
    assert not (tmp_path / "fp8").exists()


def test_plan_cli_checks_the_requested_torchtitan_version(tmp_path, capsys) -> None:
    """The pre-write check renders the version asked for: 0.2.2 still writes tensorwise float8; the flag alone
    (no --emit) is refused in one line."""
    from planner.cli import main

    base = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "H100-SXM", "--framework", "fsdp", "--precision", "fp8",
            "--fp8-recipe", "tensorwise"]
    assert main([*base, "--emit", "fsdp", "--torchtitan-version", "0.2.2", "--out", str(tmp_path / "old")]) == 0
    assert (tmp_path / "old" / fsdp.FILE_NAME).exists()
    capsys.readouterr()
    assert main(["--model", "llama3-8b", "--gpus", "8", "--torchtitan-version", "0.2.2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--torchtitan-version only applies with --emit" in err
