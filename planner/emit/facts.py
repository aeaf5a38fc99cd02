"""Model and run facts the emitters write, taken from the model and the token budget (never BLOOM's for all).

A ModelSpec field of the same name wins when the model file gives one (``dropout``, ``init_std``, ``lr``; the RoPE
base is a model fact, `planner.model.rope_theta`, re-exported here for the emitters); otherwise the defaults below,
each with its source.
"""

from __future__ import annotations

import math

from planner.model import ModelSpec, rope_theta
from planner.space import TrainingSpec

WARMUP_TOKENS = 375e6
"""linear LR warm-up over the first 375M tokens (GPT-3, Brown et al. 2020, App. B; BigScience tr11: 183,105 x 2048)"""
WARMUP_MAX_FRACTION = 0.01
"""plantune's cap: warm-up never longer than 1% of the run (a short run would otherwise never leave warm-up)"""
MIN_LR_RATIO = 0.1
"""cosine decay to 10% of the peak (GPT-3 App. B)"""
GPT3_LR = ((125e6, 6.0e-4), (350e6, 3.0e-4), (760e6, 2.5e-4), (1.3e9, 2.0e-4), (2.7e9, 1.6e-4), (6.7e9, 1.2e-4),
           (13e9, 1.0e-4), (175e9, 0.6e-4))
"""peak learning rate by parameter count (GPT-3, Brown et al. 2020, Table 2.1)"""
LLAMA_INIT_STD = 0.02
"""Llama's initializer_range (Hugging Face LlamaConfig, the published checkpoints' config.json)"""


def dropout(model: ModelSpec) -> float | None:
    """Hidden and attention dropout; None keeps the framework's default. Llama-style models (RMSNorm,
    no biases) train without dropout (Touvron et al. 2023, and Megatron-LM's examples/llama: 0.0)."""
    given = getattr(model, "dropout", None)
    if given is not None:
        return float(given)
    return 0.0 if model.norm == "rmsnorm" or not model.bias else None


def init_std(model: ModelSpec) -> float:
    """Weight init std: Llama's 0.02, else BigScience's small init sqrt(1/(3*hidden)) (tr11-176B: 0.0048)."""
    given = getattr(model, "init_std", None)
    if given:
        return float(given)
    if model.norm == "rmsnorm":
        return LLAMA_INIT_STD
    return round(math.sqrt(1 / (3 * model.hidden)), 6)


def peak_lr(model: ModelSpec) -> float:
    """GPT-3's Table 2.1, interpolated log-linearly in the parameter count (clamped at its ends)."""
    given = getattr(model, "lr", None)
    if given:
        return float(given)
    n = model.params
    if n <= GPT3_LR[0][0]:
        return GPT3_LR[0][1]
    for (n0, lr0), (n1, lr1) in zip(GPT3_LR, GPT3_LR[1:]):
        if n <= n1:
            t = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return float(f"{math.exp(math.log(lr0) + t * (math.log(lr1) - math.log(lr0))):.3g}")
    return GPT3_LR[-1][1]


def warmup_samples(training: TrainingSpec) -> int | None:
    """Warm-up in samples for the run's token budget (None when the budget is unknown)."""
    if training.train_tokens is None:
        return None
    tokens = min(WARMUP_TOKENS, WARMUP_MAX_FRACTION * training.train_tokens)
    return max(1, math.ceil(tokens / training.seq_len))


def vocab_divisor(model: ModelSpec, tp: int) -> int:
    """``--make-vocab-size-divisible-by``: the largest power of two <= 128 (Megatron's default) with
    divisor * TP dividing the model's vocabulary, so that Megatron's padding (a multiple of divisor * TP,
    megatron/tokenizer) lands on the model's own vocabulary at this TP."""
    d = 128
    while d > 1 and model.vocab % (d * tp):
        d //= 2
    return d


def lr_args(model: ModelSpec, training: TrainingSpec) -> list[tuple[str, ...]]:
    """Megatron's learning-rate schedule for this model and token budget (decay over the whole run:
    --lr-decay-samples defaults to --train-samples)."""
    lr = peak_lr(model)
    args: list[tuple[str, ...]] = [("--lr", f"{lr:g}"), ("--min-lr", f"{lr * MIN_LR_RATIO:.3g}"),
                                   ("--lr-decay-style", "cosine")]
    warm = warmup_samples(training)
    args.append(("--lr-warmup-samples", str(warm)) if warm is not None else ("--lr-warmup-fraction", "0.01"))
    return args


__all__ = ["dropout", "init_std", "lr_args", "peak_lr", "rope_theta", "vocab_divisor", "warmup_samples"]
