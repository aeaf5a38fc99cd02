"""FSDP: a torchtitan job (``launch_torchtitan.sh`` runs ``torchrun -m torchtitan.train --job.config_file
torchtitan.toml`` on every node, inside SLURM or not).

Target: torchtitan 0.2.2 from PyPI, the last release configured by TOML (``--torchtitan-version 0.2.2``; 0.3.0,
the default, replaced the TOML with Python config functions: `planner.emit.torchtitan_py`, which reuses the mesh,
batch, schedule and launcher here). Section and field names are v0.2.2's
torchtitan/config/job_config.py; tests/test_torchtitan_parser.py parses the emitted file with v0.2.2's own
ConfigManager (CI installs it into build/torchtitan). A model that is not one of torchtitan's llama3 flavors gets its
flavor from ``plantune_model.py``, which registers `TorchtitanModelArgs` as torchtitan's
``TransformerModelArgs`` under the flavor "plantune" ([experimental] custom_import; no source patch).

plantune's layout onto torchtitan's mesh: ZeRO-0 (NO_SHARD) -> data_parallel_replicate_degree = DP (DDP); ZeRO-2
(SHARD_GRAD_OP) -> shard over DP, fsdp_reshard_after_forward = "never"; ZeRO-3 (FULL_SHARD) -> "always" ("default"
under PP, which keeps the stage unsharded: `planner.fsdp_parallel`); hybrid (HYBRID_SHARD) -> shard inside a node,
replicate across nodes (HSDP). TP (sequence-parallel), PP (``pipeline_parallel_schedule``, micro-batch size = MBS,
local_batch_size = MBS x GAS micro-batches), CP and EP are their degrees; without PP GAS follows from
global_batch_size / (local_batch_size x DP). ``--precision fp8`` is the float8 converter
(`planner.emit.parallel_extras.torchtitan_dict`), ``--torch-compile`` / ``--async-tp`` [compile] and
enable_async_tensor_parallel.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass

from planner import fsdp_parallel, recompute as recompute_modes
from planner.emit import facts, parallel_extras
from planner.emit.setup import NO_BUDGET, RunSetup, one_line, train_samples
from planner.framework import TORCHTITAN_VERSIONS
from planner.model import ModelSpec

FILE_NAME = "torchtitan.toml"
MODEL_FILE = "plantune_model.py"
LAUNCHER = "launch_torchtitan.sh"
TORCHTITAN_VERSION = TORCHTITAN_VERSIONS[1]
LLAMA3_FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
"""plantune presets that are torchtitan's own llama3 flavors (torchtitan/models/llama3/__init__.py)"""
CUSTOM_FLAVOR = "plantune"
PLACEHOLDER = "PLANTUNE_SET_"
"""prefix of the values plantune cannot know; the launcher refuses to start while one is left"""
_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}   # fp8: float8 GEMMs, bf16 params


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchtitanModelArgs:
    """torchtitan v0.2.2's llama3 TransformerModelArgs (torchtitan/models/llama3/model/args.py), the fields plantune
    sets. Its FFN width is multiple_of x ceil(int(ffn_dim_multiplier x int(8·dim/3)) / multiple_of)
    (model/model.py FeedForward)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    multiple_of: int
    ffn_dim_multiplier: float | None
    norm_eps: float
    rope_theta: float
    rope_scaling_args: dict
    """RoPEScalingArgs' fields (scaling_factor 1: every frequency as it is)"""
    max_seq_len: int

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


def model_args(model: ModelSpec) -> TorchtitanModelArgs:
    """The model as torchtitan's llama3 arguments (the one mapping: `planner.emit.facts.torchtitan_model_args`)."""
    return TorchtitanModelArgs(**facts.torchtitan_model_args(model))


