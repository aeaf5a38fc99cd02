"""Context parallelism (CP): which CP sizes to try, its rules, activation memory, ring-attention time.

CP splits every sequence into 2·CP chunks; rank i keeps chunks i and 2·CP-1-i so that causal
attention's work is balanced (Megatron-Core context_parallel docs; TransformerEngine
``attention.py`` ``get_cp_comm_type`` "p2p"), and passes K and V around a ring of the CP ranks, one
hop per step, overlapped with the attention of the block it already has. Everything but attention
is token-local, so each rank runs the layers on s/CP tokens. Megatron-Core's rank order is
tp-cp-ep-dp-pp (megatron/core/parallel_state.py ``order``): a CP group strides by TP, so it stays on
NVLink while TP·CP fits in a node, and gradients are reduced over the DP×CP group.

Functions are pure and small; `planner.space`, `constraints`, `memory` and `cost` call them through
one-line hooks.
"""

from __future__ import annotations

from functools import lru_cache
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from planner.ops import ATTENTION, bytes_op
from planner.terms import COMMUNICATION, Term
from planner.topology import collective_time_s
from planner.recompute import recomputed_of
from planner.step_context import memoized_term

if TYPE_CHECKING:
    from planner.hardware import ClusterSpec
    from planner.model import ModelSpec
    from planner.ops import LayerOps
    from planner.step_context import StepContext
    from planner.space import Candidate, TrainingSpec

# Smallest per-rank chunk the default search tries: Llama 3 ran CP=16 on 128K sequences, 8K tokens a
# rank (Dubey et al. 2024 arXiv 2407.21783 Table 4); below that TP/PP already hold the activations of
# the models in the catalog and CP only adds K/V traffic. `--cp` lists other sizes explicitly.
MIN_CHUNK_TOKENS = 8192
MAX_CP = 64
FRAMEWORKS_WITH_CP = {"megatron-lm": "--context-parallel-size", "fsdp": "torchtitan context_parallel_degree"}


def cp_choices(seq_len: int, ranks_left: int, options: tuple[int, ...] | None) -> list[int]:
    """CP sizes to enumerate: the user's list, or powers of two dividing the ranks left after TP·PP
    whose chunk stays >= MIN_CHUNK_TOKENS."""
    if options:
        return [c for c in options if ranks_left % c == 0]
    out, c = [1], 2
    while c <= min(MAX_CP, ranks_left) and seq_len // c >= MIN_CHUNK_TOKENS:
        if ranks_left % c == 0:
            out.append(c)
        c *= 2
    return out


def violations(model: "ModelSpec", c: "Candidate", cluster: "ClusterSpec",
               training: "TrainingSpec", framework: str | None = None) -> list[tuple[str, str]]:
    """(reason value, detail) for every CP rule the candidate breaks on ``framework`` (default: the training's)."""
    if c.cp <= 1:
        return []
    fw = framework or training.framework
    out = []
    if training.seq_len % (2 * c.cp):
        out.append(("cp_sequence_divisibility",
                    f"sequence {training.seq_len} % (2*CP) = {training.seq_len % (2 * c.cp)}: load-balanced causal CP "
                    f"splits each sequence into 2*CP = {2 * c.cp} chunks (Megatron arguments.py: 'seq-length should "
                    "be a multiple of 2 * context-parallel-size')"))
    if fw not in FRAMEWORKS_WITH_CP:
        out.append(("framework_limit", f"context parallelism is not in {fw} (the BigScience fork has "
                                       "none); use --framework megatron-lm or fsdp (torchtitan)"))
    if not training.flash_attention:
        out.append(("framework_limit", "context parallelism runs ring attention on fused (flash) attention kernels; "
                                       "plan with --flash-attention"))
    return out


def split_activations(activations: float, logits: float, model: "ModelSpec", c: "Candidate",
                      training: "TrainingSpec") -> tuple[float, float]:
    """Every activation and the logits are per token, so each CP rank keeps 1/CP of them; ring
    attention adds two K/V receive buffers (16-bit) of one chunk, double-buffered (TransformerEngine
    p2p CP keeps the next step's K/V in flight)."""
    if c.cp <= 1:
        return activations, logits
    chunk = training.seq_len // c.cp * c.mbs
    kv_buffers = 2 * 2 * chunk * model.kv_dim / max(1, c.tp) * 2
    return activations / c.cp + kv_buffers, logits / c.cp


