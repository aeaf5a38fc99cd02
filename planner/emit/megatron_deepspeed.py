"""Megatron-DeepSpeed: ``pretrain_gpt.py`` arguments (args.txt, megatron_args.sh) and ``ds_config.json``.

Flag spellings are the forks' own (bigscience-workshop/Megatron-DeepSpeed and microsoft, now
deepspeedai/Megatron-DeepSpeed, megatron/arguments.py; ``--deepspeed``/``--deepspeed_config`` from
DeepSpeed's deepspeed/__init__.py); tests/test_emit_argnames.py pins every one of them.
Only what plantune decides is here (the layout, the model's facts, the learning-rate schedule for the token
budget: planner.emit.facts); data, tokenizer, checkpoints and logging live in launch.sbatch.
"""

from __future__ import annotations

import json
import shlex

from planner.emit import facts
from planner.emit.setup import MEGATRON_OPTIMIZERS, RunSetup, train_samples

DS_CONFIG_NAME = "ds_config.json"
GRADIENT_CLIPPING = 1.0
"""written both as --clip-grad and as the JSON's gradient_clipping (tr11-176B-ml.slurm: CLIP_GRAD=1.0)"""

Arg = tuple[str, ...]
"""one command-line argument: the flag, then its values"""


def json_zero_stage(setup: RunSetup, flavor: str) -> int:
    """The ZeRO stage DeepSpeed is given. The bigscience fork with bf16 runs its own ZeRO-1-like
    BF16 optimizer and wants stage 0 in the JSON (tr11-176B-ml.slurm: ZERO_STAGE=0 with bf16)."""
    if flavor == "bigscience" and setup.training.precision == "bf16":
        return 0
    return setup.candidate.zero


def _shape_args(setup: RunSetup, flavor: str) -> list[Arg]:
    m, t = setup.model, setup.training
    args: list[Arg] = [("--num-layers", str(m.layers)), ("--hidden-size", str(m.hidden)),
                       ("--ffn-hidden-size", str(m.ffn_hidden)), ("--num-attention-heads", str(m.heads))]
    if flavor == "microsoft" and m.kv_heads != m.heads:
        args.append(("--num-key-value-heads", str(m.kv_heads)))
    args.append(("--seq-length", str(t.seq_len)))
    # The bigscience fork asserts max_position_embeddings is None with rotary positions.
    if not (flavor == "bigscience" and m.position == "rope"):
        args.append(("--max-position-embeddings", str(m.positions)))
    eps = facts.norm_eps(m)
    if eps is not None:   # both forks: --layernorm-epsilon (megatron/arguments.py)
        args.append(("--layernorm-epsilon", f"{eps:g}"))
    drop = facts.dropout(m)
    if drop is not None:
        args += [("--attention-dropout", f"{drop:g}"), ("--hidden-dropout", f"{drop:g}")]
    args.append(("--init-method-std", f"{facts.init_std(m):g}"))
    if flavor == "bigscience":
        # one padded vocabulary whatever the TP (tr11-176B-ml.slurm: --pad-vocab-size-to 250880), a multiple of 128
        # and of TP as the fork's tokenizer requires (GPT-2's 50,257 -> 50,304)
        args.append(("--pad-vocab-size-to", str(facts.padded_vocab(m, setup.candidate.tp))))
        position = {"learned": None, "alibi": "alibi", "rope": "rotary"}[m.position]
        if position:
            args.append(("--position-embedding-type", position))
        if m.embedding_norm:
            args.append(("--embed-layernorm",))
        if m.glu:  # the fork raises unless bias-gelu fusion is off with a GLU activation
            args += [("--glu-activation", "swiglu"), ("--no-bias-gelu-fusion",)]
    else:
        args.append(("--make-vocab-size-divisible-by", str(facts.vocab_divisor(m, setup.candidate.tp))))
        if m.position == "rope":
            args += [("--use-rotary-position-embeddings",),
                     ("--rotary-position-embeddings-theta", str(int(facts.rope_theta(m))))]
            if m.rotary_percent != 1:
                args.append(("--rotary-percent", f"{m.rotary_percent:g}"))
        if m.glu:
            args.append(("--swiglu",))
        if m.norm == "rmsnorm":
            args.append(("--normalization", "rmsnorm"))
        if not m.tied_embeddings:
            args.append(("--untie-embeddings-and-output-weights",))
        if not m.bias:
            args.append(("--disable-bias-linear",))
    return args


