"""The one home of plantune's FLOPs and TFLOPs arithmetic.

Two definitions, kept apart on purpose:
- *model* FLOPs (MFU): forward + backward = 3x the forward matmuls, whatever is recomputed.
- *hardware* FLOPs (HFU): also counts the forward recomputed by activation checkpointing
  (full: the whole layer again, factor 4; selective: the attention core again).

Sources: Narayanan et al. 2021 (arXiv 2104.04473) Eq. 3; seed 001 ("model_size_in_B * 4 * 2 *
seqlen * global_batch_size / (time * total_gpus * 1e3)"); PaLM (arXiv 2204.02311) App. B for MFU.

How attention's s^2 work is counted (``attention``, `ATTENTION_COUNTS`): ``full`` counts QK^T and AV over the whole
s x s score matrix, as Narayanan et al. 2021 Eq. 3 (plantune's default, and the classic tables'); ``causal`` counts
half of it, what a causal mask computes, as Megatron-Bridge (src/megatron/bridge/training/utils/flop_utils.py,
``core_seq / 2``) and recent NeMo report model TFLOP/s. 1.04x apart at 8K tokens, 1.4x at 128K.
"""

from __future__ import annotations

from planner import moe
from planner.model import ModelSpec
from planner.recompute import Recomputed, recomputed


def layer_forward_matmul_flops(model: ModelSpec, tokens: int) -> float:
    """Forward matmul FLOPs of one transformer layer for ``tokens`` tokens of one sequence length.

    2 FLOPs per multiply-add: QKV 2t·h·(h+2kv), attention scores + values 2·2·t·s·h, output
    projection 2t·h², MLP 2t·h·f·(3 for SwiGLU else 2). For MHA with f=4h this is
    24·t·h² + 4·t·s·h, Narayanan et al. 2021 Sec. 5.1 (Eq. 3 before the factor).
    """
    if moe.needs_own_shape(model):
        return moe.layer_forward_matmul_flops(model, tokens)   # MoE (active experts) / MLA / explicit head width
    h, s, q = model.hidden, model.seq_len, model.q_dim   # q == h unless kv_channels (Gemma) says otherwise
    qkv = 2 * tokens * h * (q + 2 * model.kv_dim)
    attention = 2 * 2 * tokens * s * q
    proj = 2 * tokens * q * h
    mlp = 2 * tokens * h * model.ffn_hidden * (3 if model.glu else 2)
    return float(qkv + attention + proj + mlp)


ATTENTION_COUNTS = ("full", "causal")
ATTENTION_COUNT_WORDS = {
    "full": "attention s^2 counted in full (Narayanan et al. 2021 Eq. 3); --flops-attention causal counts half, "
            "as Megatron-Bridge and recent NeMo",
    "causal": "attention s^2 counted causal, half (Megatron-Bridge flop_utils.py, recent NeMo); --flops-attention "
              "full counts all of it, as Narayanan et al. 2021 Eq. 3",
}


def attention_score_flops(model: ModelSpec, tokens: int) -> float:
    """Forward QK^T and AV over the full s x s scores: 2·2·t·s·(heads·head_dim); MLA's q/k and v widths differ."""
    if model.kv_lora_rank:
        return moe.attention_core_flops(model, tokens)
    return float(2 * 2 * tokens * model.seq_len * model.q_dim)


def _causal_saving(model: ModelSpec, tokens: int, attention: str) -> float:
    """FLOPs a causal count leaves out of one layer's forward: half the score work."""
    if attention not in ATTENTION_COUNTS:
        raise ValueError(f"attention count {attention!r}: use one of {', '.join(ATTENTION_COUNTS)}")
    return 0.5 * attention_score_flops(model, tokens) if attention == "causal" else 0.0


def attention_core_forward_flops(model: ModelSpec, tokens: int) -> float:
    """The QK^T and AV part that selective recompute redoes (Korthikanti et al. 2022, Sec. 4.2)."""
    return float(2 * 2 * tokens * model.seq_len * model.q_dim)


def logits_forward_flops(model: ModelSpec, tokens: int) -> float:
    """The LM head: 2·t·h·V (Narayanan et al. 2021 Eq. 3's V/(16lh) term before the factor)."""
    return float(2 * tokens * model.hidden * model.vocab)


def model_flops_per_iteration(model: ModelSpec, global_batch: int, attention: str = "full") -> float:
    """Model FLOPs of one training iteration: 3 x forward (fwd + 2x bwd), no recompute counted.

    For MHA with f=4h this is 72·B·s·l·h²·(1 + s/6h + V/12lh), i.e. Narayanan et al. 2021 Eq. 3
    with 3 in place of 4 (``attention="full"``); ``causal`` counts half the s² term.
    """
    tokens = global_batch * model.seq_len
    layer = layer_forward_matmul_flops(model, tokens) - _causal_saving(model, tokens, attention)
    logits = logits_forward_flops(model, tokens)
    fwd = model.layers * layer + logits + moe.mtp_forward_flops(model, tokens, layer, logits)   # + MTP (DeepSeek-V3)
    return 3.0 * fwd


def hardware_flops_per_iteration(model: ModelSpec, global_batch: int, recompute: str | Recomputed,
                                 attention: str = "full", *, model_flops: float | None = None) -> float:
    """Model FLOPs plus the forward recomputed by activation checkpointing (HFU numerator).

    ``full`` adds one more forward of every layer: 96·B·s·l·h²·(1 + s/6h + V/16lh), exactly
    Narayanan et al. 2021 Eq. 3. ``selective`` adds the attention core only (Korthikanti 2022); partial modes
    (block-N, selective-layer-N, op-level SAC) their share (`planner.recompute.recomputed_of`: pass its answer
    for a candidate; a mode name is read on a single stage). ``model_flops``: `model_flops_per_iteration`'s answer
    when the caller has it.
    """
    tokens = global_batch * model.seq_len
    if isinstance(recompute, str):
        recompute = recomputed(model, recompute, model.layers, 1)
    saving = _causal_saving(model, tokens, attention)   # the recomputed forward counts attention as the model's
    layer = layer_forward_matmul_flops(model, tokens)
    core = attention_core_forward_flops(model, tokens)
    extra = model.layers * (recompute.layers * (layer - saving) + recompute.core * (core - saving)
                            + recompute.matmul * (layer - core))
    if model_flops is None:
        model_flops = model_flops_per_iteration(model, global_batch, attention)
    return model_flops + extra


def megatron_eq3_flops(*, global_batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 Eq. 3 verbatim: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s, l, h, v = global_batch, seq_len, layers, hidden, vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def seed001_tflops(*, params_b: float, seq_len: int, global_batch: int, seconds_per_iteration: float,
                   gpus: int, checkpoint_activations: bool) -> float:
    """Seed 001: model_size_in_B · (4 or 3) · 2 · seqlen · GBS / (time · gpus · 1e3), TFLOPs per GPU."""
    factor = 4 if checkpoint_activations else 3
    return params_b * factor * 2 * seq_len * global_batch / (seconds_per_iteration * gpus * 1e3)


def tflops_per_gpu(flops_per_iteration: float, seconds_per_iteration: float, gpus: int) -> float:
    """Achieved TFLOP/s per GPU (1 TFLOP = 1e12 FLOPs)."""
    return flops_per_iteration / (seconds_per_iteration * gpus) / 1e12
