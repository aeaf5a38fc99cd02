"""Megatron-LM's experimental ``--yaml-cfg`` layout (megatron/training/yaml_arguments.py).

Sections ``language_model:`` (TransformerConfig fields) and ``model_parallel:`` (ModelParallelConfig
fields), everything else top-level under argparse dest names, as in NVIDIA/Megatron-LM
examples/gpt3/gpt_config.yaml. Megatron-LM reads every field of its config dataclasses from the
YAML and fails on a missing one, so this file holds what plantune decides and is meant to be laid
over that complete example (keys here win).
"""

from __future__ import annotations

from planner.emit import parallel_extras
from planner.emit.plan_yaml import dump_yaml
from planner.emit.setup import MEGATRON_OPTIMIZERS, RunSetup, one_line, train_samples

FILE_NAME = "megatron_lm.yaml"


def megatron_lm_dict(setup: RunSetup) -> dict:
    """The overlay. Without a token budget train_samples is left out, so the base file's value stands."""
    m, c, t = setup.model, setup.candidate, setup.training
    samples = train_samples(t)
    recompute = {"none": (None, None, None), "selective": ("selective", None, None),
                 "full": ("full", "uniform", 1)}[c.recompute]
    return parallel_extras.merge({   # CP / EP / MoE / FP8 keys laid over (planner.emit.parallel_extras)
        "language_model": {
            "num_layers": m.layers,
            "hidden_size": m.hidden,
            "num_attention_heads": m.heads,
            "num_query_groups": m.kv_heads if m.kv_heads != m.heads else None,
            "ffn_hidden_size": m.ffn_hidden,
            "add_bias_linear": m.bias,
            "gated_linear_unit": m.glu,
            "activation_func": "swiglu" if m.glu else "gelu",
            "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            "recompute_granularity": recompute[0],
            "recompute_method": recompute[1],
            "recompute_num_layers": recompute[2],
        },
        "model_parallel": {
            "tensor_model_parallel_size": c.tp,
            "pipeline_model_parallel_size": c.pp,
            "virtual_pipeline_model_parallel_size": c.vpp if c.vpp > 1 else None,
            "sequence_parallel": c.sp,
            "fp16": t.precision == "fp16",
            "bf16": t.precision == "bf16",
        },
        "micro_batch_size": c.mbs,
        "global_batch_size": t.global_batch,
        "rampup_batch_size": t.rampup.as_list() if t.rampup else None,
        "num_layers_per_virtual_pipeline_stage": m.layers // (c.pp * c.vpp) if c.vpp > 1 else None,
        "group_query_attention": m.kv_heads != m.heads,
        "untie_embeddings_and_output_weights": not m.tied_embeddings,
        "position_embedding_type": "rope" if m.position == "rope" else "learned_absolute",
        "add_position_embedding": m.position == "learned",
        "swiglu": m.glu,
        "max_position_embeddings": m.seq_len,
        "seq_length": t.seq_len,
        **({"train_samples": samples, "train_iters": None} if samples is not None else {}),
        "use_flash_attn": t.flash_attention,
        "use_distributed_optimizer": c.zero == 1,
        "optimizer": MEGATRON_OPTIMIZERS[t.optimizer],
        "clip_grad": 1.0,
    }, parallel_extras.megatron_lm_yaml(setup))


def megatron_lm_text(setup: RunSetup) -> str:
    c = setup.candidate
    head = (f"# WARNING: Megatron-LM's YAML configs are experimental (--yaml-cfg {FILE_NAME}).\n"
            f"# Written by plantune for {one_line(setup.model.name)}: "
            f"TP={c.tp} PP={c.pp} DP={c.dp} MBS={c.mbs} GAS={c.gas}.\n"
            "# Lay it over NVIDIA/Megatron-LM examples/gpt3/gpt_config.yaml (every other field comes from there);\n"
            "# set CUDA_DEVICE_MAX_CONNECTIONS=1 when sequence_parallel is true.\n")
    return head + parallel_extras.yaml_header(setup) + dump_yaml(megatron_lm_dict(setup))


__all__ = ["FILE_NAME", "megatron_lm_dict", "megatron_lm_text"]
