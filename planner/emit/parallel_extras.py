"""What the emitters write for context parallel, experts (MoE/EP/ETP), MLA and FP8, and what they refuse.

Megatron-LM names are NVIDIA/Megatron-LM's at commit c56b78489c309ce5e306637f3f36f52992d9fd56:
command-line flags from megatron/training/arguments.py, ``--yaml-cfg`` keys from the fields of
TransformerConfig / MLATransformerConfig (``language_model:``) and ModelParallelConfig
(``model_parallel:``); tests/test_emit_parallel.py pins every one. torchtitan keys are its
JobConfig's at pytorch/torchtitan commit 3065a2aebbf2dc0e635deb35c175f28eedd94690
(torchtitan/config/job_config.py: ``[parallelism] context_parallel_degree, expert_parallel_degree``,
``[model] converters = ["float8"]``, ``[float8] recipe_name, enable_fsdp_float8_all_gather``).
Refusals reuse the planner's own rules (planner.context_parallel, planner.moe, planner.fp8) for the
emit target, so the emitters keep no rules of their own.
"""

from __future__ import annotations

from dataclasses import replace

from planner import context_parallel, fp8, moe

# Transformer Engine's delayed-scaling recipe as NVIDIA's recipes run it (NeMo/Megatron-Bridge FP8 defaults:
# amax history 1024, amax from the max of the history).
FP8_AMAX_HISTORY_LEN = 1024
FP8_AMAX_COMPUTE_ALGO = "max"


def _moe_layer_freq(m) -> int | str:
    """Megatron's --moe-layer-freq: an int, or a Python list pattern for leading dense layers."""
    if not m.first_dense_layers:
        return m.moe_layer_freq
    pattern = [0] * m.first_dense_layers + [1 if i % m.moe_layer_freq == 0 else 0
                                            for i in range(m.layers - m.first_dense_layers)]
    return "[" + ",".join(map(str, pattern)) + "]"


