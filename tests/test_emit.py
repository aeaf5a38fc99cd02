"""Emitters: round trip of plan.yaml, agreement between emitted files, refusals, the launcher, the example.

    python -m pytest tests/test_emit*.py -q
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml

from planner.emit import Prediction, emit, load_plan_yaml, plan_target, plan_yaml_dict, render
from planner.errors import InputError
from planner.emit import fsdp
from planner.space import Candidate, TrainingSpec
from test_emit_cases import REFUSED_CASES, VALID_CASES, bloom, llama
from conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_DIR = REPO / "examples" / "bloom-176b-48x8-a100"
FILES = {"megatron-deepspeed": {"plan.yaml", "ds_config.json", "args.txt", "megatron_args.sh", "launch.sbatch"},
         "megatron-lm": {"plan.yaml", "args.txt", "megatron_args.sh", "launch.sbatch"},
         "fsdp": {"plan.yaml", "plantune_torchtitan.py", "launch_torchtitan.sh"}}   # torchtitan 0.3.0


def _ids(case) -> str:
    return case.id


def _args(text: str) -> dict[str, list[str]]:
    """args.txt -> {flag: values}; each flag appears once."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        flag, *values = line.split()
        assert flag not in out, f"{flag} written twice"
        out[flag] = values
    return out


def _bash(script: str, *argv: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, "bash", *argv], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=env, cwd=cwd)


@pytest.fixture(params=VALID_CASES, ids=_ids)
def emitted(request, tmp_path):
    case = request.param
    paths = emit(case.setup, case.kind, tmp_path / "out", flavor=case.flavor)
    return case, tmp_path / "out", paths


def test_writes_every_file_of_its_kind(emitted) -> None:
    case, out, paths = emitted
    assert {p.name for p in paths} == FILES[case.kind] == {p.name for p in out.iterdir()}
    assert all(p.parent == out for p in paths)


def test_plan_yaml_round_trip(emitted, tmp_path) -> None:
    case, out, _ = emitted
    written = yaml.safe_load((out / "plan.yaml").read_text())
    loaded = load_plan_yaml(out / "plan.yaml")
    assert loaded == case.setup
    kind, flavor = plan_target(out / "plan.yaml")
    assert (kind, flavor) == (case.kind, case.flavor if case.kind == "megatron-deepspeed" else None)
    assert plan_yaml_dict(loaded, kind=kind, flavor=flavor) == written
    # and every file re-emitted from the loaded plan is byte-identical
    again = emit(loaded, kind, tmp_path / "again", flavor=flavor or "bigscience")
    assert {p.name: p.read_text() for p in again} == {p.name: p.read_text() for p in out.iterdir()}


def test_plan_yaml_knows_every_field() -> None:
    """A new Candidate/Prediction field must get a plan.yaml key (ModelSpec and TrainingSpec extras are generic)."""
    # offload and opt_offload: written as the training's activation_offload and optimizer_offload
    # (planner.emit.setup.RunSetup folds them in)
    assert {f.name for f in fields(Candidate)} == {"tp", "pp", "dp", "mbs", "gas", "recompute", "zero", "sp", "vpp",
                                                   "hybrid", "cp", "ep", "etp", "offload", "opt_offload"}
    assert {f.name for f in fields(Prediction)} == {"memory_gb_per_gpu", "step_time_s", "model_tflops_per_gpu",
                                                    "hardware_tflops_per_gpu", "mfu"}


def test_plan_yaml_round_trips_tuple_fields(tmp_path) -> None:
    setup = bloom()
    names = [f.name for f in fields(TrainingSpec) if isinstance(getattr(setup.training, f.name), tuple)]
    changed = replace(setup, training=replace(setup.training, **{n: getattr(setup.training, n)[:1] for n in names}))
    emit(changed, "megatron-deepspeed", tmp_path)
    assert load_plan_yaml(tmp_path / "plan.yaml") == changed


