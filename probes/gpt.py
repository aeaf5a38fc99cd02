"""The probe's GPT-style decoder, built one pipeline stage at a time (imports torch).

    >>> from probes.gpt import GPTStage
    >>> stage = GPTStage(model, layer_ids=range(4), first=True, last=True, seed=1234)

Shape from a `planner.model.ModelSpec`: separate Q/K/V/O projections (K and V with ``kv_heads``
heads, GQA), a GELU or SwiGLU MLP, LayerNorm or RMSNorm, learned or rotary positions (ALiBi is
not applied: SDPA's causal mask only; planner.flops counts no FLOPs for it either), optional
biases, an embedding norm, tied or untied LM head.

Every layer is initialised from its own seed (``seed + 1 + layer index``), so a stage that
builds layers 4..7 gets exactly the weights the single-process model has there: that is what
makes "each parallel layout gives the single-process loss" a test of the parallelism.

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
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from planner.model import ModelSpec

INIT_STD = 0.02
"""GPT-2's initialisation: N(0, 0.02) for every linear and embedding weight, biases zero"""


def _init_(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=INIT_STD)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.Embedding):
            nn.init.normal_(sub.weight, std=INIT_STD)


def _norm(m: ModelSpec) -> nn.Module:
    return nn.LayerNorm(m.hidden) if m.norm == "layernorm" else nn.RMSNorm(m.hidden)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (batch, seq, heads, head_dim), base 10000 (Su et al. 2021)."""
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V, causal, through SDPA (flash / memory-efficient where available)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    def __init__(self, m: ModelSpec, *, recompute_core: bool) -> None:
        super().__init__()
        self.head_dim = m.head_dim
        self.rope = m.position == "rope"
        self.recompute_core = recompute_core
        self.wq = nn.Linear(m.hidden, m.hidden, bias=m.bias)
        self.wk = nn.Linear(m.hidden, m.kv_dim, bias=m.bias)
        self.wv = nn.Linear(m.hidden, m.kv_dim, bias=m.bias)
        self.wo = nn.Linear(m.hidden, m.hidden, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)      # -1: local heads under TP
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rope:
            q, k = _rope(q), _rope(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.recompute_core:       # selective recompute: keep only Q, K, V (Korthikanti et al. 2022)
            with set_checkpoint_early_stop(False):
                out = checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            out = _attention_core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.glu = m.glu
        self.w1 = nn.Linear(m.hidden, m.ffn_hidden, bias=m.bias)
        self.w2 = nn.Linear(m.ffn_hidden, m.hidden, bias=m.bias)
        self.w3 = nn.Linear(m.hidden, m.ffn_hidden, bias=m.bias) if m.glu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, m: ModelSpec, *, recompute_core: bool) -> None:
        super().__init__()
        self.norm1 = _norm(m)
        self.attn = Attention(m, recompute_core=recompute_core)
        self.norm2 = _norm(m)
        self.mlp = MLP(m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    """Token embedding (+ learned positions) (+ BLOOM's embedding norm)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(m.vocab, m.hidden)
        self.pos = nn.Embedding(m.seq_len, m.hidden) if m.position == "learned" else None
        self.norm = _norm(m) if m.embedding_norm else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))[None]
        return self.norm(x) if self.norm is not None else x


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

    ``recompute``: none | selective (attention core only) | full (every layer re-run in backward).
    Layers live in a ModuleDict keyed by their global index, so names are the same in every layout.
    """

    def __init__(self, m: ModelSpec, *, layer_ids: range, first: bool, last: bool, seed: int,
                 recompute: str = "none") -> None:
        super().__init__()
        self.full_recompute = recompute == "full"
        self.embed: Embedding | None = None
        self.head: Head | None = None
        if first:
            torch.manual_seed(seed)
            self.embed = Embedding(m)
            _init_(self.embed)
        self.layers = nn.ModuleDict()
        for i in layer_ids:
            torch.manual_seed(seed + 1 + i)
            block = Block(m, recompute_core=recompute == "selective")
            _init_(block)
            self.layers[str(i)] = block
        if last:
            torch.manual_seed(seed + 1 + m.layers)
            self.head = Head(m)
            _init_(self.head)
            if m.tied_embeddings and self.embed is not None:
                self.head.output.weight = self.embed.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.layers.values():
            if self.full_recompute and torch.is_grad_enabled():
                with set_checkpoint_early_stop(False):
                    x = checkpoint(block, x, use_reentrant=False)
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


__all__ = ["GPTStage", "Block", "Attention", "MLP", "Embedding", "Head", "lm_loss", "stage_layer_ids"]