def megatron_lm_flags(setup) -> list[list[str]]:
    """Megatron-LM command-line flags (grouped with their values) for CP, EP/ETP, MoE, MLA, FP8, RoPE scaling."""
    m, c, t = setup.model, setup.candidate, setup.training
    out: list[list[str]] = []
    if c.cp > 1:
        out += [["--context-parallel-size", str(c.cp)], ["--cp-comm-type", "p2p"]]
    if moe.is_moe(m):
        out += [["--num-experts", str(m.num_experts)], ["--moe-router-topk", str(m.moe_topk)],
                ["--moe-ffn-hidden-size", str(moe.expert_ffn(m))], ["--moe-layer-freq", str(_moe_layer_freq(m))],
                ["--expert-model-parallel-size", str(c.ep)], ["--expert-tensor-parallel-size", str(c.etp)],
                ["--moe-grouped-gemm"], ["--moe-token-dispatcher-type", "alltoall"],
                ["--moe-router-load-balancing-type", "aux_loss"]]
        if m.shared_experts:
            out.append(["--moe-shared-expert-intermediate-size", str(m.shared_experts * moe.expert_ffn(m))])
        if t.moe_capacity_factor:
            out += [["--moe-expert-capacity-factor", str(t.moe_capacity_factor)], ["--moe-pad-expert-input-to-capacity"]]
    if m.kv_lora_rank:
        out += [["--multi-latent-attention"], ["--kv-lora-rank", str(m.kv_lora_rank)],
                ["--qk-head-dim", str(m.head_dim)], ["--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)],
                ["--v-head-dim", str(m.v_head_dim or m.head_dim)]]
        if m.q_lora_rank:
            out.append(["--q-lora-rank", str(m.q_lora_rank)])
    if t.precision == "fp8":
        out += [["--fp8-format", "hybrid"], ["--fp8-recipe", "delayed"],
                ["--fp8-amax-history-len", str(FP8_AMAX_HISTORY_LEN)], ["--fp8-amax-compute-algo", FP8_AMAX_COMPUTE_ALGO]]
    if m.rope_scaling == "llama3":
        out += [["--use-rope-scaling"], ["--rope-scaling-factor", str(m.rope_scaling_factor)]]
    return out


def megatron_lm_yaml(setup) -> dict:
    """The same for ``--yaml-cfg``: {"language_model": {...}, "model_parallel": {...}, top-level keys}."""
    m, c, t = setup.model, setup.candidate, setup.training
    lm: dict = {}
    mp: dict = {"context_parallel_size": c.cp, "expert_model_parallel_size": c.ep,
                "expert_tensor_parallel_size": c.etp}
    top: dict = {}
    if c.cp > 1:
        mp["cp_comm_type"] = "p2p"
    if moe.is_moe(m):
        lm.update(num_moe_experts=m.num_experts, moe_router_topk=m.moe_topk, moe_ffn_hidden_size=moe.expert_ffn(m),
                  moe_layer_freq=(m.moe_layer_freq if not m.first_dense_layers
                                  else [int(x) for x in str(_moe_layer_freq(m)).strip("[]").split(",")]),
                  moe_shared_expert_intermediate_size=(m.shared_experts * moe.expert_ffn(m)) or None,
                  moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall",
                  moe_router_load_balancing_type="aux_loss", moe_expert_capacity_factor=t.moe_capacity_factor,
                  moe_pad_expert_input_to_capacity=bool(t.moe_capacity_factor))
    if m.kv_lora_rank:
        lm["multi_latent_attention"] = True
    if t.precision == "fp8":
        lm.update(fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=FP8_AMAX_HISTORY_LEN,
                  fp8_amax_compute_algo=FP8_AMAX_COMPUTE_ALGO)
        mp["bf16"] = True   # FP8 GEMMs inside bf16 training (TE keeps bf16 weights)
    if m.rope_scaling == "llama3":
        top.update(use_rope_scaling=True, rope_scaling_factor=m.rope_scaling_factor)
    return {"language_model": lm, "model_parallel": mp, **top}


def merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s keys laid over it, one level into its sections."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def yaml_header(setup) -> str:
    """Comment lines for megatron_lm.yaml: the command-line equivalent, and what --yaml-cfg drops."""
    flags = megatron_lm_flags(setup)
    if not flags:
        return ""
    lines = ["# Command-line equivalent of the CP/EP/MoE/FP8 settings below (megatron/training/arguments.py):",
             "#   " + " ".join(" ".join(f) for f in flags)]
    if setup.model.kv_lora_rank:
        lines.append("# MLA: yaml_arguments.py builds MLATransformerConfig from TransformerConfig fields only, so the "
                     "latent ranks above need those flags, not --yaml-cfg.")
    return "\n".join(lines) + "\n"


def torchtitan_dict(setup) -> dict:
    """torchtitan JobConfig sections for CP, EP and float8 (only where a plan uses them)."""
    c, t = setup.candidate, setup.training
    out: dict = {}
    if c.cp > 1 or c.ep > 1:
        out["parallelism"] = {"context_parallel_degree": c.cp, "expert_parallel_degree": c.ep}
    if t.precision == "fp8":
        out["model"] = {"converters": ["float8"]}
        out["float8"] = {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": True}
    return {"torchtitan": out} if out else {}


def problems(setup, kind: str) -> list[str]:
    """What ``kind`` cannot run of this setup's CP / EP / MoE / FP8, as the planner's rules say for that target."""
    training = replace(setup.training, framework=kind)
    out = []
    for rules in (context_parallel.violations, moe.violations, fp8.violations):
        out += [detail for _, detail in rules(setup.model, setup.candidate, setup.cluster, training)]
    if kind == "fsdp" and moe.is_moe(setup.model) and setup.candidate.ep > 1 and \
            not setup.candidate.cp <= setup.candidate.ep <= setup.candidate.dp * setup.candidate.cp:
        out.append(f"torchtitan needs CP <= EP <= DP*CP (job_config.py expert_parallel_degree), got CP={setup.candidate.cp}"
                   f" EP={setup.candidate.ep} DP={setup.candidate.dp}")
    if kind == "fsdp" and setup.model.kv_lora_rank:
        out.append("the FSDP YAML cannot describe multi-latent attention; emit megatron-lm")
    return out


__all__ = ["megatron_lm_flags", "megatron_lm_yaml", "merge", "problems", "torchtitan_dict", "yaml_header"]
