"""Model and run facts the emitters write, taken from the model and the token budget (never BLOOM's for all).

The model's own facts are ModelSpec fields (``rope_theta``, ``norm_eps``, ``init_std``: the config.json's, the preset's
or the model YAML's; the RoPE base with its default is `planner.model.rope_theta`, re-exported here for the
emitters); otherwise the defaults below, each with its source.
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
VOCAB_MULTIPLE = 128
"""Megatron's --make-vocab-size-divisible-by default (both forks' megatron/arguments.py, Megatron-LM)"""


def dropout(model: ModelSpec) -> float | None:
    """Hidden and attention dropout; None keeps the framework's default (ModelSpec.dropout: Llama-style models train
    without)."""
    return None if model.dropout else 0.0


def init_std(model: ModelSpec) -> float:
    """Weight init std: the model's (config.json initializer_range), else Llama's 0.02 for RMSNorm models, else
    BigScience's small init sqrt(1/(3*hidden)) (tr11-176B: 0.0048)."""
    if model.init_std:
        return float(model.init_std)
    if model.norm == "rmsnorm":
        return LLAMA_INIT_STD
    return round(math.sqrt(1 / (3 * model.hidden)), 6)


def peak_lr(model: ModelSpec) -> float:
    """GPT-3's Table 2.1, interpolated log-linearly in the parameter count (clamped at its ends)."""
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
    """``--make-vocab-size-divisible-by``. Megatron pads the *tokenizer's* size up to a multiple of divisor * TP
    (megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding), while config.json's vocab_size is the
    embedding's rows, often more than the tokenizer has (Qwen2.5: 152,064 rows, 151,665 tokens). The model's
    vocabulary / TP makes the padding land on the model's rows for any tokenizer of at most that many tokens, so a
    converted checkpoint loads (Megatron-LM's own DeepSeek-V2-Lite conf, examples/post_training/modelopt/conf,
    passes 3200 for its 102,400). A vocabulary TP does not divide: the largest power of two <= 128 (Megatron's
    default) with divisor * TP dividing it (1: the tokenizer's size rounded to TP)."""
    if model.vocab % tp == 0:
        return model.vocab // tp
    d = 128
    while d > 1 and model.vocab % (d * tp):
        d //= 2
    return d


def vocab_note(model: ModelSpec, tp: int, target: str) -> str:
    """What the emitted embedding's rows are, beside config.json's vocab_size, for a converted checkpoint to load
    (``target``: megatron-lm | microsoft | bigscience | torchtitan); one line for the emitted file's header."""
    v = model.vocab
    if target in ("megatron-lm", "microsoft"):
        d = vocab_divisor(model, tp)
        if d * tp == v:
            return (f"Vocabulary: --make-vocab-size-divisible-by {d} x TP {tp} = {v}: Megatron pads the tokenizer's "
                    f"size to a multiple of it, so the embedding has the model's {v} rows (config.json vocab_size) "
                    f"for any tokenizer of at most {v} tokens, and a converted checkpoint's {v} rows load as they are.")
        return (f"Vocabulary: the model's {v} rows are not a multiple of TP {tp}: Megatron pads the tokenizer's size "
                f"to a multiple of {d * tp}, and a converted checkpoint's embedding and output layer must be padded or "
                "trimmed to that many rows.")
    if target == "bigscience":
        rows = padded_vocab(model, tp)
        if rows == v:
            return f"Vocabulary: --pad-vocab-size-to {rows}, the model's own rows: a converted checkpoint loads as is."
        return (f"Vocabulary: --pad-vocab-size-to {rows} (the fork needs a multiple of 128 and TP): a checkpoint of "
                f"the model's {v} rows loads only with its embedding (and output layer) padded to {rows} rows.")
    return (f"Vocabulary: vocab_size {v}, the model's rows (torchtitan does not pad): a converted checkpoint loads as "
            f"is, and the tokenizer must have at most {v} tokens.")


def padded_vocab(model: ModelSpec, tp: int) -> int:
    """The BigScience fork's ``--pad-vocab-size-to``: the model's vocabulary rounded up to a multiple of 128 (its
    --make-vocab-size-divisible-by default) and of TP. Its megatron/tokenizer/tokenizer.py _vocab_size_with_padding
    raises "N is not divisible by 128" otherwise (GPT-2's 50,257 -> 50,304; BLOOM's 250,880 is its own)."""
    multiple = math.lcm(VOCAB_MULTIPLE, tp)
    return -(-model.vocab // multiple) * multiple


def norm_eps(model: ModelSpec) -> float | None:
    """The norms' epsilon the model states (Qwen, OLMo 2: 1e-6); None keeps the framework's 1e-5."""
    return float(model.norm_eps) if model.norm_eps else None


def torchtitan_model_args(model: ModelSpec) -> dict:
    """torchtitan's llama3 ``TransformerModelArgs`` for the model (torchtitan/models/llama3/model/args.py): the
    feed-forward width comes out of its rounding, hidden = multiple_of * ceil(int(ffn_dim_multiplier * int(8 *
    dim / 3)) / multiple_of) (model.py FeedForward; no multiplier: int(8 * dim / 3)), exactly ffn_hidden with
    multiple_of = ffn_hidden and a multiplier only below 1; RoPE scaling is Llama 3.1's (RoPEScalingArgs: factor,
    1, 4, 8192), factor 1 leaving every frequency as it is."""
    base = int(2 * 4 * model.hidden / 3)
    return {"dim": model.hidden, "n_layers": model.layers, "n_heads": model.heads, "n_kv_heads": model.kv_heads,
            "vocab_size": model.vocab, "multiple_of": model.ffn_hidden,
            "ffn_dim_multiplier": None if base <= model.ffn_hidden else model.ffn_hidden / base,
            "norm_eps": norm_eps(model) or 1e-5,
            "rope_theta": rope_theta(model),
            "rope_scaling_args": {"scaling_factor": model.rope_scaling_factor if model.rope_scaling else 1.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192},
            "max_seq_len": model.positions}


def lr_args(model: ModelSpec, training: TrainingSpec) -> list[tuple[str, ...]]:
    """Megatron's learning-rate schedule for this model and token budget (decay over the whole run:
    --lr-decay-samples defaults to --train-samples)."""
    lr = peak_lr(model)
    args: list[tuple[str, ...]] = [("--lr", f"{lr:g}"), ("--min-lr", f"{lr * MIN_LR_RATIO:.3g}"),
                                   ("--lr-decay-style", "cosine")]
    warm = warmup_samples(training)
    args.append(("--lr-warmup-samples", str(warm)) if warm is not None else ("--lr-warmup-fraction", "0.01"))
    return args


__all__ = ["dropout", "init_std", "lr_args", "norm_eps", "padded_vocab", "peak_lr", "rope_theta",
           "torchtitan_model_args", "vocab_divisor", "vocab_note", "warmup_samples"]