# HBM bytes per element, forward + backward, of each ring step's bookkeeping outside the attention kernel, counted
# from torch.distributed.tensor.experimental._attention (_templated_ring_attention and its backward, what torchtitan's
# context_parallel runs; convert_to_f32 default True). Per element of the rank's attention output (q-sized): forward
# out.to(float32) r2 w4, the merge out - sigmoid(lse_i - lse)·(out - out_i) r4 r4 w4 + r4 w4 + r4 r4 w4, the
# load-balanced half's _partial_update (torch.cat of the fp32 output, r4 w4 on half the steps): 6 + 32 + 4 = 42;
# backward grad_query += (fp32 r4 r2 w4) 10, its _partial_update 4, the half-sequence chunks of q, out and dout made
# contiguous for the kernel (r2 w2 on half the steps) 6: 62 in all. Per element of K and of V (as wide as the tensors
# the kernel takes): forward torch.cat for the send r2 w2 4; backward the same 4, grad accumulate in fp32 r4 r2 w4 10,
# its _partial_update 4, torch.cat of the fp32 gradient for the send r4 w4 8: 30 each. Transformer Engine's p2p
# CP (AttnFuncWithCPAndKVP2P) does the same corrections in fp32 with torch ops: ASSUMED the same count.
RING_STEP_Q_BYTES = 62
RING_STEP_KV_BYTES = 30
# The same steps traced by torch.compile (torchtitan compiles each block fullgraph=True, the ring inside it): Inductor
# fuses each step's chain into one kernel. Per q element: forward merge r4 (fp32 out) r2 (block out) w4 = 10 (the
# _partial_update cat writes the kept half r4 w4 instead, no more); backward grad_query += r4 r2 w4 = 10, plus the 6 of
# the chunks made contiguous inside the flash backward op (C++, not traced): 26. Per K and V element: the send's
# torch.cat of K and V is dead after step 0 (the all-gather rotater ignores later buffers, so the graph drops it),
# the backward's fp32 gradient accumulate fused into its send buffer r4 r2 w4 = 10.
RING_STEP_Q_BYTES_COMPILED = 26
RING_STEP_KV_BYTES_COMPILED = 10


def ring_step_bytes(model: "ModelSpec", c: "Candidate", framework: str, compiled: bool = False) -> float:
    """Forward-equivalent HBM bytes of one layer's ring bookkeeping on one CP rank (the op list charges the backward
    at 2x the forward, so the forward + backward count above is put in as a third): CP - 1 merge steps over the
    rank's tokens. torchtitan (2024) expands K and V to every query head before the kernel (repeat_kv), so its K/V
    are as wide as Q; Megatron's kernel takes the KV heads. ``compiled``: torchtitan under torch.compile (the counts
    above for the traced ring)."""
    if c.cp <= 1:
        return 0.0
    tokens = model.seq_len // c.cp * c.mbs
    q = model.q_dim / max(1, c.tp)
    kv = q if framework == "fsdp" else model.kv_dim / max(1, c.tp)
    q_bytes, kv_bytes = ((RING_STEP_Q_BYTES_COMPILED, RING_STEP_KV_BYTES_COMPILED) if compiled else
                         (RING_STEP_Q_BYTES, RING_STEP_KV_BYTES))
    return (c.cp - 1) * tokens * (q_bytes * q + 2 * kv_bytes * kv) / 3


def ring_attention(lo: "LayerOps", c: "Candidate", model: "ModelSpec | None" = None,
                   cluster: "ClusterSpec | None" = None, framework: str = "", compiled: bool = False) -> "LayerOps":
    """The layer's op list as one CP rank runs it: built on the rank's s/CP tokens (`rank_model`), its attention core
    is CP blocks of (s/CP x s/CP), i.e. CP times the core of an s/CP-token sequence (ring attention: each rank
    attends its chunk to every chunk that passes it); with ``model`` (the full-sequence model) and ``cluster``, one
    more memory-bound op: each step's merge of the partial outputs and gradients (`ring_step_bytes`)."""
    if c.cp <= 1:
        return lo
    ops = tuple(op.scaled(c.cp) if op.cls == ATTENTION else op for op in lo.ops)
    if model is not None and cluster is not None:
        ops += (bytes_op("cp_ring_merge", ring_step_bytes(model, c, framework, compiled), cluster),)
    return replace(lo, ops=ops)


