"""`plan` as a user runs it: a new process, its output contract, one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import HANG_GUARD_S

from planner.hardware import get_accelerator

ROOT = Path(__file__).resolve().parents[1]
CANDIDATE_KEYS = {"tp", "pp", "dp", "mbs", "gas", "recompute", "zero", "sp", "vpp", "memory_gb_per_gpu",
                  "step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "rank"}


def plan(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_table_for_bloom():
    out = plan("--model", "176B", "--gpus", "384").stdout
    assert "bloom-176b" in out and "Ruled out" in out and "TFLOPs" in out and "rampup_divisibility" in out


def test_json_contract():
    data = json.loads(plan("--model", "176B", "--gpus", "384", "--format", "json", "--top", "5").stdout)
    assert len(data["candidates"]) == 5
    for c in data["candidates"]:
        assert CANDIDATE_KEYS <= set(c)
    assert [c["rank"] for c in data["candidates"]] == [1, 2, 3, 4, 5]
    assert data["pruned"] and all(isinstance(n, int) for n in data["pruned"].values())


def test_yaml_and_csv_formats():
    data = yaml.safe_load(plan("--model", "1B3", "--gpus", "8", "--gpus-per-node", "4", "--gpu", "V100-32GB",
                               "--format", "yaml", "--top", "3").stdout)
    assert len(data["candidates"]) == 3
    lines = plan("--model", "1B3", "--gpus", "8", "--gpus_per_node", "4", "--gpu", "V100-32GB", "--format", "csv",
                 "--top", "3").stdout.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("tp,pp,dp")


def test_explain_json_fits_and_breakdown():
    d = json.loads(plan("--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=2,recompute=full,zero=1",
                        "--format", "json").stdout)
    assert CANDIDATE_KEYS <= set(d) and d["fits"] is True and d["reasons"] == []
    assert d["dp"] == 8 and d["gas"] == 128
    assert d["memory_breakdown_gb"]["stage"] in ("first", "last") and d["time_breakdown_s"]["compute_s"] > 0


def test_explain_json_breakdown_sums_to_what_must_fit():
    """fp16 Megatron-DeepSpeed at ZeRO-1: the 16-bit gradients, the pinned share of the allocator's reserve (in the
    total) and the rest of the reserve (nvidia-smi's, not in the total) each a field (planner.memory.pinned_reserve)."""
    d = json.loads(plan("--model", "1B3", "--gpus", "16", "--gpu", "V100-32GB", "--precision", "fp16", "--explain",
                        "tp=1,pp=1,mbs=1,recompute=full,zero=1", "--format", "json").stdout)
    m = d["memory_breakdown_gb"]
    assert m["grads_bytes"] == m["weights_bytes"] and m["pinned_bytes"] > 0 and m["reserved_bytes"] > 0
    parts = sum(m[k] for k in ("weights_bytes", "grads_bytes", "optimizer_bytes", "pinned_bytes", "activations_bytes",
                               "logits_bytes", "buffers_bytes", "context_bytes"))
    assert m["step_bytes"] == 0 and parts == pytest.approx(d["memory_gb_per_gpu"], abs=0.01)


def test_explain_json_lists_every_reason_when_ruled_out():
    d = json.loads(plan("--model", "176B", "--gpus", "384", "--explain", "tp=3,pp=1,mbs=64,recompute=none,zero=2",
                        "--format", "json").stdout)
    assert d["fits"] is False
    found = {r["reason"] for r in d["reasons"]}
    assert {"tp_divides_heads", "framework_limit", "rampup_divisibility"} <= found
    assert all(r["detail"] for r in d["reasons"])


def test_explain_table():
    out = plan("--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=2,recompute=full,zero=1").stdout
    assert "fits" in out and "Memory per GPU" in out and "Step time" in out


@pytest.mark.parametrize("args,needle", [
    (["--model", "42B", "--gpus", "8"], "unknown model"),
    (["--model", "176B", "--gpus", "8", "--gpu", "A200"], "unknown GPU"),
    (["--model", "176B", "--gpus", "100"], "not a multiple of the node size"),
    (["--model", "176B", "--gpus", "-8"], "must be > 0"),
    (["--model", "176B", "--gpus", "0"], "must be > 0"),
    (["--model", "176B", "--gpus", "384", "--global-batch", "0"], "must be > 0"),
    (["--model", "176B", "--gpus", "8"], "needs about"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp"], "key=value"),
    (["--model", "176B", "--gpus", "384", "--zero", "5"], "--zero"),
    (["--model", "1B3", "--gpus", "8", "--gpu", "V100-32GB", "--precision", "bf16"], "no bf16"),
    (["--gpus", "8"], "give --model"),
    (["--model", "llama3-8b", "--gpus", "8", "--gpu", "H100-SXM", "--fp8-recipe", "tensorwise"], "FP8 training only"),
    (["--model", "176B", "--gpus", "384", "--grad-reduce-dtype", "bf16"], "Megatron-LM's"),
])
def test_bad_input_one_line_exit_2(args, needle):
    proc = plan(*args, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ["gpu: [A100\n", "- just\n- a list\n", "gpu: A100-80GB\nnodes: two\n",
                                  "gpu: A100-80GB\nbogus: 1\n"])
def test_malformed_cluster_yaml(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    proc = plan("--model", "1B3", "--cluster", str(path), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def test_malformed_model_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    proc = plan("--model", str(path), "--gpus", "8", check=False)
    assert proc.returncode == 2 and "malformed" in proc.stderr and proc.stderr.count("\n") == 1


def test_does_not_fit_names_the_gpus_needed():
    proc = plan("--model", "405B", "--gpus", "64", "--framework", "megatron-lm", check=False)
    assert proc.returncode == 2
    assert "does not fit" in proc.stderr and "GPUs" in proc.stderr


def test_cluster_yaml_examples_load():
    for name in ("cluster-bigscience-48x8-a100.yaml", "cluster-2x4-v100-16gb.yaml", "cluster-2x4-v100-32gb.yaml",
                 "cluster-h100-pod.yaml"):
        assert plan("--model", "1B3", "--cluster", str(ROOT / "examples" / name), "--top", "1",
                    "--precision", "fp16" if "v100" in name else "bf16").returncode == 0


def test_rampup_schedule_seed003():
    """Seed 003's 16GB tables: with rampup from 32, more nodes are usable only as the batch grows."""
    out = plan("--model", "1B3", "--nodes", "16", "--gpus-per-node", "4", "--gpu", "V100-16GB", "--precision", "fp16",
               "--recompute", "full", "--rampup", "32", "32", "2000000", "--format", "json",
               "--rampup-schedule").stdout
    rows = json.loads(out)["rampup_schedule"]
    assert rows
    assert rows[0]["first_batch"] == 32 and rows[0]["dp"] * rows[0]["mbs"] <= 32
    assert rows[-1]["gpus"] >= rows[0]["gpus"]


def test_planner_never_imports_torch():
    code = "import sys, planner, planner.cli, planner.emit; planner.cli.main(['--model','1B3','--gpus','8','--top','1']); " \
           "sys.exit(int('torch' in sys.modules or 'optuna' in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr


def test_fp8_recipe_and_bf16_grad_reduce_reach_the_plan_and_the_arguments(tmp_path):
    """--fp8-recipe tensorwise and --grad-reduce-dtype bf16: the planner's memory (2-byte main grads) and
    Megatron-LM's arguments (--fp8-recipe tensorwise, --grad-reduce-in-bf16)."""
    base = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "H100-SXM", "--precision", "fp8", "--framework",
            "megatron-lm", "--tp", "1", "--pp", "1", "--mbs", "1", "--recompute", "full", "--zero", "1"]
    fp32 = json.loads(plan(*base, "--format", "json").stdout)["candidates"][0]
    bf16 = json.loads(plan(*base, "--format", "json", "--grad-reduce-dtype", "bf16").stdout)["candidates"][0]
    assert {k: bf16[k] for k in ("dp", "gas", "vpp")} == {k: fp32[k] for k in ("dp", "gas", "vpp")}
    assert bf16["memory_gb_per_gpu"] < fp32["memory_gb_per_gpu"]
    out = tmp_path / "emit"
    plan(*base, "--fp8-recipe", "tensorwise", "--grad-reduce-dtype", "bf16", "--emit", "megatron-lm", "--out", str(out))
    args = (out / "args.txt").read_text().split()
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    assert "--grad-reduce-in-bf16" in args


# -- issue 21: --out keeps a user's edits, any GPU, partial nodes ------------------------------------------------------
def test_emit_never_overwrites_a_users_files_without_force(tmp_path):
    out = tmp_path / "run"
    argv = ["--model", "1B3", "--gpus", "8", "--gpu", "V100-32GB", "--precision", "fp16", "--emit",
            "megatron-deepspeed", "--out", str(out)]
    plan(*argv)
    (out / "ds_config.json").write_text("my edit\n")
    again = plan(*argv, check=False)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    assert "ds_config.json" in again.stderr and again.stdout == ""        # refused before printing the plan
    assert (out / "ds_config.json").read_text() == "my edit\n"
    from_file = plan("--from", str(out / "plan.yaml"), "--emit", "megatron-deepspeed", "--out", str(out), check=False)
    assert from_file.returncode == 2 and "--force" in from_file.stderr
    assert (out / "ds_config.json").read_text() == "my edit\n"
    plan(*argv, "--force")
    assert (out / "ds_config.json").read_text() != "my edit\n"


def test_emit_into_a_folder_of_other_files_is_fine(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    plan("--model", "1B3", "--gpus", "8", "--gpu", "V100-32GB", "--precision", "fp16", "--emit", "megatron-deepspeed",
         "--out", str(out))
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "plan.yaml").is_file()


def test_force_only_with_emit():
    proc = plan("--model", "1B3", "--gpus", "8", "--force", check=False)
    assert proc.returncode == 2 and "--force only applies with --emit" in proc.stderr


@pytest.mark.parametrize("gpu", ["L40S", "A10", "L4", "H800", "H20", "GH200", "MI325X", "H100-96GB-500W"])
def test_rented_gpus_plan(gpu):
    d = json.loads(plan("--model", "1B3", "--gpus", "8", "--gpu", gpu, "--format", "json", "--top", "1").stdout)
    assert d["candidates"] and d["cluster"]["gpu"] == get_accelerator(gpu).id


def test_a_gpu_yaml_plans_and_round_trips_through_plan_yaml(tmp_path):
    gpu = tmp_path / "lab_gpu.yaml"
    gpu.write_text("id: LAB-X\nbase: L40S\nmemory_gib: 40\nbf16_tflops: 300\n")
    out = tmp_path / "run"
    table = plan("--model", "llama2-7b", "--gpus", "8", "--gpu", str(gpu), "--emit", "megatron-lm", "--out",
                 str(out)).stdout
    assert "8 LAB-X" in table and "40 GiB each" in table
    written = yaml.safe_load((out / "plan.yaml").read_text())["plantune"]["cluster"]["gpu"]
    assert written["id"] == "LAB-X" and written["memory_gib"] == 40 and written["bf16_tflops"] == 300
    back = plan("--from", str(out / "plan.yaml"), "--explain", "--format", "json").stdout
    assert json.loads(back)["fits"] is True


def test_the_example_gpu_yaml_plans():
    d = json.loads(plan("--model", "1B3", "--gpus", "8", "--gpu", str(ROOT / "examples" / "gpu-rtx-4090.yaml"),
                        "--format", "json", "--top", "1").stdout)
    assert d["cluster"]["gpu"] == "RTX-4090" and d["candidates"]


def test_a_bad_gpu_yaml_is_one_line_exit_2(tmp_path):
    gpu = tmp_path / "g.yaml"
    gpu.write_text("base: H100\nmemory_gb: 96\n")
    proc = plan("--model", "1B3", "--gpus", "8", "--gpu", str(gpu), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "unknown key 'memory_gb' (did you mean 'memory_gib'?)" in proc.stderr


@pytest.mark.parametrize("gpus", ["1", "2", "4", "6"])
def test_fewer_gpus_than_a_node_plan_on_one_node(gpus):
    d = json.loads(plan("--model", "1B3", "--gpus", gpus, "--gpu", "H100", "--format", "json", "--top", "1").stdout)
    assert (d["cluster"]["nodes"], d["cluster"]["gpus_per_node"]) == (1, int(gpus)) and d["candidates"]


@pytest.mark.parametrize("gpus,needle", [("12", "use 8 or 16 (whole nodes)"), ("20", "use 16 or 24")])
def test_partial_nodes_beyond_one_node_name_whole_nodes(gpus, needle):
    proc = plan("--model", "1B3", "--gpus", gpus, check=False)
    assert proc.returncode == 2 and needle in proc.stderr and proc.stderr.count("\n") == 1


def test_unfused_norm_costs_more_and_is_never_emitted(tmp_path):
    """--unfused-norm: the same layout of Llama 2 13B plans slower and heavier (the norms as PyTorch ops), the header
    says so; with --emit it is one line, exit status 2, nothing written (every emitter writes fused norms)."""
    base = ("--model", "llama2-13b", "--gpus", "64", "--framework", "megatron-lm", "--tp", "2", "--pp", "1",
            "--recompute", "none", "--mbs", "1", "--format", "json", "--top", "1")
    fused = json.loads(plan(*base).stdout)["candidates"][0]
    unfused_proc = plan(*base, "--unfused-norm")
    unfused = json.loads(unfused_proc.stdout)["candidates"][0]
    assert (unfused["zero"], unfused["sp"]) == (fused["zero"], fused["sp"])
    assert unfused["step_time_s"] > fused["step_time_s"] and unfused["memory_gb_per_gpu"] > fused["memory_gb_per_gpu"]
    table = plan("--model", "llama2-13b", "--gpus", "64", "--unfused-norm", "--top", "1").stdout
    assert "norms as PyTorch ops (--unfused-norm)" in table
    out = tmp_path / "run"
    refused = plan("--model", "llama2-13b", "--gpus", "64", "--unfused-norm", "--emit", "megatron-lm", "--out", str(out),
                   check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and not out.exists()
    assert len(refused.stderr.strip().splitlines()) == 1 and "--unfused-norm" in refused.stderr


def test_a_plan_from_a_preset_imports_neither_yaml_nor_tabulate(tmp_path):
    """Issue 29.5: the catalog comes from its parsed cache (planner.files.read_packaged, written by the first run,
    as Python writes its bytecode) and the tables from planner.table, so that `plan`'s start-up stays short."""
    probe = ("import sys\nfrom planner.cli import main\nmain(['--model', '176B', '--gpus', '384'])\n"
             "print('IMPORTED', sorted(m for m in ('yaml', 'tabulate', 'wcwidth') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(ROOT)}
    for _ in range(2):   # the first run may parse the catalog and write its cache
        proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, env=env,
                              check=True, timeout=HANG_GUARD_S)
    assert proc.stdout.strip().splitlines()[-1] == "IMPORTED []", proc.stdout[-500:]
