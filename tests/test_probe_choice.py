"""Which program measures tune's probes (search.probe_choice), torchtitan's log read as step times
(probes.torchtitan), and the torchtitan probe's config module loaded by torchtitan 0.3.0's own ConfigManager with
its mock data built by torchtitan's dataloader (build/torchtitan-0.3.0, TORCHTITAN3_SRC; skipped where absent).

    python -m pytest tests/test_probe_choice.py -q
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S
from planner.errors import InputError
from search.probe_choice import MEGATRON_DEEPSPEED, MEGATRON_LM, STAND_IN, TORCHTITAN, choose

ROOT = Path(__file__).resolve().parents[1]
TT3 = Path(os.environ.get("TORCHTITAN3_SRC", ROOT / "build" / "torchtitan-0.3.0"))
TT3_INSTALLED = (TT3 / "torchtitan" / "trainer.py").exists()


def spec_finder(**packages: Path):
    """A find_spec that knows only ``packages`` (name -> package folder), as if installed there."""
    def find_spec(name):
        folder = packages.get(name)
        if folder is None:
            return None
        spec = importlib.machinery.ModuleSpec(name, None, origin=str(folder / "__init__.py"), is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return spec
    return find_spec


def nothing(name):  # noqa: ARG001
    return None


def tt(version: str):
    return lambda name: version if name == "torchtitan" else ""


@pytest.fixture
def megatron_tree(tmp_path) -> Path:
    """A Megatron-LM checkout's shape: megatron/ and pretrain_gpt.py beside it."""
    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "__init__.py").write_text("")
    (tmp_path / "pretrain_gpt.py").write_text("")
    return tmp_path


def test_train_forces_the_stand_in_and_megatron_needs_the_command():
    c = choose(probe="train", framework="fsdp", device="cuda", find_spec=spec_finder(torchtitan=Path("/x")),
               version=tt("0.3.0"))
    assert c.program == STAND_IN and c.reason == "--probe train" and not c.framework
    m = choose(probe="megatron", framework="megatron-lm", device="cpu", command="python p.py {args}")
    assert (m.program, m.flavor) == (MEGATRON_LM, "megatron-lm")
    d = choose(probe="megatron", framework="megatron-deepspeed", flavor="microsoft", device="cpu",
               command="python p.py {args}")
    assert (d.program, d.flavor) == (MEGATRON_DEEPSPEED, "microsoft")
    with pytest.raises(InputError, match="--probe megatron needs --command"):
        choose(probe="megatron", framework="megatron-lm", device="cpu")
    with pytest.raises(InputError, match="--probe train .* takes no --command"):
        choose(probe="train", framework="megatron-lm", device="cpu", command="python p.py {args}")


def test_auto_torchtitan_when_importable_on_cuda_else_the_stand_in_saying_why(tmp_path):
    found = spec_finder(torchtitan=tmp_path / "torchtitan")
    c = choose(probe="auto", framework="fsdp", device="cuda", find_spec=found, version=tt("0.3.0"))
    assert (c.program, c.version) == (TORCHTITAN, "0.3.0") and "importable" in c.reason
    cpu = choose(probe="auto", framework="fsdp", device="cpu", find_spec=found, version=tt("0.3.0"))
    assert cpu.program == STAND_IN and "needs a CUDA device" in cpu.reason
    assert cpu.line().startswith("stand-in (plantune's torch GPT): torchtitan's trainer")
    absent = choose(probe="auto", framework="fsdp", device="cuda", find_spec=nothing, version=tt(""))
    assert absent.program == STAND_IN and absent.reason.startswith("torchtitan is not importable")
    old = choose(probe="auto", framework="fsdp", device="cuda", find_spec=found, version=tt("0.2.2"))
    assert old.program == STAND_IN and "0.2.2 is installed" in old.reason


