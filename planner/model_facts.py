"""The model's own facts beyond its shape: RoPE base and scaling, norm epsilon and placement, biases, QK norm,
activation, soft-capping, sliding windows, and the MoE router's settings (ModelSpec's fields from ``architecture``
on). planner.model checks them when a ModelSpec is built and says which ones a model YAML may leave out; this module
says which a target cannot express: the emitters (planner.emit) write them and `planner.rules.model_violations`
refuses a target that cannot express one.
"""

from __future__ import annotations

from planner.model import (ACTIVATIONS, MOE_SCORES, NORM_PLACEMENTS, QK_NORMS, ROPE_SCALINGS,  # noqa: F401
                           FACT_YAML_DEFAULTS as YAML_DEFAULTS, ModelSpec)

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
           "activation", "unexpressed"]
