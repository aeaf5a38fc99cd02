"""The probe's GPT-style decoder, built one pipeline stage at a time (imports torch).

    >>> from probes.gpt import GPTStage
    >>> stage = GPTStage(model, layer_ids=range(4), first=True, last=True, seed=1234)

Shape from a `planner.model.ModelSpec`: separate Q/K/V/O projections (K and V with ``kv_heads``
heads, GQA), a GELU or SwiGLU MLP, LayerNorm or RMSNorm, learned or rotary positions (ALiBi is
not applied: SDPA's causal mask only; planner.flops counts no FLOPs for it either), optional
biases, an embedding norm, tied or untied LM head.

Stages are built without storage (on the meta device) and `init_parameters` fills each
parameter afterwards, once its storage exists: every parameter is drawn from its own generator,
seeded by the seed and the parameter's name (``layers.5.attn.wq.weight``, the same in every
layout because layers are keyed by their global index), and a sharded (DTensor) parameter keeps
only its own slice. So a stage that holds layers 4..7, or a TP/FSDP shard of them, gets exactly
the weights the single-process model has there -- that is what makes "each parallel layout gives
the single-process loss" a test of the parallelism -- and no rank ever holds more than its shard
plus one full parameter (the largest: the embedding) while initialising.

Context parallel (`ContextParallel`): each rank holds two of 2·CP sequence chunks (chunk r and
2·CP-1-r, the load-balanced causal split of Megatron-Core and torchtitan), its queries attend to
K/V all-gathered over the CP group with a mask from the global positions (the all-gather form of
CP that Llama 3 used, arXiv 2407.21783 Sec. 3.3.2; torch's ``context_parallel`` has no CPU SDPA
kernel in torch 2.13: "aten._scaled_dot_product_flash_attention_for_cpu does not have a sharding
strategy"). Mixture of experts (`MoE`): a top-k softmax router and SwiGLU/GELU experts of the dense
MLP's shape, dropless; with expert parallelism (`ExpertParallel`) each rank holds num_experts/EP
experts and tokens travel to them and back by two all-to-alls per layer.

Attention reshapes with ``-1`` heads, so the same code runs with the local head count under
tensor parallelism (``probes.parallel`` shards wq/wk/wv column-wise and wo row-wise).

Recompute disables torch's checkpoint "early stop" (which skips the last matmul of a recomputed
region when its output is not needed): the probe re-runs the whole forward as Megatron does,
so the FLOPs it executes are exactly `planner.flops.hardware_flops_per_iteration`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts, noop_context_fn,
                                    set_checkpoint_early_stop)

import functools
import zlib
from dataclasses import dataclass

import torch.distributed as dist

from planner import recompute as recompute_modes
from planner.model import ModelSpec

INIT_STD = 0.02
"""GPT-2's initialisation: N(0, 0.02) for every linear and embedding weight, biases zero"""
WRAPPER_PREFIXES = ("module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
"""prefixes DDP / FSDP1 / checkpoint_wrapper / torch.compile put before a parameter's name"""


def canonical_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes: the same in every layout."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _full_value(name: str, shape: torch.Size, owner: nn.Module, leaf: str, seed: int,
                device: torch.device) -> torch.Tensor:
    """The unsharded fp32 initial value of parameter ``name``: N(0, 0.02) for linear and embedding
    weights, ones for norm weights, zeros for biases; drawn from a generator of its own."""
    if leaf == "weight" and isinstance(owner, (nn.Linear, nn.Embedding)):
        g = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
        return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, INIT_STD, generator=g)
    if leaf == "weight":
        return torch.ones(shape, dtype=torch.float32, device=device)
    return torch.zeros(shape, dtype=torch.float32, device=device)


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int) -> None:
    """Fill every parameter of ``module`` (after ``to_empty``) with its layout-independent value.

    A DTensor parameter (TP, FSDP2, or both) receives only its local slice of the full value
    (``distribute_tensor`` with ``src_data_rank=None``: each rank slices, nothing is sent).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    owners = dict(module.named_modules(remove_duplicate=False))
    for name, p in module.named_parameters():
        mod_name, _, leaf = name.rpartition(".")
        key = canonical_name(name)
        if isinstance(p, DTensor):
            local = p.to_local()
            full = _full_value(key, p.shape, owners[mod_name], leaf, seed, local.device)
            local.copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local())
        else:
            p.copy_(_full_value(key, p.shape, owners[mod_name], leaf, seed, p.device))


@dataclass(frozen=True)
class ContextParallel:
    """This rank's share of the sequence under context parallelism (CP)."""

    group: object
    """the CP process group"""
    size: int
    rank: int
    seq_len: int

    def chunks(self, r: int) -> tuple[int, int]:
        """The two of 2·CP chunks rank ``r`` holds: r and 2·CP-1-r (causal load balance)."""
        return r, 2 * self.size - 1 - r

    def positions(self, r: int | None = None, device: torch.device | None = None) -> torch.Tensor:
        c = self.seq_len // (2 * self.size)
        a, b = self.chunks(self.rank if r is None else r)
        # made where they are used: a host-to-device copy per layer would synchronise the GPU
        return torch.cat([torch.arange(a * c, (a + 1) * c, device=device), torch.arange(b * c, (b + 1) * c, device=device)])

    def all_positions(self, device: torch.device | None = None) -> torch.Tensor:
        """Global positions of the K/V rows after the all-gather (rank order)."""
        return torch.cat([self.positions(r, device) for r in range(self.size)])


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's experts under expert parallelism (EP): experts [rank*E/EP, (rank+1)*E/EP)."""

    group: object
    size: int
    rank: int


