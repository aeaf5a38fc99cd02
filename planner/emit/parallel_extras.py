"""What the emitters write for context parallel, experts (MoE/EP/ETP), MLA and FP8.

Megatron-LM names are NVIDIA/Megatron-LM's at commit c56b78489c309ce5e306637f3f36f52992d9fd56:
command-line flags from megatron/training/arguments.py (written into args.txt / megatron_args.sh by
`planner.emit.megatron_lm`); tests/test_emit_parallel.py pins every one. torchtitan keys are its
JobConfig's at pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce,
torchtitan/config/job_config.py: ``[parallelism] context_parallel_degree, expert_parallel_degree``,
``[model] converters = ["quantize.linear.float8"]``, ``[quantize.linear.float8] recipe_name,
enable_fsdp_float8_all_gather``), the version `planner.emit.fsdp` writes for.
Refusals are the rulebook's (`planner.rules.parallel_extras`, per target), so the emitters keep no rules of
their own.
"""

from __future__ import annotations

from planner import fp8, moe

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
    """Megatron-LM command-line flags (grouped with their values) for CP, EP/ETP, MoE, MLA, head width, FP8, RoPE
    scaling."""
    m, c, t = setup.model, setup.candidate, setup.training
    out: list[list[str]] = []
    if c.cp > 1:
        out += [["--context-parallel-size", str(c.cp)], ["--cp-comm-type", "p2p"]]
    if moe.is_moe(m):
        out += [["--num-experts", str(m.num_experts)], ["--moe-router-topk", str(m.moe_topk)],
                ["--moe-ffn-hidden-size", str(moe.expert_ffn(m))], ["--moe-layer-freq", str(_moe_layer_freq(m))],
                ["--expert-model-parallel-size", str(c.ep)], ["--expert-tensor-parallel-size", str(c.etp)],
                ["--moe-grouped-gemm"], *moe.dispatcher_flags(t)]
        out += router_flags(m)
        if m.shared_experts:
            out.append(["--moe-shared-expert-intermediate-size", str(m.shared_experts * moe.expert_ffn(m))])
            if m.moe_shared_gate:
                out.append(["--moe-shared-expert-gate"])
        if t.moe_capacity_factor:
            out += [["--moe-expert-capacity-factor", str(t.moe_capacity_factor)], ["--moe-pad-expert-input-to-capacity"]]
    if m.kv_lora_rank:
        out += [["--multi-latent-attention"], ["--kv-lora-rank", str(m.kv_lora_rank)],
                ["--qk-head-dim", str(m.head_dim)], ["--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)],
                ["--v-head-dim", str(m.v_head_dim or m.head_dim)]]
        if m.q_lora_rank:
            out.append(["--q-lora-rank", str(m.q_lora_rank)])
        if m.rope_scaling == "yarn":   # MLA's YaRN (MLATransformerConfig: beta 32/1, 4,096 original positions)
            out += [["--rotary-scaling-factor", f"{m.rope_scaling_factor:g}"], ["--mscale", f"{m.yarn_mscale:g}"],
                    ["--mscale-all-dim", f"{m.yarn_mscale_all_dim:g}"]]
    elif m.kv_channels:   # a head width apart from hidden / heads (Gemma, Qwen3)
        out.append(["--kv-channels", str(m.kv_channels)])
    if t.precision == "fp8":
        out += [["--fp8-format", "hybrid"], ["--fp8-recipe", t.fp8_recipe]]
        if t.fp8_recipe == "delayed":
            out += [["--fp8-amax-history-len", str(FP8_AMAX_HISTORY_LEN)],
                    ["--fp8-amax-compute-algo", FP8_AMAX_COMPUTE_ALGO]]
        if fp8.fp8_param_gather(c, t):   # FP8 weights, all-gathered in FP8 by the distributed optimizer
            out.append(["--fp8-param-gather"])
    if m.rope_scaling == "llama3":
        out += [["--use-rope-scaling"], ["--rope-scaling-factor", str(m.rope_scaling_factor)]]
    elif m.rope_scaling == "linear":
        out.append(["--rotary-seq-len-interpolation-factor", str(int(m.rope_scaling_factor))])
    return out


def router_flags(m) -> list[list[str]]:
    """The router as the model trained it (Megatron-Core TransformerConfig moe_router_*): the load-balancing loss
    and its weight (Megatron's --moe-aux-loss-coeff default is 0.0: no balancing), score function, pre-softmax
    top-k for routers that do not renormalise, routed-weight scale, group-limited routing, expert bias."""
    out = [["--moe-router-load-balancing-type", "seq_aux_loss" if m.moe_seq_aux else "aux_loss"],
           ["--moe-aux-loss-coeff", f"{m.moe_aux_loss_coeff:g}"]]
    if m.moe_score != "softmax":
        out.append(["--moe-router-score-function", m.moe_score])
    if m.moe_score == "softmax" and not m.moe_norm_topk:
        out.append(["--moe-router-pre-softmax"])
    if m.moe_topk_scale != 1:
        out.append(["--moe-router-topk-scaling-factor", f"{m.moe_topk_scale:g}"])
    if m.moe_groups:
        out += [["--moe-router-num-groups", str(m.moe_groups)], ["--moe-router-group-topk", str(m.moe_group_topk)]]
    if m.moe_expert_bias:
        out.append(["--moe-router-enable-expert-bias"])
    return out


def merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s keys laid over it, one level into its sections."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def torchtitan_dict(setup) -> dict:
    """torchtitan JobConfig sections for float8 (``--precision fp8``), as v0.2.2 names them (its
    components/quantization/float8.py registers the converter "quantize.linear.float8"; config/job_config.py
    Float8Linear: recipe_name, enable_fsdp_float8_all_gather). CP and EP degrees are in `planner.emit.fsdp`'s
    [parallelism] table."""
    if setup.training.precision != "fp8":
        return {}
    if setup.training.fp8_recipe == "mxfp8":   # torchao MXLinear (components/quantization/mx.py), cuBLAS MX GEMMs
        return {"model": {"converters": ["quantize.linear.mx"]},
                "quantize.linear.mx": {"recipe_name": "mxfp8_cublas"}}
    if setup.training.fp8_recipe == "rowwise":   # torchao: float8 all-gather is for tensorwise scaling only
        return {"model": {"converters": ["quantize.linear.float8"]},
                "quantize.linear.float8": {"recipe_name": "rowwise"}}
    return {"model": {"converters": ["quantize.linear.float8"]},
            "quantize.linear.float8": {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": True}}


__all__ = ["megatron_lm_flags", "merge", "router_flags", "torchtitan_dict"]