def test_probe_torchtitan_is_explicit_and_checked(tmp_path):
    found = spec_finder(torchtitan=tmp_path / "torchtitan")
    c = choose(probe="torchtitan", framework="fsdp", device="cpu", find_spec=found, version=tt("0.3.0"))
    assert c.program == TORCHTITAN                   # the user's word, even on the CPU (where it stops, with reason)
    with pytest.raises(InputError, match="--framework fsdp"):
        choose(probe="torchtitan", framework="megatron-lm", device="cuda", find_spec=found, version=tt("0.3.0"))
    with pytest.raises(InputError, match="not importable"):
        choose(probe="torchtitan", framework="fsdp", device="cuda", find_spec=nothing, version=tt(""))
    with pytest.raises(InputError, match="0.2.2 is installed"):
        choose(probe="torchtitan", framework="fsdp", device="cuda", find_spec=found, version=tt("0.2.2"))


def test_auto_megatron_lm_from_megatron_path_runs_its_script_on_mock_data(megatron_tree):
    c = choose(probe="auto", framework="megatron-lm", device="cpu", megatron_path=str(megatron_tree), vocab=128,
               find_spec=nothing)
    script = str((megatron_tree / "pretrain_gpt.py").resolve())
    assert c.program == MEGATRON_LM and c.flavor == "megatron-lm" and c.cwd == str(megatron_tree.resolve())
    assert c.command == ("python", "-u", script, "{args}", "--mock-data", "--tokenizer-type", "NullTokenizer",
                         "--vocab-size", "128")
    same = choose(probe="auto", framework="megatron-lm", device="cpu", megatron_path=script, vocab=128,
                  find_spec=nothing)
    assert same.command == c.command                 # the script itself names the checkout too
    with pytest.raises(InputError, match="no pretrain_gpt.py there"):
        choose(probe="auto", framework="megatron-lm", device="cpu", megatron_path=str(megatron_tree / "megatron"))
    with pytest.raises(InputError, match="needs your dataset"):
        choose(probe="auto", framework="megatron-deepspeed", device="cpu", megatron_path=str(megatron_tree))
    with pytest.raises(InputError, match="plan for megatron-lm"):
        choose(probe="auto", framework="fsdp", device="cpu", megatron_path=str(megatron_tree))


def test_auto_megatron_found_beside_the_importable_package(megatron_tree):
    found = spec_finder(megatron=megatron_tree / "megatron")
    c = choose(probe="auto", framework="megatron-lm", device="cuda", vocab=64, find_spec=found)
    assert c.program == MEGATRON_LM and "found at" in c.reason and c.command[2].endswith("pretrain_gpt.py")
    cpu = choose(probe="auto", framework="megatron-lm", device="cpu", vocab=64, find_spec=found)
    assert cpu.program == STAND_IN and "needs a CUDA device" in cpu.reason
    ds = choose(probe="auto", framework="megatron-deepspeed", device="cuda", find_spec=found)
    assert ds.program == STAND_IN and "needs your dataset" in ds.reason
    (megatron_tree / "pretrain_gpt.py").unlink()
    gone = choose(probe="auto", framework="megatron-lm", device="cuda", find_spec=found)
    assert gone.program == STAND_IN and "has no pretrain_gpt.py beside it" in gone.reason
    none = choose(probe="auto", framework="megatron-lm", device="cuda", find_spec=nothing)
    assert none.program == STAND_IN and "Megatron-LM not found: give --megatron-path" in none.reason
    none_ds = choose(probe="auto", framework="megatron-deepspeed", device="cuda", find_spec=nothing)
    assert none_ds.program == STAND_IN and "--data-path" in none_ds.reason and "--megatron-path" not in none_ds.reason
    cmd = choose(probe="auto", framework="megatron-deepspeed", device="cpu", command="python p.py {args}",
                 find_spec=nothing)
    assert cmd.program == MEGATRON_DEEPSPEED and cmd.reason == "your --command"


