"""The model's own facts beyond its shape: RoPE base and scaling, norm epsilon and placement, biases, QK norm,
activation, soft-capping, sliding windows, and the MoE router's settings (ModelSpec's fields from ``architecture``
on). This module checks them when a ModelSpec is built and says which ones a model YAML may leave out; the
emitters (planner.emit) write them and `planner.rules.model_violations` refuses a target that cannot express one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.model import ModelSpec

QK_NORMS = ("", "head", "full")
NORM_PLACEMENTS = ("pre", "post", "sandwich")
ACTIVATIONS = ("", "gelu", "gelu_tanh", "silu", "relu")
MOE_SCORES = ("softmax", "sigmoid")
ROPE_SCALINGS = ("", "llama3", "yarn", "linear")
"""RoPE scalings plantune reads: Llama 3.1's (factor, 1/4/8192), YaRN (DeepSeek-V2/V3), linear interpolation"""

YAML_DEFAULTS: dict[str, object] = {
    "architecture": "", "hub_id": "", "max_positions": 0, "rope_theta": 0.0, "rotary_percent": 1.0, "norm_eps": 0.0,
    "qkv_bias": False, "qk_norm": "", "norm_placement": "pre", "activation": "", "parallel_residual": False,
    "attn_softcap": 0.0, "init_std": 0.0, "logit_softcap": 0.0, "sliding_window": 0, "window_full_every": 0,
    "yarn_mscale": 1.0,
    "yarn_mscale_all_dim": 0.0, "moe_aux_loss_coeff": 0.0, "moe_seq_aux": False, "moe_score": "softmax",
    "moe_norm_topk": True, "moe_topk_scale": 1.0, "moe_groups": 0, "moe_group_topk": 0, "moe_expert_bias": False,
    "moe_shared_gate": False,
}
"""the fields above at their defaults: a model YAML leaves them out (and plan.yaml does not write them)"""


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def problems(m: "ModelSpec") -> list[str]:
    """What makes these facts meaningless (checked by ModelSpec on construction)."""
    out: list[str] = []
    for name in ("max_positions", "sliding_window", "window_full_every", "moe_groups", "moe_group_topk"):
        v = getattr(m, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            out.append(f"{name} must be a non-negative integer, got {v!r}")
    for name in ("rope_theta", "norm_eps", "attn_softcap", "logit_softcap", "moe_aux_loss_coeff", "yarn_mscale_all_dim",
                 "init_std"):
        v = getattr(m, name)
        if not _number(v) or v < 0:
            out.append(f"{name} must be a number >= 0, got {v!r}")
    for name in ("rotary_percent",):
        v = getattr(m, name)
        if not _number(v) or not 0 < v <= 1:
            out.append(f"{name} must be a number in (0, 1], got {v!r}")
    for name in ("moe_topk_scale", "yarn_mscale"):
        v = getattr(m, name)
        if not _number(v) or v <= 0:
            out.append(f"{name} must be a number > 0, got {v!r}")
    for name in ("qkv_bias", "parallel_residual", "moe_seq_aux", "moe_norm_topk", "moe_expert_bias", "moe_shared_gate"):
        if not isinstance(getattr(m, name), bool):
            out.append(f"{name} must be true or false, got {getattr(m, name)!r}")
    for name, choices in (("qk_norm", QK_NORMS), ("norm_placement", NORM_PLACEMENTS), ("activation", ACTIVATIONS),
                          ("moe_score", MOE_SCORES), ("rope_scaling", ROPE_SCALINGS)):
        if getattr(m, name) not in choices:
            out.append(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {getattr(m, name)!r}")
    for name in ("architecture", "hub_id"):
        if not isinstance(getattr(m, name), str):
            out.append(f"{name} must be text, got {getattr(m, name)!r}")
    if out:
        return out
    if m.max_positions and m.max_positions < m.seq_len and m.position == "learned":
        out.append(f"seq_len {m.seq_len} is over the {m.max_positions} learned positions (max_positions)")
    if m.moe_group_topk > m.moe_groups or (m.moe_groups and m.num_experts % m.moe_groups):
        out.append(f"moe_groups {m.moe_groups} must divide the {m.num_experts} experts and be >= moe_group_topk "
                   f"{m.moe_group_topk}")
    if m.window_full_every and not m.sliding_window:
        out.append("window_full_every needs a sliding_window")
    return out


def _gated_gelu(m: "ModelSpec") -> bool:
    return m.glu and activation(m) != "silu"


def unexpressed(m: "ModelSpec", target: str) -> list[str]:
    """The facts ``target`` (megatron-lm | microsoft | bigscience | torchtitan) has no argument for: emitting without
    them would train another model. What each target can write is in planner.emit (megatron_lm, parallel_extras,
    megatron_deepspeed, facts.torchtitan_model_args)."""
    act = activation(m)
    common = [
        (m.parallel_residual, "attention and MLP side by side (parallel residual: GPT-NeoX, Falcon)"),
        (m.norm_placement != "pre", f"norms {'after' if m.norm_placement == 'post' else 'before and after'} "
                                    "attention and MLP (OLMo 2 / Gemma 2-3 placement)"),
        (m.qk_norm == "full", "a q/k RMSNorm over all heads (OLMo 2)"),
        (bool(m.attn_softcap or m.logit_softcap), "soft-capped logits (Gemma 2)"),
        (_gated_gelu(m), f"a gated {act} MLP (GeGLU: Gemma)"),
        (not m.glu and act not in ("gelu", "gelu_tanh"), f"a {act} MLP without a gate"),
    ]
    if target == "megatron-lm":
        # --window-size/--window-attn-skip-freq, --qk-layernorm, --add-qkv-bias, --rotary-percent, llama3/linear
        # scaling and MLA's YaRN are all Megatron-LM arguments (megatron/training/arguments.py)
        router = [(m.moe_score == "sigmoid" and not m.moe_norm_topk, "sigmoid routing without renormalised top-k"),
                  (m.moe_topk_scale != 1 and m.moe_score == "softmax" and m.moe_norm_topk,
                   "a routed-weight scale after renormalised softmax top-k (Megatron scales pre-softmax or sigmoid)")]
        yarn = [(m.rope_scaling == "yarn" and not m.kv_lora_rank, "YaRN RoPE scaling outside multi-latent attention")]
        return [what for bad, what in common + router + yarn if bad]
    limits = [(m.qk_norm == "head", "per-head q/k RMSNorm (Qwen3)"),
              (m.qkv_bias and not m.bias, "q/k/v biases alone (Qwen2)"),
              (bool(m.sliding_window), f"sliding-window attention ({m.sliding_window} tokens)"),
              (bool(m.rope_scaling) and not (target == "torchtitan" and m.rope_scaling == "llama3"),
               f"RoPE scaling {m.rope_scaling}")]
    if target in ("bigscience", "torchtitan"):
        limits.append((m.rotary_percent != 1 and m.position == "rope", f"rotary on {m.rotary_percent:g} of each head"))
    if target == "torchtitan":
        limits.append((act != "silu", f"a {act} MLP (torchtitan's llama3 is SwiGLU)"))
    return [what for bad, what in common + limits if bad]


def activation(m: "ModelSpec") -> str:
    """The MLP's activation, the default spelled out: silu with a gated MLP (SwiGLU), gelu otherwise."""
    return m.activation or ("silu" if m.glu else "gelu")


__all__ = ["ACTIVATIONS", "MOE_SCORES", "NORM_PLACEMENTS", "QK_NORMS", "ROPE_SCALINGS", "YAML_DEFAULTS",
           "activation", "problems", "unexpressed"]
