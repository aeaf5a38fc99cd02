"""Megatron-LM: ``pretrain_gpt.py`` arguments (args.txt, megatron_args.sh) for NVIDIA/Megatron-LM (Megatron-Core).

Flag spellings are those of NVIDIA/Megatron-LM megatron/training/arguments.py (and the config dataclasses
it builds arguments from), as used by its examples/llama/train_llama3_8b_h100_fp8.sh and
examples/gpt3/train_gpt3_175b_distributed.sh; tests/test_emit_argnames.py pins every one. A layer count
that PP does not divide runs with the embedding and loss counted as layers (``--account-for-embedding/loss-in-
pipeline-split``) or with first and last stages of their own sizes (``--decoder-first/last-pipeline-num-layers``),
or with a layout of the model's chunks (``--pipeline-model-parallel-layout``, which sets VPP; DeepSeek-V3's MTP layer
``--mtp-num-layers``), as `planner.pipeline_split.megatron_lm_split` decides; else VPP is
``--num-virtual-stages-per-pipeline-rank``. Context parallel,
experts, MLA and FP8 flags come from `planner.emit.parallel_extras`.
The same launch.sbatch as Megatron-DeepSpeed's starts it (torch.distributed.run, one task per node).
"""

from __future__ import annotations

from planner import cuda_graphs, offload, recompute as recompute_modes
from planner.emit import facts, parallel_extras
from planner.emit.setup import MEGATRON_OPTIMIZERS, RunSetup, train_samples
from planner.framework import overlaps
from planner.model import ModelSpec
from planner.pipeline_split import megatron_lm_split

