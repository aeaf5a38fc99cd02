"""A plain YAML for PyTorch FSDP: sharding strategy, activation checkpointing, mixed precision, batches.

Strategy names are torch.distributed.fsdp.ShardingStrategy's: ZeRO 0 -> NO_SHARD, 2 -> SHARD_GRAD_OP,
3 -> FULL_SHARD, hybrid -> HYBRID_SHARD (FULL_SHARD inside a node, replicas across nodes).
"""

from __future__ import annotations

from planner.emit import parallel_extras
from planner.emit.plan_yaml import dump_yaml
from planner.emit.setup import RunSetup, one_line, train_samples

FILE_NAME = "fsdp.yaml"
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}   # fp8: float8 GEMMs, bf16 params


def fsdp_dict(setup: RunSetup) -> dict:
    c, t, cl = setup.candidate, setup.training, setup.cluster
    return {
        "sharding_strategy": c.fsdp_strategy,
        "activation_checkpointing": c.recompute,
        "mixed_precision": {"param_dtype": _DTYPES[t.precision], "reduce_dtype": "float32",
                            "buffer_dtype": _DTYPES[t.precision]},
        "micro_batch_size_per_gpu": c.mbs,
        "gradient_accumulation_steps": c.gas,
        "global_batch_size": t.global_batch,
        "rampup_batch_size": t.rampup.as_list() if t.rampup else None,
        "seq_length": t.seq_len,
        "train_samples": train_samples(t),
        "world_size": cl.world_size,
        "nodes": cl.nodes,
        "gpus_per_node": cl.gpus_per_node,
        "data_parallel_size": c.dp,
        "tensor_parallel_size": c.tp,
        "pipeline_parallel_size": c.pp,
        "virtual_pipeline_stages": c.vpp,
        "sequence_parallel": c.sp,
        "optimizer": t.optimizer,
        "flash_attention": t.flash_attention,
        "context_parallel_size": c.cp,
        "expert_parallel_size": c.ep,
        **parallel_extras.torchtitan_dict(setup),   # torchtitan JobConfig keys for CP / EP / float8
    }


def fsdp_text(setup: RunSetup) -> str:
    head = (f"# FSDP plan for {one_line(setup.model.name)}, written by plantune. sharding_strategy is a\n"
            "# torch.distributed.fsdp.ShardingStrategy name; activation_checkpointing none|selective|full.\n")
    return head + dump_yaml(fsdp_dict(setup))


__all__ = ["FILE_NAME", "fsdp_dict", "fsdp_text"]