# -- torchtitan's log ------------------------------------------------------------------------------

def test_torchtitan_metrics_lines_become_step_times():
    """components/metrics.py MetricsProcessor.log's line, with colours and torchrun's rank prefix: tps is tokens
    per device per second, so step = global_batch x seq_len / (world x tps)."""
    from probes.torchtitan import parse_torchtitan_log

    red, reset = "\x1b[31m", "\x1b[39m"
    lines = [f"[default0]:[titan] 2026-11-28 22:40:00,100 - root - INFO - {red}step:  1  loss: 12.25000  grad_norm: "
             f" 3.1000  memory: 41.50GiB(29.81%)  tps: 2,000  tflops: 90.50  mfu: 9.15%{reset}",
             "[default0]:[titan] 2026-11-28 22:40:02,100 - root - INFO - step:  2  loss: 11.00000  grad_norm:  2.0000"
             "  memory: 42.00GiB(30.17%)  tps: 8,192  tflops: 370.00  mfu: 37.41%",
             "[default1]:[titan] ... step:  2  loss: 11.00000  grad_norm:  2.0000  memory: 43.00GiB(30.9%)  "
             "tps: 4,096  tflops: 1.00  mfu: 0.10%",
             "[default0]:[titan] ... - step:  3  loss: 10.50000  grad_norm:  1.5000  memory: 42.00GiB(30.17%)  "
             "tps: 8,000  tflops: 361.00  mfu: N/A"]
    log = parse_torchtitan_log("\n".join(lines), global_batch=16, seq_len=4096, world=8)
    assert [it.iteration for it in log.iterations] == [1, 2, 3]
    assert log.iterations[1].step_time_s == pytest.approx(16 * 4096 / (8 * 8192))      # 1.0 s; rank 0's, first seen
    assert log.iterations[2].step_time_s == pytest.approx(16 * 4096 / (8 * 8000))
    assert log.iterations[0].lm_loss == 12.25 and log.iterations[1].reported_tflops == 370.0
    assert log.memory[0].max_reserved_mb == pytest.approx(43.0 * 1024)                 # the peak over ranks
    oom = parse_torchtitan_log("[default0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
                               global_batch=16, seq_len=4096, world=8)
    assert oom.oom_line and not oom.iterations


def test_log_phases_split_warmup_steps_and_the_rest():
    from probes.megatron import log_phases, parse_log

    text = "\n".join(f" iteration {i}/ 4 | elapsed time per iteration (ms): {ms} |" for i, ms in
                     ((1, 3000.0), (2, 1000.0), (3, 1000.0), (4, 1000.0)))
    phases = log_phases(parse_log(text), warmup_iters=1, wall_s=20.0)
    assert phases == pytest.approx({"warmup": 3.0, "steps": 3.0, "other": 14.0})


# -- the probe's config through torchtitan 0.3.0 ------------------------------------------------------

LOAD = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2], sys.argv[3]]
from torchtitan.config import ConfigManager
cfg = ConfigManager().parse_args(["--module", "plantune_probe", "--config", "probe"])
tok = cfg.tokenizer.build(tokenizer_path=cfg.hf_assets_path)
dl = cfg.dataloader.build(dp_world_size=2, dp_rank=1, tokenizer=tok, seq_len=cfg.training.seq_len,
                          local_batch_size=cfg.training.local_batch_size, snapshot_every_n_steps=None)
inputs, labels = next(iter(dl))
m = cfg.model_spec.model
print(json.dumps({"dataloader": type(cfg.dataloader).__qualname__, "tokenizer": type(cfg.tokenizer).__qualname__,
                  "vocab": tok.get_vocab_size(), "steps": cfg.training.steps, "log_freq": cfg.metrics.log_freq,
                  "checkpoint": cfg.checkpoint.enable, "tensorboard": cfg.metrics.enable_tensorboard,
                  "dump": cfg.dump_folder, "layers": len(m.layers), "dim": m.dim,
                  "shard": cfg.parallelism.data_parallel_shard_degree, "input": list(inputs["input"].shape),
                  "positions": list(inputs["positions"].shape), "labels": list(labels.shape),
                  "shifted": bool((inputs["input"][:, 1:] == labels[:, :-1]).all()),
                  "in_vocab": bool(int(inputs["input"].max()) < tok.get_vocab_size())}))