class RMSNorm(nn.RMSNorm):
    """RMSNorm in the input's dtype: under autocast the residual stream is bf16, and torch's fused kernel
    needs weight and input of one dtype (an fp32 weight makes it fall back to several fp32 kernels that
    keep fp32 intermediates). Megatron's fused norms likewise take bf16 input with the fp32 weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype) if self.weight is not None else None
        return F.rms_norm(x, self.normalized_shape, w, self.eps)


def _norm(m: ModelSpec) -> nn.Module:
    return nn.LayerNorm(m.hidden) if m.norm == "layernorm" else RMSNorm(m.hidden)


def _rope_tables(s: int, d: int, positions: torch.Tensor | None, device: torch.device,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of RoPE's angles, (1, s, 1, d), base 10000 (Su et al. 2021), for `_rope`: computed in fp32,
    kept in ``dtype``; the sin's first half negated, so that rotate_half(x)·sin = roll(x, d/2)·signed sin."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    pos = torch.arange(s, device=device) if positions is None else positions
    angles = torch.outer(pos.to(torch.float32), inv)
    cos, sin = angles.cos().repeat(1, 2), torch.cat((-angles.sin(), angles.sin()), dim=-1)
    return cos[None, :, None, :].to(dtype), sin[None, :, None, :].to(dtype)


def _rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary position embedding on (batch, seq, heads, head_dim), rotate-half form (GPT-NeoX, Megatron's
    default), in the input's dtype: x·cos + rotate_half(x)·sin, ``tables`` from `_rope_tables` (three kernels)."""
    cos, signed_sin = tables
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V, causal (or ``mask``), through SDPA (flash / memory-efficient where available)."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence (dim 2) over the CP group; backward reduce-scatters the gradient
    (gloo, which has no reduce-scatter: all-to-all and a sum). Gradient chunks are made contiguous
    before they are sent: the collectives read raw memory."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, group: object, size: int) -> torch.Tensor:
        ctx.group, ctx.size = group, size
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        chunks = [c.contiguous() for c in grad.chunk(ctx.size, dim=2)]
        out = torch.empty_like(chunks[0])
        if dist.get_backend(ctx.group) == "nccl":
            dist.reduce_scatter(out, chunks, group=ctx.group)
        else:
            received = [torch.empty_like(c) for c in chunks]
            dist.all_to_all(received, chunks, group=ctx.group)
            out = torch.stack(received).sum(0)
        return out, None, None