def test_plan_yaml_uses_megatron_names(emitted) -> None:
    case, out, _ = emitted
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    c, t, m = case.setup.candidate, case.setup.training, case.setup.model
    assert (plan["tensor_model_parallel_size"], plan["pipeline_model_parallel_size"], plan["data_parallel_size"]) == \
        (c.tp, c.pp, c.dp)
    assert (plan["micro_batch_size"], plan["global_batch_size"], plan["gradient_accumulation_steps"]) == \
        (c.mbs, t.global_batch, c.gas)
    assert (plan["num_layers"], plan["hidden_size"], plan["num_attention_heads"], plan["ffn_hidden_size"]) == \
        (m.layers, m.hidden, m.heads, m.ffn_hidden)
    assert plan["rampup_batch_size"] == (t.rampup.as_list() if t.rampup else None)
    assert plan["zero_stage"] == c.zero and plan["seq_length"] == t.seq_len
    assert plan["plantune"]["cluster"]["gpu"] == case.setup.cluster.gpu.id
    prediction = plan["plantune"]["prediction"]
    assert (prediction is None) == (case.setup.prediction is None)
    if prediction:
        assert set(prediction) == {"memory_gb_per_gpu", "step_time_s", "model_tflops_per_gpu",
                                   "hardware_tflops_per_gpu", "mfu"}


def test_every_rampup_batch_size_divides_by_mbs_dp(emitted) -> None:
    """megatron/microbatches.py asserts this at every iteration: a bad plan dies hours in."""
    _, out, _ = emitted
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    if not plan["rampup_batch_size"]:
        return
    start, increment, _ = plan["rampup_batch_size"]
    final, unit = plan["global_batch_size"], plan["micro_batch_size"] * plan["data_parallel_size"]
    assert (final - start) % increment == 0
    assert all(b % unit == 0 for b in range(start, final + 1, increment))


MD_CASES = [c for c in VALID_CASES if c.kind == "megatron-deepspeed"]


@pytest.mark.parametrize("case", MD_CASES, ids=_ids)
def test_megatron_deepspeed_files_agree(case, tmp_path) -> None:
    emit(case.setup, case.kind, tmp_path, flavor=case.flavor)
    args = _args((tmp_path / "args.txt").read_text())
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    cluster = plan["plantune"]["cluster"]
    tp, pp = int(args["--tensor-model-parallel-size"][0]), int(args["--pipeline-model-parallel-size"][0])
    dp, mbs = plan["data_parallel_size"], int(args["--micro-batch-size"][0])
    assert tp * pp * dp == cluster["nodes"] * cluster["gpus_per_node"]
    assert (tp, pp) == (plan["tensor_model_parallel_size"], plan["pipeline_model_parallel_size"])
    assert mbs == ds["train_micro_batch_size_per_gpu"] == plan["micro_batch_size"]
    assert int(args["--global-batch-size"][0]) == ds["train_batch_size"] == plan["global_batch_size"]
    assert ds["train_batch_size"] == mbs * ds["gradient_accumulation_steps"] * dp  # DeepSpeed's assertion
    assert ds["gradient_accumulation_steps"] == plan["gradient_accumulation_steps"]
    assert ("--bf16" in args) == ds["bf16"]["enabled"] == plan["bf16"]
    assert ("--fp16" in args) == ds["fp16"]["enabled"] == plan["fp16"]
    assert not (ds["bf16"]["enabled"] and ds["fp16"]["enabled"])
    if ds["fp16"]["enabled"]:
        assert {"loss_scale", "loss_scale_window", "hysteresis", "min_loss_scale", "initial_scale_power"} <= \
            set(ds["fp16"])
    assert int(args["--zero-stage"][0]) == ds["zero_optimization"]["stage"]
    if case.flavor == "bigscience" and plan["bf16"]:
        assert ds["zero_optimization"]["stage"] == 0  # the fork's BF16 optimizer wants stage 0
    else:
        assert ds["zero_optimization"]["stage"] == plan["zero_stage"]
    if ds["zero_optimization"]["stage"] >= 2:
        assert pp == 1 and "--no-pipeline-parallel" in args
    assert float(args["--clip-grad"][0]) == ds["gradient_clipping"]
    assert args["--deepspeed_config"] == ["ds_config.json"] and "--deepspeed" in args
    assert args.get("--rampup-batch-size") == ([str(v) for v in plan["rampup_batch_size"]]
                                               if plan["rampup_batch_size"] else None)
    assert ("--checkpoint-activations" in args) == (plan["recompute_granularity"] == "full")
    assert ("--sequence-parallel" in args) == plan["sequence_parallel"]
    assert {"steps_per_print", "wall_clock_breakdown"} <= set(ds) and ds["wall_clock_breakdown"] is False
    # megatron_args.sh holds exactly args.txt, as bash reads it
    sourced = _bash('source "$1" && printf "%s\\n" "${MEGATRON_ARGS[@]}"', str(tmp_path / "megatron_args.sh"))
    assert sourced.returncode == 0, sourced.stderr
    assert sourced.stdout.split("\n")[:-1] == (tmp_path / "args.txt").read_text().split()
    sbatch = (tmp_path / "launch.sbatch").read_text()
    assert f"#SBATCH --nodes={cluster['nodes']}\n" in sbatch
    assert f"#SBATCH --gres=gpu:{cluster['gpus_per_node']}\n" in sbatch
    assert "#SBATCH --ntasks-per-node=1 " in sbatch
    assert f"GPUS_PER_NODE={cluster['gpus_per_node']}\n" in sbatch
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in sbatch) == plan["sequence_parallel"]
    assert ("--train-samples" in sbatch) == ("--train-samples" not in args)