def megatron_args(setup: RunSetup, flavor: str) -> list[Arg]:
    """Every argument plantune decides, in the order a person reads a Megatron launcher."""
    c, t = setup.candidate, setup.training
    args = _shape_args(setup, flavor)
    args += [("--tensor-model-parallel-size", str(c.tp)), ("--pipeline-model-parallel-size", str(c.pp))]
    if flavor == "microsoft" and c.pp == 1:
        args.append(("--no-pipeline-parallel",))  # DeepSpeed's plain engine: ZeRO-2/3 allowed
    if c.sp:
        args.append(("--sequence-parallel",))
    args += [("--micro-batch-size", str(c.mbs)), ("--global-batch-size", str(t.global_batch))]
    if t.rampup:
        args.append(("--rampup-batch-size", *map(str, t.rampup.as_list())))
    samples = train_samples(t)
    if samples is not None:
        args.append(("--train-samples", str(samples)))
    args += [("--optimizer", MEGATRON_OPTIMIZERS[t.optimizer]), ("--clip-grad", str(GRADIENT_CLIPPING))]
    args += facts.lr_args(setup.model, t)
    if t.precision in ("bf16", "fp16"):
        args.append((f"--{t.precision}",))
    if c.recompute == "full":
        args.append(("--checkpoint-activations",))
    elif c.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    if flavor == "microsoft" and t.flash_attention:   # Megatron-DeepSpeed arguments.py: v1 (flash-attn 1.x) or v2
        args.append(("--use-flash-attn-v1",) if t.attention_kernel == "fa1" else ("--use-flash-attn-v2",))
    args += [("--deepspeed",), ("--deepspeed_config", DS_CONFIG_NAME),
             ("--zero-stage", str(json_zero_stage(setup, flavor)))]
    if c.recompute == "full":
        args.append(("--deepspeed-activation-checkpointing",))
    return args


def args_txt(args: list[Arg]) -> str:
    """One argument (flag and its values) per line; values never contain spaces."""
    return "".join(" ".join(a) + "\n" for a in args)


def megatron_args_sh(args: list[Arg], title: str, *, ds_config: bool = True) -> str:
    """A bash array to source: ``source megatron_args.sh; python pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...``."""
    lines = "".join(f"    {' '.join(shlex.quote(v) for v in a)}\n" for a in args)
    where = f"; {DS_CONFIG_NAME} is relative to this folder" if ds_config else ""
    return (f"# shellcheck shell=bash\n# {title}\n# pretrain_gpt.py arguments plantune decided{where}."
            "\n# Use: source megatron_args.sh && python pretrain_gpt.py "
            "\"${MEGATRON_ARGS[@]}\" <data, tokenizer, checkpoint, lr args>\n"
            f"MEGATRON_ARGS=(\n{lines})\n")


def ds_config(setup: RunSetup, flavor: str) -> dict:
    """DeepSpeed's JSON. DeepSpeed asserts train_batch_size == micro * GAS * DP; the stage that counts is here."""
    c, t = setup.candidate, setup.training
    fp16: dict = {"enabled": t.precision == "fp16"}
    if t.precision == "fp16":  # dynamic loss scaling, as in tr11-176B-ml.slurm's fp16 config
        fp16 |= {"loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
                 "initial_scale_power": 12}
    extra: dict = {}
    if flavor == "microsoft" and t.precision == "bf16" and json_zero_stage(setup, flavor) <= 1:
        # accumulate gradients in fp32 over the GAS micro-batches: DeepSpeed's BF16_Optimizer path, as the fork's
        # examples_deepspeed/universal_checkpointing/megatron_gpt/run_bf16.sh does
        extra["data_types"] = {"grad_accum_dtype": "fp32"}
    return {
        "train_micro_batch_size_per_gpu": c.mbs,
        "train_batch_size": t.global_batch,
        "gradient_accumulation_steps": c.gas,
        "gradient_clipping": GRADIENT_CLIPPING,
        "zero_optimization": {"stage": json_zero_stage(setup, flavor)},
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": fp16,
        **extra,
        "steps_per_print": 2000,
        "wall_clock_breakdown": False,
    }


def ds_config_text(setup: RunSetup, flavor: str) -> str:
    return json.dumps(ds_config(setup, flavor), indent=2) + "\n"


__all__ = ["DS_CONFIG_NAME", "GRADIENT_CLIPPING", "args_txt", "ds_config", "ds_config_text", "json_zero_stage",
           "megatron_args", "megatron_args_sh"]