def _gather_seq(t: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """(b, heads, s_local, d) from every CP rank, concatenated on the sequence (rank order)."""
    return _GatherSeq.apply(t, cp.group, cp.size)


class Attention(nn.Module):
    def __init__(self, m: ModelSpec, *, recompute_core: bool) -> None:
        super().__init__()
        self.head_dim = m.head_dim
        self.rope = m.position == "rope"
        self.recompute_core = recompute_core
        self.cp: ContextParallel | None = None
        self._rope_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        """`_rope_tables` by (local sequence length, device, dtype)"""
        self.wq = nn.Linear(m.hidden, m.hidden, bias=m.bias)
        self.wk = nn.Linear(m.hidden, m.kv_dim, bias=m.bias)
        self.wv = nn.Linear(m.hidden, m.kv_dim, bias=m.bias)
        self.wo = nn.Linear(m.hidden, m.hidden, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)      # -1: local heads under TP
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        cp = self.cp
        positions = cp.positions(device=x.device) if cp is not None else None
        if self.rope:
            key = (s, x.device, q.dtype)   # this rank's positions never change: the tables are made once
            if key not in self._rope_cache:
                self._rope_cache[key] = _rope_tables(s, self.head_dim, positions, x.device, q.dtype)
            q, k = _rope(q, self._rope_cache[key]), _rope(k, self._rope_cache[key])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = None
        if cp is not None:            # K/V exchange: every rank's chunks, then the causal mask by global position
            k, v = _gather_seq(k, cp), _gather_seq(v, cp)
            mask = positions[:, None] >= cp.all_positions(x.device)[None, :]
        if self.recompute_core:       # selective recompute: keep only Q, K, V (Korthikanti et al. 2022)
            with set_checkpoint_early_stop(False):
                out = checkpoint(_attention_core, q, k, v, mask, use_reentrant=False)
        else:
            out = _attention_core(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class _SwiGLU(torch.autograd.Function):
    """silu(gate)·up keeping only its inputs for the backward, as Megatron-LM's fused SwiGLU
    (megatron/core/fusions/fused_bias_swiglu.py saves its input and recomputes the activation); eager
    autograd would also keep silu(gate), one ffn-wide tensor more per layer than the planner counts."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


class MLP(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.glu = m.glu
        self.w1 = nn.Linear(m.hidden, m.ffn_hidden, bias=m.bias)
        self.w2 = nn.Linear(m.ffn_hidden, m.hidden, bias=m.bias)
        self.w3 = nn.Linear(m.hidden, m.ffn_hidden, bias=m.bias) if m.glu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(_SwiGLU.apply(self.w1(x), self.w3(x)))
        return self.w2(F.gelu(self.w1(x)))


@dataclass(frozen=True)
class MoEShape:
    num_experts: int
    top_k: int
    ep: int = 1
    ep_rank: int = 0

    @property
    def local_experts(self) -> range:
        per = self.num_experts // self.ep
        return range(self.ep_rank * per, (self.ep_rank + 1) * per)


class MoE(nn.Module):
    """Top-k mixture of experts (Shazeer et al. 2017; Mixtral's router: softmax over the top-k logits),
    dropless, experts of the dense MLP's shape keyed by their global index.

    With `ExpertParallel` set (``self.ep``), this rank holds ``shape.local_experts`` and token copies
    go to the rank of their expert and back by ``all_to_all_single`` (dispatch and combine)."""

    def __init__(self, m: ModelSpec, shape: MoEShape) -> None:
        super().__init__()
        self.shape = shape
        self.router = nn.Linear(m.hidden, shape.num_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): MLP(m) for e in shape.local_experts})
        self.ep: ExpertParallel | None = None

    def _run_experts(self, x: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for name, mlp in self.experts.items():
            rows = (expert == int(name)).nonzero().squeeze(1)
            if rows.numel():
                out = out.index_add(0, rows, mlp(x[rows]).to(out.dtype))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        logits = self.router(flat).float()
        top_logits, top_expert = logits.topk(self.shape.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)                       # (tokens, k)
        token = torch.arange(flat.shape[0], device=x.device).repeat_interleave(self.shape.top_k)
        expert = top_expert.reshape(-1)
        dev = x.device.type
        # token copies travel and enter the experts in the compute dtype (bf16 under autocast), as Megatron's
        copies = flat[token].to(torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else flat.dtype)
        y = self._run_experts(copies, expert) if self.ep is None else self._exchange(copies, expert)
        y = y.to(flat.dtype) * weights.reshape(-1, 1).to(flat.dtype)
        return torch.zeros_like(flat).index_add(0, token, y).reshape(b, s, h)

    def _exchange(self, copies: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Dispatch token copies to their experts' ranks, run them there, bring the outputs back."""
        from torch.distributed.nn.functional import all_to_all_single

        ep = self.ep
        per = self.shape.num_experts // ep.size
        order = torch.argsort(expert, stable=True)
        send_counts = torch.bincount(expert // per, minlength=ep.size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=ep.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        sorted_expert = expert[order]
        recv_expert = sorted_expert.new_empty(sum(recv))
        dist.all_to_all_single(recv_expert, sorted_expert, recv, send, group=ep.group)
        recv_x = copies.new_empty(sum(recv), copies.shape[1])
        recv_x = all_to_all_single(recv_x, copies[order], recv, send, group=ep.group)
        out = self._run_experts(recv_x, recv_expert)
        back = out.new_empty(sum(send), out.shape[1])
        back = all_to_all_single(back, out, send, recv, group=ep.group)
        return torch.empty_like(back).index_copy(0, order, back)


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm1(x)), then x + mlp(norm2(x)) (``mlp`` a `MoE` if given)."""

    def __init__(self, m: ModelSpec, *, recompute_core: bool, moe: MoEShape | None = None) -> None:
        super().__init__()
        self.norm1 = _norm(m)
        self.attn = Attention(m, recompute_core=recompute_core)
        self.norm2 = _norm(m)
        self.mlp = MoE(m, moe) if moe is not None and moe.num_experts > 0 else MLP(m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.linear.default})
"""the projections op-level SAC counts (torchtitan counts mm and linear; a biased nn.Linear on CPU runs addmm)"""


@functools.cache
def _sac_saved() -> frozenset:
    """ops whose outputs op-level SAC keeps: torch's compute-intensive ops (its partitioner's list, as torchtitan's
    _get_default_save_ops) and every SDPA kernel, the CPU one too (torchtitan lists no CPU kernel; planner.memory counts
    the attention output as kept). Built on first use: the partitioner's module imports torch._inductor and
    torch._dynamo (~1.4 s of CPU per process), which a probe without op-level SAC never needs."""
    from torch._functorch.partitioners import get_default_op_list

    return _MATMULS | {op.default for op in get_default_op_list().compute_intensive_ops} | {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default}


def op_sac_contexts():
    """torchtitan's op-level SAC for one checkpointed block (torchtitan/distributed/activation_checkpoint.py
    ``SelectiveAC._wrap_block``): compute-intensive outputs MUST_SAVE except every second matmul, counted separately in
    the forward and in the recompute, which is PREFER_RECOMPUTE as is everything else. Of wq, wk, wv, wo, w1, w3, w2 it
    keeps wq, wv, w1, w2 and re-runs wk, wo, w3 (`planner.recompute.op_sac_matmul_share`). A ``context_fn``."""
    matmuls = {False: 0, True: 0}
    saved = _sac_saved()

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in _MATMULS:
            matmuls[ctx.is_recompute] += 1
            if matmuls[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) forward, identity backward: Megatron's reduce-from-tensor-parallel region
    (the output is replicated, so each rank's gradient is already the whole gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: object) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class Embedding(nn.Module):
    """Token embedding (+ learned positions) (+ BLOOM's embedding norm).

    Vocab-parallel under TP (`set_vocab_parallel`, Megatron's VocabParallelEmbedding): ``tok.weight``
    is a DTensor sharded along the vocabulary; each rank looks up the tokens in its rows (zeros
    elsewhere) and one all-reduce sums them. The gradient stays a shard (DTensor's own embedding rule
    in torch 2.13 returns a replicated, full-size gradient)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(m.vocab, m.hidden)
        self.pos = nn.Embedding(m.seq_len, m.hidden) if m.position == "learned" else None
        self.norm = _norm(m) if m.embedding_norm else None
        self.cp: ContextParallel | None = None
        self.tp_group: object = None
        self.tp_rank = 0

    def set_vocab_parallel(self, group: object, rank: int) -> None:
        self.tp_group, self.tp_rank = group, rank

    def _lookup(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return self.tok(tokens)
        w = self.tok.weight
        local = w.to_local() if hasattr(w, "to_local") else w
        rows = local.shape[0]
        ids = tokens - self.tp_rank * rows
        outside = (ids < 0) | (ids >= rows)
        x = F.embedding(ids.masked_fill(outside, 0), local).masked_fill(outside[..., None], 0.0)
        return _SumOverGroup.apply(x, self.tp_group)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self._lookup(tokens)
        if self.pos is not None:
            if self.cp is not None:
                positions = self.cp.positions(device=tokens.device)
            else:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.pos(positions)[None]
        x = self.norm(x) if self.norm is not None else x
        dev = x.device.type
        # the residual stream in the compute dtype, as Megatron keeps it (--fp32-residual-connection off) and
        # the planner counts it; fp32 master weights would otherwise make every residual add and norm input fp32
        return x.to(torch.get_autocast_dtype(dev)) if torch.is_autocast_enabled(dev) else x


class Head(nn.Module):
    """Final norm and LM head (logits over the vocabulary)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.norm = _norm(m)
        self.output = nn.Linear(m.hidden, m.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


class GPTStage(nn.Module):
    """Layers ``layer_ids`` of the model, with the embedding if ``first`` and the head if ``last``.

    ``recompute``: none | selective (attention core only) | full (every layer re-run in backward) | block-N (the
    stage's first N layers re-run, the others keep their activations: Megatron's --recompute-method block, per
    model chunk as here, where an interleaved rank holds several stages) | selective-op (torchtitan's op-level SAC
    on every layer: `op_sac_contexts`).
    Layers live in a ModuleDict keyed by their global index, so names are the same in every layout.
    Parameters are left as the modules' constructors make them: build under ``torch.device("meta")``
    and call `init_parameters` once the storage exists (``probes.parallel.build_stages`` does).
    """

    def __init__(self, m: ModelSpec, *, layer_ids: range, first: bool, last: bool, seed: int = 0,
                 recompute: str = "none", moe: MoEShape | None = None) -> None:
        super().__init__()
        mode = recompute_modes.parse(recompute)
        # layers (from the first) whose forward is re-run in backward: all under full, N under block-N
        self.checkpointed = len(layer_ids) if recompute == "full" else (
            mode.n if mode is not None and mode.kind == "block" else 0)
        self.op_sac = recompute == "selective-op"
        self.embed: Embedding | None = Embedding(m) if first else None
        self.head: Head | None = None
        self.layers = nn.ModuleDict(
            {str(i): Block(m, recompute_core=recompute == "selective", moe=moe) for i in layer_ids})
        if last:
            self.head = Head(m)
            if m.tied_embeddings and self.embed is not None:
                self.head.output.weight = self.embed.tok.weight

    def set_context_parallel(self, cp: ContextParallel) -> None:
        for sub in self.modules():
            if isinstance(sub, (Attention, Embedding)):
                sub.cp = cp
            if isinstance(sub, Attention):
                sub._rope_cache.clear()   # positions change with the CP layout

    def set_expert_parallel(self, ep: ExpertParallel) -> None:
        for sub in self.modules():
            if isinstance(sub, MoE):
                sub.ep = ep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for i, block in enumerate(self.layers.values()):
            if (i < self.checkpointed or self.op_sac) and torch.is_grad_enabled():
                with set_checkpoint_early_stop(False):
                    x = checkpoint(block, x, use_reentrant=False, context_fn=op_sac_contexts if self.op_sac else
                                   noop_context_fn)
            else:
                x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def stage_layer_ids(layers: int, stages: int, stage: int) -> range:
    """The contiguous block of layers pipeline stage ``stage`` of ``stages`` holds."""
    per = layers // stages
    return range(stage * per, (stage + 1) * per)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every token of the micro-batch (computed in fp32)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class VocabParallelLoss:
    """`lm_loss` on logits sharded along the vocabulary over ``tp_mesh`` (Megatron's vocab-parallel
    cross-entropy): torch's ``loss_parallel`` -- the step must run inside ``loss_parallel()``, backward too.
    A callable object rather than a closure so that pipeline schedules can hold it."""

    def __init__(self, tp_mesh) -> None:
        self.tp_mesh = tp_mesh

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Shard

        if not isinstance(logits, DTensor):
            logits = DTensor.from_local(logits, self.tp_mesh, [Shard(logits.dim() - 1)], run_check=False)
        loss = F.cross_entropy(logits.float().flatten(0, -2), targets.reshape(-1))
        return loss.to_local() if isinstance(loss, DTensor) else loss


__all__ = ["ContextParallel", "ExpertParallel", "GPTStage", "Block", "Attention", "MLP", "MoE", "MoEShape",
           "Embedding", "Head", "VocabParallelLoss", "canonical_name", "init_parameters", "lm_loss",
           "stage_layer_ids"]