@pytest.mark.parametrize("case", MD_CASES, ids=_ids)
def test_launch_sbatch_passes_bash_n(case, tmp_path) -> None:
    emit(case.setup, case.kind, tmp_path, flavor=case.flavor, reservation="bigscience")
    result = subprocess.run(["bash", "-n", str(tmp_path / "launch.sbatch")], capture_output=True, text=True,
                            timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --reservation=bigscience\n" in (tmp_path / "launch.sbatch").read_text()


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    """srun, scontrol and python stand-ins on PATH; the 'python' records its argv and working folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "srun": '#!/bin/bash\nprintf "%s\\n" "$@" > "$STANDIN_LOG.srun"\n'
                'while [[ "$1" == --* ]]; do shift; done\nSLURM_PROCID=0 exec "$@"\n',
        "scontrol": '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && printf "node-a\\nnode-b\\n"\n',
        "fakepython": '#!/bin/bash\npwd > "$STANDIN_LOG.cwd"\nprintf "%s\\n" "$@" > "$STANDIN_LOG"\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(bin_dir / "fakepython"),
            "STANDIN_LOG": str(tmp_path / "argv"), "SLURM_NNODES": "48", "SLURM_JOB_NODELIST": "node-[a-b]"}


def test_launch_sbatch_runs_the_real_command_with_stand_ins(tmp_path) -> None:
    out = tmp_path / "plan"
    emit(bloom(), "megatron-deepspeed", out)
    env = _stand_ins(tmp_path) | {"SLURM_SUBMIT_DIR": str(out), "DATA_PATH": "/data/oscar", "TOKENIZER": "bs/tok",
                                  "CHECKPOINT_PATH": "/ckpt", "PRETRAIN_SCRIPT": "/opt/stand_in.py",
                                  "SLURM_CPUS_ON_NODE": "112"}
    result = subprocess.run(["bash", str(out / "launch.sbatch")], capture_output=True, text=True, timeout=HANG_GUARD_S,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    srun = (tmp_path / "argv.srun").read_text().split("\n")
    # the node's CPUs as SLURM allocated them (issue 31.7: a fixed --cpus-per-task=64 before); no container unless set
    assert srun[:4] == ["--wait=60", "--kill-on-bad-exit=1", "--cpus-per-task=112", "bash"]
    argv = (tmp_path / "argv").read_text().split("\n")[:-1]
    assert argv[:20] == ["-u", "-m", "torch.distributed.run", "--nproc_per_node", "8", "--nnodes", "48",
                         "--rdzv_endpoint", "node-a:6000", "--rdzv_backend", "c10d", "--max_restarts", "0",
                         "--tee", "3", "--node_rank", "0", "/opt/stand_in.py", "--num-layers", "70"]
    tokens = (out / "args.txt").read_text().split()
    assert argv[18:18 + len(tokens)] == tokens
    site = _args("\n".join(" ".join(line) for line in _group(argv[18 + len(tokens):])))
    assert site["--data-path"] == ["/data/oscar"] and site["--tokenizer-name-or-path"] == ["bs/tok"]
    assert site["--save"] == site["--load"] == ["/ckpt"]
    assert (tmp_path / "argv.cwd").read_text().strip() == str(out)  # ds_config.json resolves there


def _group(tokens: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for tok in tokens:
        if tok.startswith("--"):
            groups.append([tok])
        else:
            groups[-1].append(tok)
    return groups


def test_launch_sbatch_site_settings_are_overridable(tmp_path) -> None:
    """Issue 31.7: NCCL settings are written commented for the site to set; a container image given in the
    environment runs the srun step in it (pyxis --container-image), with the plan folder mounted."""
    out = tmp_path / "plan"
    emit(bloom(), "megatron-deepspeed", out)
    text = (out / "launch.sbatch").read_text()
    assert "# export NCCL_SOCKET_IFNAME=" in text and "# export NCCL_IB_HCA=" in text
    assert "oscar" not in text and "bigscience/tokenizer" not in text
    env = _stand_ins(tmp_path) | {"SLURM_SUBMIT_DIR": str(out), "DATA_PATH": "/d", "CHECKPOINT_PATH": "/c",
                                  "PRETRAIN_SCRIPT": "/opt/stand_in.py", "CONTAINER_IMAGE": "nvcr.io/nvidia/pytorch:x",
                                  "CPUS_PER_TASK": "32"}
    # the stand-in srun logs its arguments (it cannot start a container)
    subprocess.run(["bash", str(out / "launch.sbatch")], capture_output=True, text=True, timeout=HANG_GUARD_S,
                   env=env, cwd=tmp_path)
    srun = (tmp_path / "argv.srun").read_text().split("\n")
    assert srun[2:10] == ["--cpus-per-task=32", "--container-image", "nvcr.io/nvidia/pytorch:x", "--container-mounts",
                          f"{out}:{out}", "--container-workdir", str(out), "bash"]
    # BLOOM's own tokenizer when TOKENIZER is not set
    del env["CONTAINER_IMAGE"]
    result = subprocess.run(["bash", str(out / "launch.sbatch")], capture_output=True, text=True, timeout=HANG_GUARD_S,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv").read_text().split("\n")
    assert argv[argv.index("--tokenizer-name-or-path") + 1] == "bigscience/bloom"


def test_launch_sbatch_without_a_known_tokenizer_asks_for_it(tmp_path) -> None:
    """GPT-3 has no published tokenizer repository of its own: TOKENIZER must be set, and the launcher says so."""
    case = next(c for c in VALID_CASES if c.id == "gpt3-bigscience")
    emit(case.setup, case.kind, tmp_path / "plan", flavor=case.flavor)
    env = _stand_ins(tmp_path) | {"SLURM_SUBMIT_DIR": str(tmp_path / "plan"), "DATA_PATH": "/d",
                                  "CHECKPOINT_PATH": "/c", "MEGATRON_DIR": "/m", "SLURM_NNODES": "16"}
    result = subprocess.run(["bash", str(tmp_path / "plan" / "launch.sbatch")], capture_output=True, text=True,
                            timeout=HANG_GUARD_S, env=env)
    assert result.returncode != 0 and "set TOKENIZER to the Hugging Face tokenizer of the model" in result.stderr
    assert not (tmp_path / "argv").exists()


@pytest.mark.parametrize("missing", ["DATA_PATH", "CHECKPOINT_PATH"])
def test_launch_sbatch_names_a_missing_placeholder(tmp_path, missing) -> None:
    out = tmp_path / "plan"
    emit(bloom(), "megatron-deepspeed", out)
    env = _stand_ins(tmp_path) | {"SLURM_SUBMIT_DIR": str(out), "DATA_PATH": "/d", "TOKENIZER": "t",
                                  "CHECKPOINT_PATH": "/c", "MEGATRON_DIR": "/m"}
    del env[missing]
    result = subprocess.run(["bash", str(out / "launch.sbatch")], capture_output=True, text=True,
                            timeout=HANG_GUARD_S, env=env)
    assert result.returncode != 0 and f"set {missing}" in result.stderr
    assert not (tmp_path / "argv").exists()


def test_launch_sbatch_refuses_another_node_count(tmp_path) -> None:
    out = tmp_path / "plan"
    emit(bloom(), "megatron-deepspeed", out)
    env = _stand_ins(tmp_path) | {"SLURM_NNODES": "47", "DATA_PATH": "/d", "TOKENIZER": "t", "CHECKPOINT_PATH": "/c",
                                  "MEGATRON_DIR": "/m"}
    result = subprocess.run(["bash", str(out / "launch.sbatch")], capture_output=True, text=True,
                            timeout=HANG_GUARD_S, env=env)
    assert result.returncode == 1 and "planned for 48 nodes" in result.stderr


def test_launch_sbatch_asks_for_train_samples_when_unknown(tmp_path) -> None:
    case = next(c for c in VALID_CASES if c.id == "llama70b-microsoft-sp-selective")
    text = render(case.setup, case.kind, flavor=case.flavor)["launch.sbatch"]
    assert "TRAIN_SAMPLES=${TRAIN_SAMPLES:?" in text and '--train-samples "$TRAIN_SAMPLES"' in text
    assert "--tokenizer-type HFTokenizer" in text


@pytest.mark.parametrize("case", [c for c in VALID_CASES if c.kind == "megatron-lm"], ids=_ids)
def test_megatron_lm_args(case, tmp_path) -> None:
    emit(case.setup, case.kind, tmp_path)
    args = _args((tmp_path / "args.txt").read_text())
    m, c, t = case.setup.model, case.setup.candidate, case.setup.training
    assert [args[f][0] for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size")] == \
        [str(m.layers), str(m.hidden), str(m.heads), str(m.ffn_hidden)]
    assert int(args["--tensor-model-parallel-size"][0]) * int(args["--pipeline-model-parallel-size"][0]) * c.dp == \
        case.setup.cluster.world_size
    assert int(args["--global-batch-size"][0]) == int(args["--micro-batch-size"][0]) * c.dp * c.gas == t.global_batch
    assert ("--sequence-parallel" in args) == c.sp and ("--use-distributed-optimizer" in args) == (c.zero >= 1)
    assert ("--use-megatron-fsdp" in args) == (c.zero >= 2)   # ZeRO-2/3: Megatron-FSDP
    assert args.get("--recompute-granularity", [None])[0] == (None if c.recompute == "none" else c.recompute)
    assert args.get("--num-virtual-stages-per-pipeline-rank", ["1"])[0] == str(c.vpp)
    assert ("--num-query-groups" in args) == (m.kv_heads != m.heads)
    if m.position == "rope":   # the whole head rotates (Megatron's examples/gpt3 YAML had rotary_percent 0.5)
        assert args["--rotary-percent"] == ["1.0"] and "--rotary-base" in args
    sbatch = (tmp_path / "launch.sbatch").read_text()
    assert "NVIDIA/Megatron-LM" in sbatch and "ds_config" not in sbatch and "--deepspeed" not in sbatch
    assert "--tokenizer-type HuggingFaceTokenizer" in sbatch
    assert _bash('bash -n "$1"', str(tmp_path / "launch.sbatch")).returncode == 0


def test_megatron_lm_uneven_pipeline_stages(tmp_path) -> None:
    """Llama 3 405B: 126 layers on PP=16 run as 7 + 14 x 8 + 7 (--decoder-first/last-pipeline-num-layers)."""
    setup = llama("llama3-405b", gpus=2048, tp=8, pp=16, dp=16, gas=64, recompute="full")
    emit(setup, "megatron-lm", tmp_path)
    args = _args((tmp_path / "args.txt").read_text())
    assert args["--decoder-first-pipeline-num-layers"] == ["7"] and args["--decoder-last-pipeline-num-layers"] == ["7"]
    assert args["--rotary-base"] == ["500000"]          # Llama 3's RoPE theta
    assert args["--hidden-dropout"] == args["--attention-dropout"] == ["0"]


@pytest.mark.parametrize("pp,vpp", [(16, 4), (8, 8)])
def test_megatron_lm_account_for_embedding_and_loss(tmp_path, pp, vpp) -> None:
    """Llama 3 405B with interleaving: 126 + embedding + loss = 128 layers split evenly over PP x VPP
    (--account-for-embedding/loss-in-pipeline-split), and no first/last stage sizes (Megatron refuses both)."""
    setup = llama("llama3-405b", gpus=2048, tp=8, pp=pp, dp=2048 // (8 * pp), gas=1024 // (2048 // (8 * pp)),
                  recompute="full", vpp=vpp)
    emit(setup, "megatron-lm", tmp_path)
    args = _args((tmp_path / "args.txt").read_text())
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    assert "--decoder-first-pipeline-num-layers" not in args and "--decoder-last-pipeline-num-layers" not in args
    assert args["--num-virtual-stages-per-pipeline-rank"] == [str(vpp)]


def test_megatron_lm_even_split_writes_no_split_flags(tmp_path) -> None:
    emit(llama("llama2-70b", pp=4, vpp=2), "megatron-lm", tmp_path)   # 80 = 4 x 2 x 10
    text = (tmp_path / "args.txt").read_text()
    assert "pipeline-num-layers" not in text and "account-for" not in text


@pytest.mark.parametrize("case", [c for c in VALID_CASES if c.kind == "fsdp"], ids=_ids)
def test_torchtitan_toml(case, tmp_path) -> None:
    import tomllib

    emit(case.setup, case.kind, tmp_path, torchtitan_version="0.2.2")
    d = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    c, cl = case.setup.candidate, case.setup.cluster
    par, tr = d["parallelism"], d["training"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == c.dp
    assert par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * c.dp == cl.world_size
    if c.hybrid:
        assert par["data_parallel_shard_degree"] == cl.gpus_per_node and par["data_parallel_replicate_degree"] > 1
    else:
        assert par["fsdp_reshard_after_forward"] == {0: "default", 2: "never", 3: "always"}[c.zero]
        assert (par["data_parallel_shard_degree"] == 1) == (c.zero == 0)
    # under PP the local batch is the GAS micro-batches of one step
    assert tr["global_batch_size"] == tr["local_batch_size"] * c.dp * (1 if c.pp > 1 else c.gas)
    assert d["activation_checkpoint"]["mode"] == c.recompute
    assert tr["mixed_precision_param"] == {"bf16": "bfloat16", "fp32": "float32"}[case.setup.training.precision]


@pytest.mark.parametrize("case_id,setup,kind,flavor,message", REFUSED_CASES, ids=[r[0] for r in REFUSED_CASES])
def test_refused_with_one_line_and_nothing_written(tmp_path, case_id, setup, kind, flavor, message) -> None:
    out = tmp_path / "out"
    with pytest.raises(InputError) as err:
        emit(setup, kind, out, flavor=flavor)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not out.exists()


def test_bloom_rampup_accepted_at_dp8_refused_at_dp16() -> None:
    """BLOOM: rampup 192 16 9765625 to 2048. DP=8 MBS=2: 192 % 16 == 16 % 16 == 0. DP=16 MBS=2: 16 % 32 != 0."""
    assert render(bloom(), "megatron-deepspeed")
    with pytest.raises(InputError, match=r"MBS\*DP = 2\*16 = 32"):
        render(bloom(pp=6), "megatron-deepspeed")
    assert render(bloom(pp=6, rampup=None), "megatron-deepspeed")  # the same layout without rampup is fine


def test_refusal_lists_every_problem() -> None:
    with pytest.raises(InputError) as err:
        render(bloom(recompute="selective", zero=3, flash_attention=True), "megatron-deepspeed")
    text = str(err.value)
    assert "ZeRO-3" in text and "selective recompute" in text and "FlashAttention" in text


@pytest.mark.parametrize("name", ["my res", "a;rm -rf /", "-x", "x\ny"])
def test_reservation_must_be_a_slurm_name(tmp_path, name) -> None:
    with pytest.raises(InputError, match="reservation"):
        emit(bloom(), "megatron-deepspeed", tmp_path / "out", reservation=name)
    assert not (tmp_path / "out").exists()


def test_emit_into_a_file_is_refused(tmp_path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        emit(bloom(), "megatron-deepspeed", target)


def _plan_file(tmp_path: Path) -> Path:
    emit(bloom(), "megatron-deepspeed", tmp_path / "p")
    return tmp_path / "p" / "plan.yaml"


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("micro_batch_size"), "missing key micro_batch_size"),
    (lambda d: d["plantune"].pop("cluster"), "missing key plantune.cluster"),
    (lambda d: d["plantune"]["cluster"].pop("gpu"), "missing key plantune.cluster.gpu"),
    (lambda d: d.update(tensor_model_parallel_size=True), "tensor_model_parallel_size must be int"),
    (lambda d: d.update(num_layers="70"), "num_layers must be int"),
    (lambda d: d.update(rampup_batch_size=[192, 16]), "rampup_batch_size must be [START, INCREMENT, SAMPLES]"),
    (lambda d: d.update(bf16=True, fp16=True), "bf16 and fp16 are both true"),
    (lambda d: d["plantune"]["cluster"].update(gpu="Z100"), "unknown GPU 'Z100'"),
    (lambda d: d["plantune"]["model"].update(colour="red"), "colour"),
    (lambda d: d.update(train_samples=5), "train_samples 5 disagrees"),
])
def test_load_plan_yaml_refuses_a_broken_file(tmp_path, edit, message) -> None:
    path = _plan_file(tmp_path)
    d = yaml.safe_load(path.read_text())
    edit(d)
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="plan file") as err:
        load_plan_yaml(path)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,message", [("a: [1,", "malformed plan file"), ("- 1\n- 2\n", "expected a mapping"),
                                           ("", "expected a mapping")])
def test_load_plan_yaml_refuses_malformed_yaml(tmp_path, text, message) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_plan_yaml(path)
    with pytest.raises(InputError, match="does not exist"):
        load_plan_yaml(tmp_path / "none.yaml")


def test_plan_yaml_loads_only_safe_yaml(tmp_path) -> None:
    path = _plan_file(tmp_path)
    marker = tmp_path / "constructed"
    # valid YAML (it composes) whose value carries a python tag: yaml.unsafe_load would call os.mkdir(marker)
    text = path.read_text() + f"comment: !!python/object/apply:os.mkdir [{str(marker)!r}]\n"
    node = yaml.compose(text)
    assert any(v.tag.startswith("tag:yaml.org,2002:python/") for _, v in node.value)
    path.write_text(text)
    with pytest.raises(InputError, match="malformed plan file"):
        load_plan_yaml(path)
    assert not marker.exists(), "the plan file was loaded with an unsafe loader"


def test_example_on_disk_is_a_fresh_emit(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("make_bloom_example", REPO / "examples" / "make_bloom_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = {p.name: p.read_text() for p in module.main(tmp_path / "fresh")}
    on_disk = {p.name: p.read_text() for p in EXAMPLE_DIR.iterdir()}
    assert on_disk == fresh, "examples/bloom-176b-48x8-a100 is stale: run python -m examples.make_bloom_example"
    args = _args(on_disk["args.txt"])
    assert args["--tensor-model-parallel-size"] == ["4"] and args["--pipeline-model-parallel-size"] == ["12"]
    assert args["--rampup-batch-size"] == ["192", "16", "9765625"] and "--checkpoint-activations" in args
    assert json.loads(on_disk["ds_config.json"])["zero_optimization"]["stage"] == 0
    assert os.access(EXAMPLE_DIR / "launch.sbatch", os.X_OK)


@pytest.mark.parametrize("version,ok", [("0.8.3", True), ("0.7.3+a1b2", True), ("0.9.0", False), ("0.16.4", False)])
def test_bigscience_launcher_checks_the_deepspeed_version(tmp_path, version, ok) -> None:
    """DeepSpeed >= 0.9.0 refuses the bigscience fork's double config at start-up: the sbatch stops first."""
    import sys

    text = render(bloom(), "megatron-deepspeed")["launch.sbatch"]
    assert "deepspeed>=0.7.3,<0.9" in text.split("\n#SBATCH")[0]          # said in the header comment
    start = "<<'PY' || exit 1\n"
    guard = text[text.index(start) + len(start):]
    guard = guard[:guard.index("\nPY\n")]
    pkg = tmp_path / "deepspeed"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    result = subprocess.run([sys.executable, "-c", guard], capture_output=True, text=True, timeout=HANG_GUARD_S,
                            env={"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]})
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert "pip install 'deepspeed>=0.7.3,<0.9'" in result.stderr
    microsoft = next(c for c in VALID_CASES if c.flavor == "microsoft" and c.kind == "megatron-deepspeed")
    assert "<<'PY'" not in render(microsoft.setup, microsoft.kind, flavor="microsoft")["launch.sbatch"]


def test_plan_yaml_round_trips_a_calibrated_cluster(tmp_path) -> None:
    """tune calibrate's figures (GEMM base, element-wise bandwidth, attention rate, host scale) travel in plan.yaml."""
    setup = bloom()
    cal = replace(setup, cluster=replace(setup.cluster, matmul_efficiency=0.61, elementwise_efficiency=0.83,
                                         attention_efficiency=1.12, host_scale=0.6))
    emit(cal, "megatron-deepspeed", tmp_path)
    assert load_plan_yaml(tmp_path / "plan.yaml") == cal