GRADIENT_CLIPPING = 1.0
MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""plantune's ZeRO stage -> Megatron-FSDP's --data-parallel-sharding-strategy (megatron/training/arguments.py)"""
Arg = tuple[str, ...]


def model_fact_args(m: ModelSpec) -> list[Arg]:
    """The model's own facts Megatron-LM takes as arguments (TransformerConfig fields: --norm-epsilon, --add-qkv-bias,
    --qk-layernorm, which under MLA is the latents' norms; megatron/training/arguments.py: --window-size,
    --window-attn-skip-freq). Facts it cannot take are refused before this runs (planner.model_facts.unexpressed)."""
    out: list[Arg] = []
    eps = facts.norm_eps(m)
    if eps is not None:
        out.append(("--norm-epsilon", f"{eps:g}"))
    if m.qkv_bias and not m.bias:
        out.append(("--add-qkv-bias",))
    if m.qk_norm == "head" or m.kv_lora_rank:
        # with --multi-latent-attention the same flag puts the RMSNorms on the compressed q and kv latents
        # (Megatron-Core gpt_layer_specs.py at core_v0.17.1: linear_q_up_proj / linear_kv_up_proj become
        # column_parallel_layer_norm_linear when qk_layernorm; DeepSeek's q_a_layernorm / kv_a_layernorm)
        out.append(("--qk-layernorm",))
    if m.sliding_window:
        # HF's window holds the token and the W - 1 before it (transformers masking_utils sliding_window_overlay:
        # kv_idx > q_idx - sliding_window); Megatron's (left, right) attends to [i - left, i + right]
        out.append(("--window-size", f"{m.sliding_window - 1},0"))
        if m.window_full_every:
            out.append(("--window-attn-skip-freq", str(m.window_full_every)))
    return out


def megatron_lm_args(setup: RunSetup) -> list[Arg]:
    """Every argument plantune decides, in the order of Megatron-LM's example launchers."""
    m, c, t = setup.model, setup.candidate, setup.training
    args: list[Arg] = [("--use-mcore-models",), ("--num-layers", str(m.layers)), ("--hidden-size", str(m.hidden)),
                       ("--ffn-hidden-size", str(m.ffn_hidden)), ("--num-attention-heads", str(m.heads))]
    if m.kv_heads != m.heads:
        args += [("--group-query-attention",), ("--num-query-groups", str(m.kv_heads))]
    args += [("--seq-length", str(t.seq_len)), ("--max-position-embeddings", str(m.positions))]
    if m.position == "rope":
        args += [("--position-embedding-type", "rope"), ("--rotary-base", str(int(facts.rope_theta(m)))),
                 ("--rotary-percent", str(float(m.rotary_percent)))]
    else:
        args.append(("--position-embedding-type", "learned_absolute"))
    args += model_fact_args(m)
    drop = facts.dropout(m)
    if drop is not None:
        args += [("--attention-dropout", f"{drop:g}"), ("--hidden-dropout", f"{drop:g}")]
    if m.glu:
        args.append(("--swiglu",))
    args += [("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
             ("--init-method-std", f"{facts.init_std(m):g}"),
             ("--make-vocab-size-divisible-by", str(facts.vocab_divisor(m, c.tp)))]
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights",))
    if not m.bias:
        args.append(("--disable-bias-linear",))
    # Megatron-Core's AttnBackend (transformer/enums.py): flash (flash-attn / FA3 through TE), fused (TE's cuDNN
    # FusedAttention), unfused (its own core attention with the fused softmax); "" (not pinned): flash when fused
    backend = {"cudnn": "fused", "fused-softmax": "unfused", "unfused": "unfused"}.get(t.attention_kernel)
    args.append(("--attention-backend", backend or ("flash" if t.flash_attention else "unfused")))
    args += [("--tensor-model-parallel-size", str(c.tp)), ("--pipeline-model-parallel-size", str(c.pp))]
    split = megatron_lm_split(m.layers, c.pp, c.vpp, m.mtp_layers)   # the rulebook's split: exactly its flags
    if m.mtp_layers:   # DeepSeek-V3's multi-token prediction modules (Megatron-Core multi_token_prediction.py)
        args.append(("--mtp-num-layers", str(m.mtp_layers)))
    if split is not None and split.layout:   # sets VPP itself: --num-virtual-stages-per-pipeline-rank excluded
        args.append(("--pipeline-model-parallel-layout", split.layout))
    if split is not None and split.first_last:
        args += [("--decoder-first-pipeline-num-layers", str(split.first)),
                 ("--decoder-last-pipeline-num-layers", str(split.last))]
    if split is not None and split.account_embedding:
        args.append(("--account-for-embedding-in-pipeline-split",))
    if split is not None and split.account_loss:
        args.append(("--account-for-loss-in-pipeline-split",))
    if c.vpp > 1 and not (split is not None and split.layout):
        args.append(("--num-virtual-stages-per-pipeline-rank", str(c.vpp)))
    if c.sp:
        args.append(("--sequence-parallel",))
    args += [("--micro-batch-size", str(c.mbs)), ("--global-batch-size", str(t.global_batch))]
    if t.rampup:
        args.append(("--rampup-batch-size", *map(str, t.rampup.as_list())))
    samples = train_samples(t)
    if samples is not None:
        args.append(("--train-samples", str(samples)))
    args += [("--optimizer", MEGATRON_OPTIMIZERS[t.optimizer]), ("--clip-grad", str(GRADIENT_CLIPPING))]
    args += facts.lr_args(m, t)
    if t.precision in ("bf16", "fp16", "fp8"):
        args.append((f"--{'bf16' if t.precision == 'fp8' else t.precision}",))   # FP8 GEMMs inside bf16 training
    args += recompute_modes.megatron_lm_args(c.recompute)   # full, selective, block-N, uniform-N
    if c.zero == 1:
        args.append(("--use-distributed-optimizer",))
    elif c.zero >= 2:   # Megatron-FSDP: the flags Megatron-Core's Megatron-FSDP guide lists, and the only checkpoint
        # format validate_args accepts with it (--ckpt-format fsdp_dtensor)
        args += [("--use-megatron-fsdp",), ("--data-parallel-sharding-strategy", MEGATRON_FSDP_STRATEGY[c.zero]),
                 ("--use-distributed-optimizer",), ("--no-gradient-accumulation-fusion",),
                 ("--ckpt-format", "fsdp_dtensor")]
    if t.grad_reduce_dtype == "bf16":
        args.append(("--grad-reduce-in-bf16",))
    args += offload.megatron_lm_args(t)   # CPU optimizer offload
    if t.optimizer_state_dtype != "fp32":   # Adam's moments in 16 bits: TE's FusedAdam under the precision-aware
        # optimizer (arguments.py --exp-avg-dtype / --exp-avg-sq-dtype, "when enabling precision-aware-optimizer")
        if ("--use-precision-aware-optimizer",) not in args:
            args.append(("--use-precision-aware-optimizer",))
        args += [("--exp-avg-dtype", t.optimizer_state_dtype), ("--exp-avg-sq-dtype", t.optimizer_state_dtype)]
    args += offload.activation_offload_args(t)   # fine-grained activation offload
    args += cuda_graphs.megatron_lm_args(t, c)   # --cuda-graph-impl / --cuda-graph-scope
    args += overlap_args(setup)
    args += [tuple(f) for f in parallel_extras.megatron_lm_flags(setup)]   # CP / EP / MoE / MLA / FP8 / RoPE scaling
    return args


def overlap_args(setup: RunSetup) -> list[Arg]:
    """The overlaps the planner's time assumed (planner.framework.overlaps, planner.cost's terms), as Megatron-LM's
    flags: --overlap-param-gather only with the distributed optimizer, --tp-comm-overlap only with SP, and p2p
    overlap is Megatron's default with VPP (turned off by --no-overlap-p2p-communication)."""
    c, on = setup.candidate, overlaps(setup.training)
    args: list[Arg] = []
    if "grad-reduce" in on and c.dp * c.cp > 1:
        args.append(("--overlap-grad-reduce",))
        if "param-gather" in on and c.zero == 1:
            args.append(("--overlap-param-gather",))
    if "tp-comm" in on and c.sp and c.tp > 1:
        args.append(("--tp-comm-overlap",))
    if "p2p" not in on and c.vpp > 1:
        args.append(("--no-overlap-p2p-communication",))
    if "ep-a2a" in on and c.ep > 1 and setup.model.num_experts:
        args.append(("--overlap-moe-expert-parallel-comm",))
    if "shared-expert" in on and setup.model.num_experts and setup.model.shared_experts:
        args.append(("--moe-shared-expert-overlap",))
    return args


__all__ = ["MEGATRON_FSDP_STRATEGY", "megatron_lm_args", "overlap_args"]