@lru_cache(maxsize=64)   # pure in a frozen ModelSpec; one object per CP size keeps the model's lru_caches (moe) hitting
def rank_model(model: "ModelSpec", cp: int) -> "ModelSpec":
    """The model as one CP rank runs its token-local work: s/CP tokens."""
    return model.with_overrides(seq_len=max(1, model.seq_len // cp))


def ring_exchange_exposed_s(model: "ModelSpec", c: "Candidate", training: "TrainingSpec", link: object,
                            send_s: Callable[..., float], core_s: float, bytes_per_value: float,
                            recomputed_layers: float | None = None) -> float:
    """Exposed seconds of ring attention's K/V exchange in one layer's forward + backward.

    CP-1 steps forward, each sending one chunk's K and V (2·s/CP·b·kv_dim/TP values) to the next rank
    while the block already received is computed; the backward sends K, V and their gradients
    (twice the bytes) over twice the compute (Megatron-Core / TransformerEngine overlap the p2p with
    the attention kernels). Only the part of each step's send longer than its block is exposed.
    ``recomputed_layers``: `planner.recompute.recomputed_of(...).layers` when the caller has it."""
    if c.cp <= 1:
        return 0.0
    if training.framework == "fsdp":
        return allgather_exchange_exposed_s(model, c, link, send_s, core_s, bytes_per_value, recomputed_layers,
                                            training.seq_len, compiled=training.torch_compile)
    steps = c.cp - 1
    values = 2 * training.seq_len // c.cp * c.mbs * model.kv_dim / max(1, c.tp)
    send = send_s(link, kind="send", message_bytes=values * bytes_per_value, group=2)
    block = core_s / c.cp                       # one (s/CP x s/CP) block of the forward core
    forward = steps * max(0.0, send - block)
    backward = steps * max(0.0, 2 * send - 2 * block)
    if recomputed_layers is None:
        recomputed_layers = recomputed_of(model, c, training.framework).layers
    recompute = forward * recomputed_layers   # full: all; block-N: its share
    return forward + backward + recompute


def allgather_exchange_exposed_s(model: "ModelSpec", c: "Candidate", link: object, send_s: Callable[..., float],
                                 core_s: float, bytes_per_value: float, recomputed_layers: float | None,
                                 seq_len: int, compiled: bool = False) -> float:
    """Exposed seconds of torchtitan's ring exchange in one layer's forward + backward (torch
    distributed/tensor/experimental/_attention.py as torchtitan 2024-12 ran it: context_parallel_rotate_method
    "allgather" by default, `_AllGatherRotater`).

    Forward: one all-gather of every rank's K and V (as wide as Q: torchtitan repeat_kv's them before SDPA),
    issued before step 0 and waited whole at step 1, so only step 0's block hides it. Backward: the same all-gather
    again (a new rotater) under step 0's backward block, and the K/V gradients passed one hop a step in fp32
    (`_AllToAllRotater`, convert_to_f32), each hidden under the next step's block, the last one waited after the
    loop with nothing left to hide it. A full recompute runs the forward's all-gather once more.

    ``compiled`` (torch.compile, torchtitan's per-block ``fullgraph=True``): the ring is traced into the block's graph,
    where every collective is waited where it is issued, so nothing hides: the all-gathers whole and all CP gradient
    sends (see the comment below)."""
    chunk_values = 2 * seq_len // c.cp * c.mbs * model.q_dim / max(1, c.tp)
    gather = send_s(link, kind="all_gather", message_bytes=c.cp * chunk_values * bytes_per_value, group=c.cp)
    grad_send = send_s(link, kind="send", message_bytes=chunk_values * GRAD_BYTES, group=2)
    if compiled:
        # traced, torch's functional collectives return wait_tensor(out) at once (_functional_collectives.py
        # _maybe_wrap_tensor: "if _are_we_tracing(): return wait_tensor(self)"), and Inductor moves no wait without
        # reorder_for_compute_comm_overlap (False by default; torchtitan 9dec370 sets only _micro_pipeline_tp)
        forward, backward = gather, gather + c.cp * grad_send
    else:
        block = core_s / c.cp                   # one step's block of the forward core (s/CP x s/CP, causal half x 2)
        forward = max(0.0, gather - block)
        backward = max(0.0, gather - 2 * block) + (c.cp - 1) * max(0.0, grad_send - 2 * block) + grad_send
    if recomputed_layers is None:
        recomputed_layers = recomputed_of(model, c, "fsdp").layers
    return forward + backward + forward * recomputed_layers


GRAD_BYTES = 4
"""bytes of a K/V gradient value torch's ring passes (convert_to_f32: fp32 accumulation and send)"""


@memoized_term(lambda ctx: (ctx.cand.cp, ctx.cand.tp, ctx.cand.mbs, ctx.stage_layers, ctx.core_s, ctx.rc.layers))
def ring_exchange_s(ctx: "StepContext") -> float:
    """The term: the busiest stage's exposed K/V exchange for one micro-batch (the CP group strides by TP)."""
    c = ctx.cand
    if c.cp <= 1:
        return 0.0
    link = ctx.topology.dp_link(c.tp, c.cp)
    return ctx.stage_layers * ring_exchange_exposed_s(ctx.model, c, ctx.training, link, collective_time_s,
                                                      ctx.core_s, ctx.half, ctx.rc.layers)


RING_EXCHANGE = Term(name="cp_ring_exchange", kind=COMMUNICATION, group="cp_comm_s", per_microbatch=True,
                     seconds=ring_exchange_s,
                     hides_under="the attention block already received (inside the term; nothing under torchtitan's "
                                 "torch.compile, which waits for each collective where issued)",
                     flag="TransformerEngine p2p context parallelism (--cp-comm-type p2p, default)",
                     source="Megatron-Core context_parallel docs; TransformerEngine attention.py p2p ring",
                     constants=("LINK_EFFICIENCY",))


__all__ = ["FRAMEWORKS_WITH_CP", "GRAD_BYTES", "RING_EXCHANGE", "RING_STEP_KV_BYTES", "RING_STEP_KV_BYTES_COMPILED",
           "RING_STEP_Q_BYTES", "RING_STEP_Q_BYTES_COMPILED", "MIN_CHUNK_TOKENS",
           "allgather_exchange_exposed_s", "cp_choices", "rank_model", "ring_attention", "ring_exchange_exposed_s", "ring_step_bytes",
           "split_activations", "violations"]