"""


@pytest.mark.skipif(not TT3_INSTALLED, reason="torchtitan 0.3.0 is not installed in build/torchtitan-0.3.0")
def test_the_probe_module_loads_in_torchtitan_and_its_mock_data_batches(tmp_path):
    """The files the torchtitan probe writes for a candidate, read by torchtitan 0.3.0's ConfigManager as
    ``torchtitan.train`` reads them; its tokenizer and dataloader built the way Trainer.__init__ builds them."""
    from planner import make_cluster
    from planner.model import load_model
    from planner.space import Candidate, TrainingSpec
    from probes.torchtitan import TorchtitanProbe

    model_file = tmp_path / "tinyl.yaml"
    model_file.write_text("name: tinyl\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 192\nvocab: 256\n"
                          "seq_len: 32\ntied_embeddings: false\nnorm: rmsnorm\nposition: rope\nbias: false\n"
                          "glu: true\n")
    model = load_model(str(model_file))
    cand = Candidate(tp=1, pp=1, dp=2, mbs=2, gas=2, recompute="none", zero=3)
    probe = TorchtitanProbe(object(), cluster=make_cluster(gpu="CPU", gpus=2, gpus_per_node=2),
                            training=TrainingSpec(global_batch=8, seq_len=32, precision="fp32", framework="fsdp"))
    setup = probe.probe_setup(model, cand, precision="fp32", procs=2)
    assert probe.problems(setup) == []
    job = tmp_path / "trial-0000"
    job.mkdir()
    argv = probe.command_for(setup, workdir=job, train_iters=7)
    assert argv[2:4] == ["-m", "torchtitan.train"] and argv[-4:] == ["--module", "plantune_probe", "--config", "probe"]
    done = subprocess.run([sys.executable, "-c", LOAD, str(TT3), str(job), str(ROOT)], capture_output=True,
                          text=True, cwd=job, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"dataloader": "MockDataLoader.Config", "tokenizer": "MockTokenizer.Config", "vocab": 256,
                   "steps": 7, "log_freq": 1, "checkpoint": False, "tensorboard": False,
                   "dump": str(job / "outputs"), "layers": 2, "dim": 64, "shard": 2, "input": [2, 32],
                   "positions": [2, 32], "labels": [2, 32], "shifted": True, "in_vocab": True}


def test_the_live_line_names_the_program():
    import io

    from search.progress import Progress

    out = io.StringIO()
    p = Progress(total=4, budget_s=None, stream=out, planned=4, log_every_s=3600.0, program="torchtitan")
    p.probing(7, "tp=1,pp=1,dp=2,mbs=4,gas=1,recompute=none,zero=3", timeout_s=600.0)
    p.probe_ended()
    assert ": trial 7 tp=1,pp=1,dp=2,mbs=4" in out.getvalue() and out.getvalue().rstrip().endswith(" by torchtitan")


def test_the_live_line_reads_a_megatron_probes_latest_iteration(tmp_path):
    from search.progress import last_step_time

    assert last_step_time(tmp_path) is None
    (tmp_path / "torchrun.stdout").write_text(
        "[default1]: iteration        2/       5 | consumed samples: 16 | elapsed time per iteration (ms): 812.5 |\n"
        "[default1]: iteration        3/       5 | consumed samples: 24 | elapsed time per iteration (ms): 790.0 |\n"
        "[default0]:[Rank 0] (after 3 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 |\n")
    assert last_step_time(tmp_path) == (3, pytest.approx(0.79))
