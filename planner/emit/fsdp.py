"""FSDP: a torchtitan job TOML (``torchrun ... -m torchtitan.train --job.config_file torchtitan.toml``).

Section and field names are pytorch/torchtitan v0.2.2's torchtitan/config/job_config.py (the last release
configured by TOML; its torchtitan/models/llama3/train_configs/llama3_70b.toml has the same shape);
tests/test_emit_argnames.py pins them. plantune's ZeRO stage maps onto FSDP2's mesh:
ZeRO-0 (NO_SHARD) -> data_parallel_replicate_degree = DP (DDP); ZeRO-2 (SHARD_GRAD_OP) -> shard over DP,
fsdp_reshard_after_forward = "never"; ZeRO-3 (FULL_SHARD) -> "always"; hybrid (HYBRID_SHARD) -> shard inside
a node, replicate across nodes (HSDP). GAS follows from global_batch_size / (local_batch_size * DP).
Context parallel is ``context_parallel_degree``, expert parallel ``expert_parallel_degree`` (1: the emitted
llama3 model has no experts, `planner.rules.model_violations`), ``--precision fp8`` the float8 converter
(`planner.emit.parallel_extras.torchtitan_dict`).
"""

from __future__ import annotations

import math

from planner import recompute as recompute_modes
from planner.emit import facts, parallel_extras
from planner.emit.setup import RunSetup, one_line, train_samples

FILE_NAME = "torchtitan.toml"
TORCHTITAN_VERSION = "0.2.2"
LLAMA3_FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
"""plantune presets that are torchtitan's own llama3 flavors (torchtitan/models/llama3/__init__.py)"""
_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}   # fp8: float8 GEMMs, bf16 params


def _mesh(setup: RunSetup) -> dict:
    c, cl = setup.candidate, setup.cluster
    if c.hybrid:
        shard = min(c.dp, cl.gpus_per_node)
        return {"data_parallel_replicate_degree": c.dp // shard, "data_parallel_shard_degree": shard,
                "fsdp_reshard_after_forward": "always"}
    if c.zero == 0:
        return {"data_parallel_replicate_degree": c.dp, "data_parallel_shard_degree": 1,
                "fsdp_reshard_after_forward": "default"}
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": c.dp,
            "fsdp_reshard_after_forward": "always" if c.zero == 3 else "never"}


def torchtitan_dict(setup: RunSetup) -> dict[str, dict]:
    m, c, t = setup.model, setup.candidate, setup.training
    samples = train_samples(t)
    steps = math.ceil(samples / t.global_batch) if samples is not None else None
    warm = facts.warmup_samples(t)
    lr = facts.peak_lr(m)
    return parallel_extras.merge({
        "job": {"dump_folder": "./outputs", "description": f"{one_line(m.name)}, written by plantune"},
        "metrics": {"log_freq": 1, "enable_tensorboard": True, "save_tb_folder": "tb"},
        "model": {"name": "llama3", "flavor": LLAMA3_FLAVORS.get(m.name, m.name),
                  "hf_assets_path": f"./assets/hf/{one_line(m.name)}"},
        "optimizer": {"name": "AdamW", "lr": lr, "eps": 1e-8, "weight_decay": 0.1},
        "lr_scheduler": {"warmup_steps": max(1, math.ceil(warm / t.global_batch)) if warm else 200,
                         "decay_type": "cosine", "min_lr_factor": facts.MIN_LR_RATIO},
        "training": {"local_batch_size": c.mbs, "global_batch_size": t.global_batch, "seq_len": t.seq_len,
                     "max_norm": 1.0, "steps": steps if steps is not None else 10000,
                     "mixed_precision_param": _DTYPES[t.precision], "mixed_precision_reduce": "float32"},
        "parallelism": {**_mesh(setup), "tensor_parallel_degree": c.tp, "pipeline_parallel_degree": c.pp,
                        "context_parallel_degree": c.cp, "expert_parallel_degree": c.ep},
        "checkpoint": {"enable": True, "folder": "checkpoint", "interval": 500},
        "activation_checkpoint": recompute_modes.torchtitan_activation_checkpoint(c.recompute),
        "compile": {"enable": False},
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
    m, c, cl, t = setup.model, setup.candidate, setup.cluster, setup.training
    d = torchtitan_dict(setup)
    head = [f"torchtitan {TORCHTITAN_VERSION} job config for {one_line(m.name)}, written by plantune: "
            f"FSDP {c.fsdp_strategy}, DP={c.dp}{f', CP={c.cp}' if c.cp > 1 else ''}, MBS={c.mbs}, GAS={c.gas}, recompute {c.recompute}.",
            f"Run on each of the {cl.nodes} node(s): torchrun --nnodes {cl.nodes} --nproc_per_node {cl.gpus_per_node} "
            "--rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:29500 -m torchtitan.train --job.config_file "
            f"{FILE_NAME}",
            "Set [model].hf_assets_path to the tokenizer folder, and [training].dataset / dataset_path to your data."]
    if m.name not in LLAMA3_FLAVORS:
        model_args = ", ".join(f"{k}={_py(v)}" for k, v in facts.torchtitan_model_args(m).items())
        head.append(f"torchtitan has no flavor {one_line(m.name)!r}: register it in torchtitan/models/llama3/"
                    f"__init__.py as TransformerModelArgs({model_args}) (feed-forward width {m.ffn_hidden}).")
    if train_samples(t) is None:
        head.append("No token budget was given: set [training].steps.")
    return "".join(f"# {line}\n" for line in head) + "\n" + toml_text(d)


__all__ = ["FILE_NAME", "LLAMA3_FLAVORS", "TORCHTITAN_VERSION", "toml_text", "torchtitan_dict", "torchtitan_text"]
