"""Every flag the Megatron-DeepSpeed emitter writes is spelled exactly as the fork's argparse spells it.

The lists are transcribed (names only) from:
- BS: bigscience-workshop/Megatron-DeepSpeed, megatron/arguments.py at commit
  007719ad5cb7d8a0e3fe979ee321c6c1c34fbd1f (its PositionEmbeddingType: absolute | rotary | alibi;
  megatron/model/glu_activations.py GLU_ACTIVATIONS: geglu, liglu, reglu, swiglu);
- MS: deepspeedai/Megatron-DeepSpeed (formerly microsoft/Megatron-DeepSpeed), megatron/arguments.py
  at commit 207b2d5aad1eea98464c37e0b991be6f8937226f;
- both: DeepSpeed's deepspeed/__init__.py ``_add_core_arguments`` (``--deepspeed``, ``--deepspeed_config``),
  which both forks add through ``deepspeed.add_config_arguments(parser)``.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from planner.emit import render
from planner.emit.megatron_deepspeed import megatron_args
from test_emit_cases import VALID_CASES

DEEPSPEED_CORE = {"--deepspeed", "--deepspeed_config", "--deepscale", "--deepscale_config"}

BIGSCIENCE = DEEPSPEED_CORE | {
    # network size
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
    "--max-position-embeddings", "--make-vocab-size-divisible-by", "--layernorm-epsilon",
    "--apply-residual-connection-post-layernorm", "--embed-layernorm", "--openai-gelu", "--onnx-safe",
    "--bert-no-binary-head", "--position-embedding-type", "--glu-activation", "--log-level", "--log-level-replica",
    # logging
    "--log-params-norm", "--log-num-zeros-in-grad", "--tensorboard-log-interval", "--tensorboard-queue-size",
    "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard", "--no-log-learnig-rate-to-tensorboard",
    "--no-log-loss-scale-to-tensorboard", "--log-validation-ppl-to-tensorboard",
    # regularization
    "--attention-dropout", "--hidden-dropout", "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2",
    "--adam-eps", "--sgd-momentum",
    # training
    "--micro-batch-size", "--batch-size", "--global-batch-size", "--rampup-batch-size", "--checkpoint-activations",
    "--distribute-checkpointed-activations", "--checkpoint-num-layers", "--train-iters", "--train-samples",
    "--train-tokens", "--log-interval", "--exit-interval", "--exit-duration-in-mins", "--tensorboard-dir",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--optimizer",
    "--use-bnb-optimizer", "--dataloader-type", "--cpu-optimizer", "--cpu_torch_adam", "--codecarbon-dir",
    "--eval-only", "--skip-train-iteration-range",
    # initialization, learning rate
    "--seed", "--init-method-std", "--init-method-xavier-uniform", "--lr", "--lr-decay-style", "--lr-decay-iters",
    "--lr-decay-samples", "--lr-decay-tokens", "--lr-warmup-fraction", "--lr-warmup-iters", "--lr-warmup-samples",
    "--warmup", "--min-lr", "--override-lr-scheduler", "--use-checkpoint-lr-scheduler",
    # checkpointing, mixed precision
    "--save", "--save-interval", "--no-save-optim", "--no-save-rng", "--load", "--no-load-optim", "--no-load-rng",
    "--finetune", "--fp16", "--bf16", "--loss-scale", "--initial-loss-scale", "--min-loss-scale",
    "--loss-scale-window", "--hysteresis", "--fp32-residual-connection", "--no-query-key-layer-scaling",
    "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32", "--fp16-lm-cross-entropy",
    # distributed, validation
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--distributed-backend", "--DDP-impl",
    "--use-contiguous-buffers-in-ddp", "--no-scatter-gather-tensors-in-pipeline", "--local_rank", "--lazy-mpu-init",
    "--use-cpu-initialization", "--eval-iters", "--eval-interval",
    # data
    "--data-path", "--split", "--train-weighted-split-paths", "--valid-weighted-split-paths",
    "--test-weighted-split-paths", "--log-path", "--vocab-file", "--merge-file", "--vocab-extra-ids", "--seq-length",
    "--encoder-seq-length", "--decoder-seq-length", "--retriever-seq-length", "--sample-rate", "--mask-prob",
    "--short-seq-prob", "--mmap-warmup", "--num-workers", "--tokenizer-type", "--tokenizer-name-or-path",
    "--data-impl", "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss", "--loss-on-targets-only",
    "--reweight-loss-based-on-position-frequency",
    # ZeRO, memory, activation checkpointing
    "--zero-stage", "--zero-reduce-scatter", "--zero-contigious-gradients", "--zero-reduce-bucket-size",
    "--zero-allgather-bucket-size", "--remote-device", "--use-pin-memory", "--scattered-embeddings",
    "--split-transformers", "--memory-centric-tiled-linear", "--tile-factor", "--deepspeed-activation-checkpointing",
    "--partition-activations", "--contigious-checkpointing", "--checkpoint-in-cpu", "--synchronize-each-layer",
    "--profile-backward",
}

MICROSOFT = DEEPSPEED_CORE | {
    # network size
    "--num-layers", "--encoder-num-layers", "--decoder-num-layers", "--num-experts", "--mlp-type", "--topk",
    "--expert-interval", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-key-value-heads",
    "--kv-channels", "--max-position-embeddings", "--use-rotary-position-embeddings",
    "--rotary-position-embeddings-theta", "--rotary-percent", "--no-position-embedding",
    "--make-vocab-size-divisible-by", "--normalization", "--layernorm-epsilon", "--apply-layernorm-1p",
    "--disable-mem-efficient-ln", "--apply-residual-connection-post-layernorm", "--openai-gelu", "--squared-relu",
    "--swiglu", "--onnx-safe", "--bert-no-binary-head", "--num-experts-switch",
    "--untie-embeddings-and-output-weights", "--embedding-weights-in-fp32", "--kill-switch-file",
    # logging
    "--log-params-norm", "--log-num-zeros-in-grad", "--timing-log-level", "--timing-log-option",
    "--tensorboard-log-interval", "--tensorboard-queue-size", "--log-timers-to-tensorboard",
    "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
    "--wandb-project", "--wandb-exp-name", "--wandb-save-dir",
    # regularization
    "--attention-dropout", "--hidden-dropout", "--weight-decay", "--start-weight-decay", "--end-weight-decay",
    "--weight-decay-incr-style", "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--sgd-momentum",
    # training
    "--micro-batch-size", "--batch-size", "--global-batch-size", "--rampup-batch-size", "--recompute-activations",
    "--recompute-granularity", "--distribute-saved-activations", "--recompute-method", "--recompute-num-layers",
    "--enable-zbh1-pipeline", "--checkpoint-activations", "--distribute-checkpointed-activations",
    "--checkpoint-num-layers", "--train-iters", "--train-samples", "--train-tokens", "--random-ltd",
    "--log-interval", "--exit-interval", "--exit-duration-in-mins", "--exit-signal-handler", "--tensorboard-dir",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--use-flash-attn",
    "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-flash-attn-triton", "--disable-bias-linear", "--optimizer",
    "--dataloader-type", "--cpu-optimizer", "--no-pipeline-parallel", "--no-async-tensor-model-parallel-allreduce",
    "--no-persist-layer-norm", "--sequence-parallel", "--ds-sequence-parallel-size",
    "--no-gradient-accumulation-fusion",
    # initialization, learning rate
    "--seed", "--init-method-std", "--init-method-xavier-uniform", "--lr", "--lr-decay-style", "--lr-decay-iters",
    "--lr-decay-samples", "--lr-decay-tokens", "--lr-warmup-fraction", "--lr-warmup-iters", "--lr-warmup-samples",
    "--lr-warmup-tokens", "--warmup", "--min-lr",
    # checkpointing, mixed precision
    "--save", "--save-interval", "--no-save-optim", "--no-save-rng", "--load", "--load-tag", "--no-load-optim",
    "--no-load-rng", "--finetune", "--universal-checkpoint", "--fp16", "--bf16", "--loss-scale",
    "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis", "--fp32-residual-connection",
    "--no-query-key-layer-scaling", "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32",
    "--fp16-lm-cross-entropy",
    # distributed, validation
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--pipeline-model-parallel-split-rank",
    "--moe-expert-parallel-size", "--model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--overlap-p2p-communication", "--distributed-backend", "--distributed-timeout-minutes", "--DDP-impl",
    "--local-rank", "--local_rank", "--use-cpu-initialization", "--use-distributed-optimizer", "--eval-iters",
    "--eval-interval", "--skip-train",
    # data
    "--data-path", "--split", "--train-data-path", "--valid-data-path", "--test-data-path", "--data-cache-path",
    "--vocab-size", "--vocab-file", "--merge-file", "--vocab-extra-ids", "--seq-length", "--encoder-seq-length",
    "--decoder-seq-length", "--num-workers", "--tokenizer-type", "--tokenizer-model", "--data-impl",
    "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
    # ZeRO, memory, activation checkpointing
    "--zero-stage", "--zero-reduce-scatter", "--zero-contigious-gradients", "--zero-reduce-bucket-size",
    "--zero-allgather-bucket-size", "--remote-device", "--use-pin-memory", "--deepspeed-activation-checkpointing",
    "--partition-activations", "--contigious-checkpointing", "--checkpoint-in-cpu", "--synchronize-each-layer",
    "--profile-backward",
}

FORK_ARGS = {"bigscience": BIGSCIENCE, "microsoft": MICROSOFT}
# Choice values the emitter writes, from the same files.
FORK_CHOICES = {
    "bigscience": {"--position-embedding-type": {"absolute", "rotary", "alibi"},
                   "--glu-activation": {"geglu", "liglu", "reglu", "swiglu"},
                   "--tokenizer-type": {"BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                                        "PretrainedFromHF"},
                   "--optimizer": {"adam", "sgd"}},
    "microsoft": {"--normalization": {"layernorm", "rmsnorm"}, "--recompute-granularity": {"full", "selective"},
                  "--tokenizer-type": {"BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                                       "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "HFTokenizer",
                                       "NullTokenizer"},
                  "--optimizer": {"adam", "sgd"}},
}
# torch/distributed/run.py and srun(1) options the launcher uses.
TORCHRUN = {"--nproc_per_node", "--nnodes", "--rdzv_endpoint", "--rdzv_backend", "--max_restarts", "--tee",
            "--node_rank"}
SRUN = {"--wait", "--kill-on-bad-exit"}

MD_CASES = [case for case in VALID_CASES if case.kind == "megatron-deepspeed"]


def _sbatch_site_args(text: str) -> list[list[str]]:
    """The SITE_ARGS array of launch.sbatch, as bash sees it (flags with their values)."""
    body = text[text.index("SITE_ARGS=("):]
    body = body[:body.index("\n)\n") + 3]
    out = subprocess.run(["bash", "-c", body + 'printf "%s\\n" "${SITE_ARGS[@]}"'], capture_output=True, text=True,
                         check=True, timeout=30, env={"DATA_PATH": "D", "TOKENIZER": "T", "CHECKPOINT_PATH": "C",
                                                      "TRAIN_SAMPLES": "7", "PATH": "/usr/bin:/bin"}).stdout
    return _group(out.split("\n")[:-1])


def _group(tokens: list[str]) -> list[list[str]]:
    args: list[list[str]] = []
    for tok in tokens:
        if tok.startswith("--"):
            args.append([tok])
        else:
            args[-1].append(tok)
    return args


@pytest.mark.parametrize("case", MD_CASES, ids=lambda c: c.id)
def test_every_flag_is_the_forks(case) -> None:
    files = render(case.setup, case.kind, flavor=case.flavor)
    known, choices = FORK_ARGS[case.flavor], FORK_CHOICES[case.flavor]
    written = [a for a in megatron_args(case.setup, case.flavor)]
    written += [tuple(a) for a in _sbatch_site_args(files["launch.sbatch"])]
    assert [a[0] for a in written if a[0] not in known] == []
    for flag, *values in written:
        if flag in choices:
            assert values[0] in choices[flag], (flag, values)
    # args.txt carries exactly megatron_args(); its flags are a subset too
    assert {line.split()[0] for line in files["args.txt"].splitlines()} <= known


@pytest.mark.parametrize("case", MD_CASES, ids=lambda c: c.id)
def test_launcher_flags_are_torchrun_and_srun(case) -> None:
    text = render(case.setup, case.kind, flavor=case.flavor)["launch.sbatch"]
    launch = text[text.index("\nsrun "):]
    launch = launch[:launch.index(" torchrun ")]
    flags = set(re.findall(r"(--[A-Za-z_-]+)", launch))
    assert flags <= TORCHRUN | SRUN
    assert flags == TORCHRUN | SRUN
