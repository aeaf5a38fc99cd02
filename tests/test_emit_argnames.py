"""Every flag the Megatron-DeepSpeed emitter writes is spelled exactly as the fork's argparse spells it.

The lists are transcribed (names only) from:
- BS: bigscience-workshop/Megatron-DeepSpeed, megatron/arguments.py at commit
  007719ad5cb7d8a0e3fe979ee321c6c1c34fbd1f, re-checked at 8387ae17c4704f6579f88a84500b535d19d7fbbf (which adds
  ``--pad-vocab-size-to``, as tr11-176B-ml.slurm uses) (its PositionEmbeddingType: absolute | rotary | alibi;
  megatron/model/glu_activations.py GLU_ACTIVATIONS: geglu, liglu, reglu, swiglu);
- MS: deepspeedai/Megatron-DeepSpeed (formerly microsoft/Megatron-DeepSpeed), megatron/arguments.py
  at commit 207b2d5aad1eea98464c37e0b991be6f8937226f, re-checked at f4157bea69f3df8c6cb66f2ebcda66ba03d1288e;
- Megatron-LM: NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/training/arguments.py
  literals and the config dataclasses it builds flags from (TransformerConfig, ModelParallelConfig,
  TrainingConfig via argument_utils.ArgumentGroupFactory), as its examples/llama/train_llama3_8b_h100_fp8.sh
  spells them;
- torchtitan: pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce) torchtitan/config/job_config.py;
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
from conftest import HANG_GUARD_S

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
    "--finetune", "--fp16", "--bf16", "--pad-vocab-size-to", "--loss-scale", "--initial-loss-scale", "--min-loss-scale",
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

MEGATRON_LM = {
    # network (TransformerConfig fields and arguments.py literals)
    "--use-mcore-models", "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--group-query-attention", "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings",
    "--position-embedding-type", "--rotary-base", "--rotary-percent", "--attention-dropout", "--hidden-dropout",
    "--swiglu", "--normalization", "--init-method-std", "--make-vocab-size-divisible-by",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--attention-backend",
    # the model's own facts (planner.emit.megatron_lm.model_fact_args), as megatron-core 0.17.1 spells them:
    # TransformerConfig layernorm_epsilon (arg_names --norm-epsilon), add_qkv_bias, qk_layernorm; arguments.py
    # literals --window-size, --window-attn-skip-freq, --rotary-seq-len-interpolation-factor
    "--norm-epsilon", "--add-qkv-bias", "--qk-layernorm", "--window-size", "--window-attn-skip-freq",
    "--rotary-seq-len-interpolation-factor",
    # parallelism (ModelParallelConfig fields, arguments.py literals)
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank", "--sequence-parallel",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",   # TransformerConfig bools
    "--pipeline-model-parallel-layout", "--mtp-num-layers",   # ModelParallelConfig / TransformerConfig fields
    "--recompute-modules",   # TransformerConfig recompute_modules
    "--optimizer-cpu-offload", "--optimizer-offload-fraction", "--use-precision-aware-optimizer",   # arguments.py
    "--exp-avg-dtype", "--exp-avg-sq-dtype",   # arguments.py (precision-aware optimizer's Adam moments)
    "--overlap-cpu-optimizer-d2h-h2d", "--overlap-moe-expert-parallel-comm",   # arguments.py, TransformerConfig
    "--moe-shared-expert-overlap",   # TransformerConfig
    "--fine-grained-activation-offloading", "--offload-modules",   # TransformerConfig (fine_grained_activation_
    # offloading, offload_modules)
    "--use-distributed-optimizer", "--grad-reduce-in-bf16",
    "--overlap-grad-reduce", "--overlap-param-gather", "--no-overlap-p2p-communication",   # arguments.py literals
    "--tp-comm-overlap",                                                                     # ModelParallelConfig
    # Megatron-FSDP (arguments.py literals; --ckpt-format fsdp_dtensor is the format validate_args asks of it)
    "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--no-gradient-accumulation-fusion", "--ckpt-format",
    # training (TrainingConfig fields, arguments.py literals)
    "--micro-batch-size", "--global-batch-size", "--rampup-batch-size", "--train-samples", "--train-iters",
    "--optimizer", "--clip-grad", "--lr", "--min-lr", "--lr-decay-style", "--lr-warmup-samples",
    "--lr-warmup-fraction", "--lr-decay-samples", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps",
    "--bf16", "--fp16", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--exit-duration-in-mins",
    # data, checkpoints, logging
    "--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--save", "--load", "--tensorboard-dir",
    "--log-interval", "--save-interval", "--eval-interval", "--eval-iters",
}
MEGATRON_LM_CHOICES = {"--position-embedding-type": {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"},
                       "--normalization": {"LayerNorm", "RMSNorm"},
                       "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},   # AttnBackend enum
                       "--recompute-granularity": {"full", "selective"}, "--recompute-method": {"uniform", "block"},
                       "--optimizer": {"adam", "sgd"}, "--tokenizer-type": {"HuggingFaceTokenizer",
                                                                            "NullTokenizer", "GPT2BPETokenizer"}}
TORCHTITAN = {
    "job": {"dump_folder", "description"}, "metrics": {"log_freq", "enable_tensorboard", "save_tb_folder"},
    "model": {"name", "flavor", "hf_assets_path", "converters"}, "quantize": {"linear"}, "optimizer": {"name", "lr", "eps", "weight_decay"},
    "lr_scheduler": {"warmup_steps", "decay_type", "min_lr_factor"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "mixed_precision_param", "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                    "expert_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "enable_async_tensor_parallel"},
    "checkpoint": {"enable", "folder", "interval"}, "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components"}, "experimental": {"custom_import"},
}
TORCHTITAN_CHOICES = {("activation_checkpoint", "mode"): {"selective", "full", "memory_budget", "none"},
                      ("parallelism", "fsdp_reshard_after_forward"): {"default", "always", "never"},
                      ("lr_scheduler", "decay_type"): {"linear", "sqrt", "cosine"},
                      ("training", "mixed_precision_param"): {"bfloat16", "float32"}}

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
SRUN = {"--wait", "--kill-on-bad-exit", "--cpus-per-task"}
"""srun(1); the container's --container-image/-mounts/-workdir are pyxis's, only when CONTAINER_IMAGE is set"""

MD_CASES = [case for case in VALID_CASES if case.kind == "megatron-deepspeed"]


def _sbatch_site_args(text: str) -> list[list[str]]:
    """The SITE_ARGS array of launch.sbatch, as bash sees it (flags with their values)."""
    body = text[text.index("SITE_ARGS=("):]
    body = body[:body.index("\n)\n") + 3]
    out = subprocess.run(["bash", "-c", body + 'printf "%s\\n" "${SITE_ARGS[@]}"'], capture_output=True, text=True,
                         check=True, timeout=HANG_GUARD_S,
                         env={"DATA_PATH": "D", "TOKENIZER": "T", "CHECKPOINT_PATH": "C",
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


@pytest.mark.parametrize("case", [c for c in VALID_CASES if c.kind == "megatron-lm"] + [
    pytest.param(None, id="llama3-405b-uneven-pp")], ids=lambda c: getattr(c, "id", "case"))
def test_every_megatron_lm_flag_is_megatron_lms(case) -> None:
    from planner.emit.megatron_lm import megatron_lm_args
    from test_emit_cases import llama

    setup = case.setup if case else llama("llama3-405b", gpus=2048, tp=8, pp=16, dp=16, gas=64, recompute="full")
    files = render(setup, "megatron-lm")
    written = list(megatron_lm_args(setup)) + [tuple(a) for a in _sbatch_site_args(files["launch.sbatch"])]
    assert [a[0] for a in written if a[0] not in MEGATRON_LM] == []
    for flag, *values in written:
        if flag in MEGATRON_LM_CHOICES:
            assert values[0] in MEGATRON_LM_CHOICES[flag], (flag, values)


@pytest.mark.parametrize("case", [c for c in VALID_CASES if c.kind == "fsdp"], ids=lambda c: c.id)
def test_every_torchtitan_field_is_torchtitans(case) -> None:
    import tomllib

    d = tomllib.loads(render(case.setup, "fsdp", torchtitan_version="0.2.2")["torchtitan.toml"])
    assert {k: set(v) - TORCHTITAN.get(k, set()) for k, v in d.items() if set(v) - TORCHTITAN.get(k, set())} == {}
    for (section, key), allowed in TORCHTITAN_CHOICES.items():
        assert d[section][key] in allowed


# Megatron-LM's own parse_args/validate_args over every emitted set: tests/test_megatron_parser.py.