def _mesh(setup: RunSetup) -> dict:
    c, cl = setup.candidate, setup.cluster
    if c.hybrid:
        shard = max(1, min(c.dp, cl.gpus_per_node // c.tp))
        return {"data_parallel_replicate_degree": c.dp // shard, "data_parallel_shard_degree": shard,
                "fsdp_reshard_after_forward": "default" if c.pp > 1 else "always"}
    if c.zero == 0:
        return {"data_parallel_replicate_degree": c.dp, "data_parallel_shard_degree": 1,
                "fsdp_reshard_after_forward": "default"}
    after = "default" if c.pp > 1 and c.zero == 3 else ("always" if c.zero == 3 else "never")
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": c.dp,
            "fsdp_reshard_after_forward": after}


def parallelism(setup: RunSetup) -> dict:
    """The [parallelism] table (0.3.0's ParallelismConfig has the same names, less async TP)."""
    c, t = setup.candidate, setup.training
    out = {**_mesh(setup), "tensor_parallel_degree": c.tp, "pipeline_parallel_degree": c.pp,
           "context_parallel_degree": c.cp, "expert_parallel_degree": c.ep}
    if c.pp > 1:
        out |= {"pipeline_parallel_schedule": fsdp_parallel.schedule(c, t),
                "pipeline_parallel_microbatch_size": c.mbs}
        if c.vpp > 1:   # VPP stages per rank (the rulebook checks that this gives exactly PP x VPP stages)
            out["pipeline_parallel_layers_per_stage"] = fsdp_parallel.layers_per_stage(setup.model, c)
    if t.async_tp:
        out["enable_async_tensor_parallel"] = True
    return out


def activation_checkpoint(setup: RunSetup) -> dict:
    """The [activation_checkpoint] table: the one place its keys are written."""
    return recompute_modes.torchtitan_activation_checkpoint(setup.candidate.recompute)


def torchtitan_dict(setup: RunSetup) -> dict[str, dict]:
    m, c, t = setup.model, setup.candidate, setup.training
    samples = train_samples(t)
    steps = math.ceil(samples / t.global_batch) if samples is not None else None
    warm = facts.warmup_samples(t)
    flavor = LLAMA3_FLAVORS.get(m.name, CUSTOM_FLAVOR)
    model = {"name": "llama3", "flavor": flavor, "hf_assets_path": f"{PLACEHOLDER}HF_ASSETS_PATH"}
    return parallel_extras.merge({
        "job": {"dump_folder": "./outputs", "description": f"{one_line(m.name)}, written by plantune"},
        "metrics": {"log_freq": 10, "enable_tensorboard": True, "save_tb_folder": "tb"},
        "model": model,
        "optimizer": {"name": "AdamW", "lr": facts.peak_lr(m), "eps": 1e-8, "weight_decay": 0.1},
        "lr_scheduler": {"warmup_steps": max(1, math.ceil(warm / t.global_batch)) if warm else 200,
                         "decay_type": "cosine", "min_lr_factor": facts.MIN_LR_RATIO},
        "training": {"dataset": f"{PLACEHOLDER}DATASET", "dataset_path": f"{PLACEHOLDER}DATASET_PATH",
                     "local_batch_size": c.mbs * c.gas if c.pp > 1 else c.mbs,
                     "global_batch_size": t.global_batch, "seq_len": t.seq_len,
                     "max_norm": 1.0, "steps": steps if steps is not None else 10000,
                     "mixed_precision_param": _DTYPES[t.precision], "mixed_precision_reduce": "float32"},
        "parallelism": parallelism(setup),
        "checkpoint": {"enable": True, "folder": "checkpoint", "interval": 500},
        "activation_checkpoint": activation_checkpoint(setup),
        "compile": {"enable": t.torch_compile, "components": ["model", "loss"]},
        **({"experimental": {"custom_import": MODEL_FILE.removesuffix(".py")}} if flavor == CUSTOM_FLAVOR else {}),
    }, parallel_extras.torchtitan_dict(setup))   # float8 converter for --precision fp8


def _py(v: object) -> str:
    """A model argument as Python source (RoPEScalingArgs for the rope_scaling_args mapping)."""
    if isinstance(v, dict):
        return "RoPEScalingArgs(" + ", ".join(f"{k}={x!r}" for k, x in v.items()) + ")"
    return repr(v)


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_text(d: dict[str, dict]) -> str:
    """Flat tables of scalars and lists, as torchtitan's train_configs are (read back by tomllib)."""
    return "\n".join(f"[{section}]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in body.items())
                     for section, body in d.items())


def torchtitan_text(setup: RunSetup) -> str:
    m, c, t = setup.model, setup.candidate, setup.training
    head = [f"torchtitan {TORCHTITAN_VERSION} job config for {one_line(m.name)}, written by plantune: "
            f"FSDP {c.fsdp_strategy}, DP={c.dp}, TP={c.tp}, PP={c.pp}, CP={c.cp}, MBS={c.mbs}, GAS={c.gas}, "
            f"recompute {c.recompute}.",
            f"Start it with ./{LAUNCHER} (it fills the {PLACEHOLDER}* values from the environment).",
            facts.vocab_note(m, c.tp, "torchtitan")]
    if train_samples(t) is None:
        head.append(f"No token budget was given: {LAUNCHER} asks for TRAIN_STEPS (--training.steps).")
    return "".join(f"# {line}\n" for line in head) + "\n" + toml_text(torchtitan_dict(setup))


def model_file_text(setup: RunSetup, args: TorchtitanModelArgs | None = None) -> str:
    """``plantune_model.py``: registers ``args`` (default `model_args` of the model) as llama3 flavor "plantune"."""
    a = args or model_args(setup.model)
    fields = ", ".join(f"{k}={_py(v)}" for k, v in asdict(a).items())
    return "\n".join([
        f'"""{one_line(setup.model.name)} as torchtitan {TORCHTITAN_VERSION} llama3 flavor "{CUSTOM_FLAVOR}", '
        'written by plantune.',
        "",
        "torchtitan imports this module before it builds the model ([experimental] custom_import in torchtitan.toml);",
        f"keep it importable (launch_torchtitan.sh puts this folder on PYTHONPATH). FFN width {a.ffn_hidden}.",
        '"""',
        "",
        "from torchtitan.models.llama3 import llama3_args",
        "from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs",
        "",
        f'llama3_args["{CUSTOM_FLAVOR}"] = TransformerModelArgs({fields})',
        "",
    ])


def launcher_text(setup: RunSetup) -> str:
    """``launch_torchtitan.sh`` for 0.2.2: fills the TOML's placeholders with sed into outputs/ and runs it."""
    prepare = [
        "# the config as run: every placeholder filled (sed replaces whole values; the file keeps its own)",
        f"CONFIG=\"$PLAN_DIR/outputs/{FILE_NAME}\"",
        "mkdir -p \"$PLAN_DIR/outputs\"",
        "fill() { printf '%s' \"$1\" | sed 's/[\\\\&|]/\\\\&/g'; }",
        f"sed -e \"s|\\\"{PLACEHOLDER}DATASET\\\"|\\\"$(fill \"$DATASET\")\\\"|\" "
        f"-e \"s|\\\"{PLACEHOLDER}DATASET_PATH\\\"|\\\"$(fill \"$DATASET_PATH\")\\\"|\" "
        f"-e \"s|\\\"{PLACEHOLDER}HF_ASSETS_PATH\\\"|\\\"$(fill \"$HF_ASSETS_PATH\")\\\"|\" {FILE_NAME} > \"$CONFIG\"",
        "if [ \"$DATASET_PATH\" = none ]; then sed -i '/^dataset_path = /d' \"$CONFIG\"; fi",
        f"if grep -n '^[^#]*{PLACEHOLDER}' \"$CONFIG\" >&2; then",
        f"    echo \"{LAUNCHER}: placeholders left in $CONFIG (above): set them\" >&2",
        "    exit 2",
        "fi",
        "export CONFIG",
    ]
    return launcher_lines(setup, TORCHTITAN_VERSION, prepare, '--job.config_file "$CONFIG"')


def launcher_lines(setup: RunSetup, version: str, prepare: list[str], train_args: str) -> str:
    """The launcher both versions share: under SLURM (sbatch launch_torchtitan.sh) or by hand on each node
    (NODE_RANK, MASTER_ADDR); it stops naming any unset placeholder variable, runs ``prepare`` (bash lines) and
    then ``torch.distributed.run -m torchtitan.train <train_args>`` (bash words, expanded on the node)."""
    cl, c = setup.cluster, setup.candidate
    repo = f"--repo_id {setup.model.hub_id} " if setup.model.hub_id else ""
    env = {"DATASET": "a torchtitan dataset name (e.g. c4) or a registered custom one",
           "DATASET_PATH": "the local folder of the dataset (or none to load it by name)",
           "HF_ASSETS_PATH": f"the tokenizer folder of the model (python scripts/download_hf_assets.py {repo}--assets "
                             "tokenizer)"}
    if train_samples(setup.training) is None:   # the rule of every launcher (planner.emit.setup.NO_BUDGET)
        env["TRAIN_STEPS"] = f"the optimizer steps to train: {NO_BUDGET}"
        train_args += ' --training.steps "$TRAIN_STEPS"'
    from planner.emit.sbatch import SITE_SETTINGS
    lines = [
        "#!/bin/bash",
        f"# torchtitan {version} launch for {one_line(setup.model.name)}, written by plantune: "
        f"{cl.nodes} node(s) x {cl.gpus_per_node} GPUs, TP={c.tp} PP={c.pp} CP={c.cp} DP={c.dp}.",
        f"# pip install torchtitan=={version} (with its torch); then, from this folder:",
        "#   DATASET=... DATASET_PATH=... HF_ASSETS_PATH=... sbatch launch_torchtitan.sh",
        "# or on each node: NODE_RANK=i MASTER_ADDR=host0 DATASET=... ./launch_torchtitan.sh",
        f"#SBATCH --job-name=plantune-torchtitan", f"#SBATCH --nodes={cl.nodes}", "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gres=gpu:{cl.gpus_per_node}", "#SBATCH --exclusive", "#SBATCH --output=%x-%j.out",
        "",
        "set -eu -o pipefail",
        "PLAN_DIR=${PLAN_DIR:-${SLURM_SUBMIT_DIR:-$(cd \"$(dirname \"$0\")\" && pwd)}}",
        "cd \"$PLAN_DIR\"",
        "PYTHON=${PYTHON:-python}",
        *(f"{k}=${{{k}:?set {k} to {why}}}" for k, why in env.items()),
        *(["export TRAIN_STEPS   # read on each node by --training.steps"] if "TRAIN_STEPS" in env else []),
        "",
        *prepare,
        "",
        *SITE_SETTINGS,
        "",
        f"NNODES={cl.nodes}",
        f"GPUS_PER_NODE={cl.gpus_per_node}",
        "if [ -n \"${SLURM_JOB_NODELIST:-}\" ]; then",
        "    HOSTS=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\")  # no pipe: head would SIGPIPE it under pipefail",
        "    MASTER_ADDR=${HOSTS%%$'\\n'*}",
        "fi",
        "MASTER_ADDR=${MASTER_ADDR:-localhost}",
        "export PYTHON NNODES GPUS_PER_NODE MASTER_ADDR",
        "export PYTHONPATH=\"$PLAN_DIR${PYTHONPATH:+:$PYTHONPATH}\"   # plantune's module(s) in this folder",
        "# one torch.distributed.run per node; its node rank is SLURM_PROCID (one task per node) or NODE_RANK",
        "RUN=" + shlex.quote('exec "$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node '
                             '"$GPUS_PER_NODE" --node_rank "${SLURM_PROCID:-${NODE_RANK:-0}}" --rdzv_backend c10d '
                             f'--rdzv_endpoint "$MASTER_ADDR:29500" -m torchtitan.train {train_args} "$@"'),
        "if [ -n \"${SLURM_JOB_ID:-}\" ]; then",
        "    exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=\"$CPUS_PER_TASK\" "
        "${CONTAINER[@]+\"${CONTAINER[@]}\"} bash -c \"$RUN\" torchrun \"$@\"",
        "fi",
        "exec bash -c \"$RUN\" torchrun \"$@\"",
        "",
    ]
    return "\n".join(lines)


def files(setup: RunSetup) -> dict[str, str]:
    """The torchtitan job's files: the config, the launcher, and the model-args module for a custom flavor."""
    out = {FILE_NAME: torchtitan_text(setup), LAUNCHER: launcher_text(setup)}
    if setup.model.name not in LLAMA3_FLAVORS:
        out[MODEL_FILE] = model_file_text(setup)
    return out


__all__ = ["CUSTOM_FLAVOR", "FILE_NAME", "LAUNCHER", "LLAMA3_FLAVORS", "MODEL_FILE", "PLACEHOLDER",
           "TORCHTITAN_VERSION", "TorchtitanModelArgs", "activation_checkpoint", "files", "launcher_text",
           "model_args", "model_file_text", "toml_text", "torchtitan_dict", "torchtitan_text"]
