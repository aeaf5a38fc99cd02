"""A transformer layer as a list of operations: each GEMM with its shape, the attention core, the element-wise and norm
traffic, the host's launches; each op with its forward FLOPs, HBM bytes and a kernel model of its time on the GPU.

`layer_ops` builds the dense layer one GPU runs for one micro-batch (TP/SP split, FP8 casts, the framework's
element-wise traffic); the features then edit the list, never calling back into the cost code:
`planner.context_parallel.ring_attention` multiplies the attention core by the CP blocks, `planner.moe.expert_ops`
swaps the MLP for the router, shared and routed experts' grouped GEMMs and the token permutation. `LayerOps` sums
the list into what the step needs: one layer's forward, forward + backward + recompute (`planner.cost`), and a
table for `plan --explain`. Memory's activation model (planner.memory) and the FLOPs formulas (planner.flops) are
checked against the same list in tests/test_ops.py.

Kernel models: GEMMs at peak x tile/wave/inner-dimension efficiency (NVIDIA "Matrix Multiplication Background"
user guide); the attention core as two batched GEMMs (QK^T, AV) at the same rate, or at the CUDA-core rate when its
head width does not suit tensor cores; element-wise work at HBM bandwidth x ELEMENTWISE_BW_EFFICIENCY; backward = 2x
forward (seed 001 "forward vs backward"), op by op. A `tune calibrate` file replaces the element-wise fraction and
the attention core's rate with what this machine ran (ClusterSpec.elementwise_efficiency, .attention_efficiency).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from planner.attention import FUSED, AttentionRate, default_kernel
from planner.constants import DENSE_MISALIGNED_EFFICIENCY, ELEMENTWISE_BW_EFFICIENCY, GEMM_K_HALF
from planner.framework import Framework
from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.recompute import Recomputed
from planner.space import Candidate, TrainingSpec

# Thread-block tile of the GEMM kernels cuBLAS runs for large 16-bit shapes: 256 rows (tokens) x 128 columns
# (NVIDIA "Matrix Multiplication Background" user guide, "Tile Quantization": 256x128 is the most efficient of its
# tiles; cuBLAS's kernels are named for it: volta_h884gemm_256x128, ampere_h16816gemm_256x128). Checked on the BLOOM
# tr11 MBS sweeps: per-sample time at MBS 1 / 2 vs 4 measured 1.12 / 1.03 (NHEADS 96 tables), predicted 1.11 / 1.03
# with 256x128 tiles, 1.07 / 1.03 with 128x128 (python tests/bench/validate.py: classic error 20.0% -> 19.6%).
GEMM_TILE_M = 256
GEMM_TILE_N = 128
# Inner size at which a GEMM is half as efficient as a long one (k / (k + GEMM_K_HALF)): planner.constants.
# 16-bit tensor-core GEMMs want every dimension a multiple of 8 elements (NVIDIA "Matrix Multiplication
# Background" user guide, "Tensor Core Requirements"). The attention's batched GEMMs (QK^T, AV) over a
# head_dim that is not are modelled at the CUDA-core FP32 rate (datasheet `peak_fp32_flops`): checked on
# the BLOOM tr11 NHEADS table (head_dim 108 = 13824/128 ran 1.30x slower than head_dim 144) and the 02-20
# tables (head_dim 150). Dense GEMMs with h/TP not a multiple of 8 (tr8-104B at TP4: 2900) ran within the
# noise of aligned ones; dense GEMMs with an odd-sized dimension (a vocabulary of 50257 unpadded) run at
# about half speed: nanoGPT (karpathy/nanoGPT model.py, "vocab_size ... padded up to nearest multiple of
# 64 for efficiency") measured ~25% faster GPT-2 training from 50257 -> 50304, the LM head being ~30% of
# the FLOPs (DENSE_MISALIGNED_EFFICIENCY, planner.constants); also the DeepSpeed autotuning HF GPT-2 dev tables.
# Query rows per thread block of the flash kernels: 128 (FlashAttention-2's kBlockM for head dims up to 128 on sm80 /
# sm90, flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h; FlashAttention-3's tile is 128 x 128, Shah
# et al. 2024 Sec. 3).
ATTENTION_BLOCK_ROWS = 128
TENSOR_CORE_MULTIPLE = 8
DENSE_ALIGNMENT = 4
# Bytes per element a norm run as PyTorch ops moves beyond the fused kernel's 2 read + 2 written (TrainingSpec
# .fused_norm False). Hugging Face's LlamaRMSNorm (transformers models/llama/modeling_llama.py), 16-bit input:
# .to(float32) r2 w4, .pow(2) r4 w4, .mean(-1) r4, x * rsqrt(var + eps) r4 w4, .to(input_dtype) r4 w2, weight * x
# r2 w2: 20 read + 16 written = 36, 32 more than fused. The backward (autograd through the same ops) is counted as
# twice the forward, as every element-wise op is here. Checked on Hagemann et al.'s sheets, the same layouts with and
# without their "RMS kernel": 1.12x predicted, 1.14x measured (tests/test_framework_cost.py).
UNFUSED_NORM_EXTRA_BYTES = 36 - 4

GEMM, ATTENTION, ELEMENTWISE, HOST = "gemm", "attention", "elementwise", "host"
"""the op classes: what calibration and --explain group by (HOST: the launches' wait, a row of the table only)"""


@dataclass(frozen=True, slots=True)
class GemmContext:
    """What a GEMM's time depends on besides its shape."""

    peak: float
    sm_count: int
    base: float
    """large-GEMM fraction of peak: the catalog's, or fitted to this machine's timed GEMMs (planner.calibration)"""
    cuda_core_ratio: float
    """CUDA-core rate / tensor-core peak, for shapes tensor cores cannot take"""
    attention_efficiency: float | None = None
    """the fused attention core's measured rate / ``peak`` in the op list's FLOPs (ClusterSpec
    .attention_efficiency, flash attention only); None: its batched GEMMs at the shape model's rate"""
    attention_rate: AttentionRate | None = None
    """the fused attention kernel's published rate on this GPU (planner.attention); None: an unfused core, or no
    published rate (the batched GEMMs at the shape model's rate)"""


def gemm_efficiency(m: int, n: int, k: int, *, batch: int, sm_count: int, base: float) -> float:
    """Fraction of peak for an (m x k) @ (k x n) GEMM repeated ``batch`` times.

    Tile quantization: tiles of GEMM_TILE_M x GEMM_TILE_N waste the part of the last tile outside the matrix;
    wave quantization: tiles run in waves of ``sm_count``, the last wave partly idle (NVIDIA
    "Matrix Multiplication Background" user guide, sections "Tile/Wave Quantization"); short
    inner dimensions cannot hide load latency: k / (k + GEMM_K_HALF).
    """
    tiles_m, tiles_n = math.ceil(m / GEMM_TILE_M), math.ceil(n / GEMM_TILE_N)
    tile_eff = (m * n) / (tiles_m * tiles_n * GEMM_TILE_M * GEMM_TILE_N)
    tiles = tiles_m * tiles_n * batch
    wave_eff = tiles / (math.ceil(tiles / sm_count) * sm_count)
    return base * tile_eff * wave_eff * k / (k + GEMM_K_HALF)


@functools.lru_cache(maxsize=1 << 16)   # pure: a plan asks for a few hundred shapes, tens of thousands of times
def gemm_s(m: int, n: int, k: int, g: GemmContext, batch: int = 1, attention: bool = False) -> float:
    if min(m, n, k) <= 0:  # a dimension split to nothing (vocab 1 over TP 2) does no work
        return 0.0
    if attention and g.attention_efficiency is not None:   # timed on this machine (tune calibrate)
        return 2.0 * m * n * k * batch / (g.peak * g.attention_efficiency)
    if attention and g.attention_rate is not None:   # the kernel's published rate (planner.attention)
        # QK^T is (s x d) @ (d x s), AV (s x s) @ (s x d): the head dim is k of the first, n of the second
        head = k if m == n else n
        # the kernel's thread blocks: one per (sequence, head, block of ATTENTION_BLOCK_ROWS queries), in waves of
        # sm_count (Dao 2023 Sec. 3.2: parallel over batch, heads and the sequence); the papers' setup fills every wave
        blocks = batch * math.ceil(m / ATTENTION_BLOCK_ROWS)
        waves = blocks / (math.ceil(blocks / g.sm_count) * g.sm_count)
        return 2.0 * m * n * k * batch / g.peak * g.attention_rate.seconds_factor(head, m) / waves
    eff = gemm_efficiency(m, n, k, batch=batch, sm_count=g.sm_count, base=g.base)
    if attention and (n % TENSOR_CORE_MULTIPLE or k % TENSOR_CORE_MULTIPLE):
        eff = min(eff, g.base) * g.cuda_core_ratio
    elif n % DENSE_ALIGNMENT or k % DENSE_ALIGNMENT:
        eff *= DENSE_MISALIGNED_EFFICIENCY
    return 2.0 * m * n * k * batch / (g.peak * eff)


def elementwise_bw(cluster: ClusterSpec) -> float:
    """Bytes/s memory-bound kernels move: the datasheet's HBM bandwidth x ELEMENTWISE_BW_EFFICIENCY, or x the
    fraction `tune calibrate` timed on this machine (ClusterSpec.elementwise_efficiency)."""
    eff = ELEMENTWISE_BW_EFFICIENCY if cluster.elementwise_efficiency is None else cluster.elementwise_efficiency
    return cluster.gpu.memory_bw_bytes_per_s * eff


def elementwise_s(nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds of memory-bound work moving ``nbytes`` through HBM (`elementwise_bw`)."""
    return nbytes / elementwise_bw(cluster)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a layer's forward on one GPU for one micro-batch (the backward runs each at 2x)."""

    name: str
    cls: str
    """GEMM | ATTENTION | ELEMENTWISE"""
    forward_s: float
    """forward seconds on the GPU (already x ``share``)"""
    flops: float = 0.0
    """forward FLOPs (already x ``share``)"""
    bytes: float = 0.0
    """forward HBM bytes of a memory-bound op (already x ``share``)"""
    share: float = 1.0
    """share of the layers that run it (MoE models: experts on the MoE layers, the dense MLP on the rest)"""
    after_sync: bool = False
    """launched after a host-device sync (Megatron's dropless MoE dispatcher): runs no faster than it is launched"""

    def scaled(self, k: float) -> "Op":
        """The op run ``k`` times as much (a share of the layers, CP's blocks)."""
        return Op(self.name, self.cls, self.forward_s * k, self.flops * k, self.bytes * k, self.share * k,
                  self.after_sync)


def gemm_op(name: str, m: int, n: int, k: int, g: GemmContext, batch: int = 1, *, attention: bool = False,
            after_sync: bool = False) -> Op:
    """A GEMM op: (m x k) @ (k x n), ``batch`` times."""
    return Op(name, ATTENTION if attention else GEMM, gemm_s(m, n, k, g, batch, attention),
              flops=2.0 * m * n * k * batch, after_sync=after_sync)


def bytes_op(name: str, nbytes: float, cluster: ClusterSpec) -> Op:
    """A memory-bound op moving ``nbytes``."""
    return Op(name, ELEMENTWISE, elementwise_s(nbytes, cluster), bytes=nbytes)


def _forward_s(gpu_s: float, after_sync_s: float, host_ahead_s: float, sync_host_s: float) -> float:
    """`LayerOps.forward_s` from its sums: the GPU's work before the sync or the host's launches (and the exposed
    chunk work), whichever is longer, then the part after the sync no faster than the host launches it."""
    return max(gpu_s - after_sync_s, host_ahead_s) + max(after_sync_s, sync_host_s)


@dataclass(frozen=True, slots=True)
class LayerOps:
    """One layer's operations on one GPU for one micro-batch, and the host time that launches them."""

    ops: tuple[Op, ...]
    host_s: float
    """the host's launch time of the layer's forward (framework.host_s_per_layer_forward x this host's speed)"""
    sync_host_s: float = 0.0
    """the host's launches after a host-device sync (`Op.after_sync`), over all layers' mean"""
    _sums: dict | None = field(default=None, init=False, repr=False, compare=False)
    """forward seconds by op class, over all ops ("gpu") and over those after a sync ("after_sync"), each the `sum`
    it stands for, taken once when first asked (None before): plan() asks a few hundred op lists for ~10,000 layer
    times (`layer_s` reads six sums)"""

    def _sum(self, key: str) -> float:
        sums = self._sums
        if sums is None:   # frozen: a cache of the ops, not a field of the list
            ops = self.ops
            sums = {cls: sum(op.forward_s for op in ops if op.cls == cls) for cls in {op.cls for op in ops}}
            sums["gpu"] = sum(op.forward_s for op in ops)
            sums["after_sync"] = sum(op.forward_s for op in ops if op.after_sync)
            object.__setattr__(self, "_sums", sums)
        return sums.get(key, 0)   # a class no op has: sum() of nothing

    def seconds(self, cls: str) -> float:
        return self._sum(cls)

    @property
    def gpu_s(self) -> float:
        return self._sum("gpu")

    @property
    def after_sync_s(self) -> float:
        return self._sum("after_sync")

    def exposed_chunk_s(self, chunk_host_s: float) -> float:
        """Of the pipeline schedule's per-chunk host work (``chunk_host_s`` a layer and pass, `planner.cost
        .chunk_host_s`), what sits on the host's critical path: all of it in a layer with a host sync, whose host
        cannot run ahead into the next chunk; none in a layer without one (ASSUMPTION: there the host's lead over the
        GPU carries it, `planner.constants.MEGATRON_CHUNK_HOST_S`)."""
        return chunk_host_s if self.sync_host_s else 0.0

    def forward_s(self, chunk_host_s: float = 0.0) -> float:
        """One forward: the GPU's work or the host's launches, whichever is longer; the part after a sync no faster
        than the host launches it (the host cannot run ahead of it); ``chunk_host_s``: `exposed_chunk_s`."""
        return _forward_s(self.gpu_s, self.after_sync_s, self.host_s + self.exposed_chunk_s(chunk_host_s),
                          self.sync_host_s)

    def layer_s(self, rc: Recomputed, chunk_host_s: float = 0.0) -> float:
        """Forward + backward (2x the GPU work, or 2x the launches: the backward launches about twice as many
        kernels) + what recompute re-runs: ``rc.layers`` whole forwards, ``rc.core`` attention cores,
        ``rc.matmul`` of the GEMMs (op-level SAC). ``chunk_host_s``: the schedule's host work a layer, in the
        forward and again in the backward (`exposed_chunk_s`)."""
        gpu, after, host, sync = self.gpu_s, self.after_sync_s, self.host_s, self.sync_host_s
        exposed = self.exposed_chunk_s(chunk_host_s)
        fwd = _forward_s(gpu, after, host + exposed, sync)
        extra = (rc.layers * _forward_s(gpu, after, host, sync)   # a recomputed forward: forward_s() (no chunk work)
                 + rc.core * self.seconds(ATTENTION) + rc.matmul * self.seconds(GEMM)
                 + rc.elementwise * self.seconds(ELEMENTWISE))
        return fwd + max(2 * gpu, 2 * (host + sync) + exposed) + extra

    def replace_ops(self, names: tuple[str, ...], new: list[Op]) -> "LayerOps":
        """The list with the ops named ``names`` taken out and ``new`` put where the first of them was."""
        out: list[Op] = []
        placed = False
        for op in self.ops:
            if op.name in names:
                if not placed:
                    out.extend(new)
                    placed = True
            else:
                out.append(op)
        if not placed:
            out.extend(new)
        return replace(self, ops=tuple(out))

    def rows(self, rc: Recomputed, chunk_host_s: float = 0.0) -> list[dict]:
        """The op table: each op's forward, backward and recomputed seconds, its share of the layer's time, its
        forward FLOPs and bytes; then the time the host's launches (and the schedule's per-chunk host work,
        ``chunk_host_s``) add when they, not the GPU, set the pace."""
        layer = self.layer_s(rc, chunk_host_s)
        rows = []
        for op in self.ops:
            again = op.forward_s * (rc.layers + (rc.core if op.cls == ATTENTION else 0.0)
                                    + (rc.matmul if op.cls == GEMM else 0.0)
                                    + (rc.elementwise if op.cls == ELEMENTWISE else 0.0))
            seconds = 3 * op.forward_s + again
            rows.append({"op": op.name, "class": op.cls, "forward_s": op.forward_s, "backward_s": 2 * op.forward_s,
                         "recompute_s": again, "seconds": seconds, "share": seconds / layer if layer else 0.0,
                         "forward_flops": op.flops, "forward_bytes": op.bytes, "layers_share": op.share})
        wait = layer - sum(r["seconds"] for r in rows)
        if wait > 1e-9 * layer:
            rows.append({"op": "host_launch_wait", "class": HOST, "forward_s": 0.0, "backward_s": 0.0,
                         "recompute_s": 0.0, "seconds": wait, "share": wait / layer, "forward_flops": 0.0,
                         "forward_bytes": 0.0, "layers_share": 1.0})
        return rows


FUSED_SOFTMAX_SCORE_BYTES = 9
"""per attention score of Megatron's fused scale-mask-softmax + dropout (Korthikanti et al. 2022 Sec. 4: the scores
read, the probabilities and the 1-byte dropout mask written, 16-bit; fused_elementwise_bytes)"""


def score_bytes(model: ModelSpec, kernel: str, softmax_fp32: bool = False) -> float:
    """Forward HBM bytes per attention score outside the GEMMs: none in a fused kernel (planner.attention.FUSED),
    Megatron's fused softmax (FUSED_SOFTMAX_SCORE_BYTES), or PyTorch's ops (EAGER_SCORE_BYTES, or a Megatron-style
    trainer's softmax in fp32, FP32_SOFTMAX_SCORE_BYTES; + dropout's)."""
    if kernel in FUSED:
        return 0.0
    if kernel == "fused-softmax":
        return FUSED_SOFTMAX_SCORE_BYTES
    return (FP32_SOFTMAX_SCORE_BYTES if softmax_fp32 else EAGER_SCORE_BYTES) \
        + (EAGER_DROPOUT_BYTES if model.dropout else 0)


def fused_elementwise_bytes(model: ModelSpec, cand: Candidate, training: TrainingSpec,
                            kernel: str = "fused-softmax") -> dict[str, float]:
    """Forward HBM bytes of one layer's memory-bound ops as Megatron's fused kernels (and Inductor's) run them, 16-bit
    (Korthikanti et al. 2022 Sec. 4's tensors): 2 norms r/w 8·Th, 2 bias-dropout-adds 14·Th (both split by SP), Q/K/V
    and context layout copies between [s,b,a,d] and [b·a,s,d] 16·Th/t, the activation r/w 4·T·f/t (6 with GLU),
    scale-mask-softmax + dropout on the scores 9·b·a·s²/t without flash; RoPE fused into the layout copies."""
    t, s, b, h = cand.tp, model.seq_len, cand.mbs, model.hidden
    tokens, sp = s * b, (cand.tp if cand.sp else 1)
    th = tokens * h
    norms = 8 * th / sp
    if not training.fused_norm:   # the norms as PyTorch ops: 32 more bytes an element than the fused kernel, each
        norms += UNFUSED_NORM_EXTRA_BYTES * 2 * th / sp
    return {"norms": norms, "qkv_layout": 16 * th / t,
            "softmax_dropout": score_bytes(model, kernel if not training.flash_attention else "fa2")
            * b * model.heads * s * s / t,
            "residual": 14 * th / sp, "mlp_act": (6 if model.glu else 4) * tokens * model.ffn_hidden / t}


# Bytes per element of PyTorch's element-wise kernels, 16-bit tensors (each op reads its inputs and writes its
# output once: a kernel per op in eager mode):
EAGER_NORM_BYTES = {"layernorm": 4, "rmsnorm": 36}
"""per element of a norm: torch.nn.LayerNorm is one native kernel (r2 w2); an RMSNorm as Hugging Face's
LlamaRMSNorm / torchtitan's eager RMSNorm runs it, five ops in fp32 (UNFUSED_NORM_EXTRA_BYTES' count: 36)"""
EAGER_BINARY_BYTES = 6
"""a binary op (the residual add x + f(x), SwiGLU's gate multiply): r2 r2 w2"""
EAGER_DROPOUT_BYTES = 5
"""torch.nn.functional.dropout (native_dropout): r2, w2 and the 1-byte mask"""
EAGER_ROPE_BYTES = 20
"""per element of q and k: torchtitan's apply_rotary_emb (.float() r2 w4, complex multiply r4 w4, .type_as r4 w2);
Hugging Face's rotate_half form (q*cos, cat of the negated halves, *sin, add) moves about as much"""
COMPILED_COMPLEX_ROPE_BYTES = 16
"""per element of q and k under torch.compile: Inductor generates no code for complex operators (lowering.py "does
not support code generation for complex operators", torchtitan issue #15), so torchtitan's apply_rotary_emb keeps the
fp32 cast r2 w4 and the complex multiply r4 w4 as their own kernels; the cast back is fused into the next copy, which
reads fp32 (2 more bytes)"""
EAGER_SCORE_BYTES = 17
"""per attention score without a fused kernel (Hugging Face GPT2Attention._attn / eager_attention_forward): the
scale r2 w2, the causal torch.where r2 r1 w2, the attention mask's add r2 w2, softmax r2 w2; dropout on the
probabilities adds EAGER_DROPOUT_BYTES"""
FP32_SOFTMAX_SCORE_BYTES = (29 + 33) / 3
"""per attention score of a Megatron-style trainer's unfused softmax in fp32 (megatron/core/fusions/fused_softmax.py
FusedScaleMaskSoftmax.forward_torch_softmax with attention_softmax_in_fp32; Aleph-Alpha/scaling's MaskedSoftmaxTorch
likewise), forward: .float() r2 w4, masked_fill_ r4 r1 w4, softmax r4 w4, back to 16-bit r4 w2 = 29; backward: the
cast's r2 w4, softmax's r4 r4 w4, masked_fill's r4 r1 w4, the cast's r4 w2 = 33. The op list charges the backward at
2x the forward, so the forward carries a third of the 62"""
EAGER_ACTIVATION_BYTES = 4
"""per FFN element of a native activation kernel (GELU, SiLU): r2 w2; SwiGLU's gate multiply adds r2 r2 w2"""
EAGER_PYTHON_GELU_BYTES = 36
"""per FFN element of transformers' NewGELUActivation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as 8 ops: pow r2 w2,
two scalar multiplies r2 w2 each, x + r2 r2 w2, tanh r2 w2, 1 + r2 w2, 0.5·x r2 w2, the product r2 r2 w2"""


def eager_elementwise_bytes(model: ModelSpec, cand: Candidate, training: TrainingSpec,
                            kernel: str = "unfused", norm_as_ops: bool = True,
                            softmax_fp32: bool = False) -> dict[str, float]:
    """Forward HBM bytes of one layer's memory-bound ops as an eager PyTorch model runs them (torchtitan without
    torch.compile, Hugging Face modules, fms-fsdp), counted op by op from the model's facts: its norm, RoPE, GQA's
    repeat_kv copies, activation, dropout; SP (torchtitan's sequence parallel) splits the norms and residuals."""
    t, s, b, h = cand.tp, model.seq_len, cand.mbs, model.hidden
    tokens, sp = s * b, (cand.tp if cand.sp else 1)
    th = tokens * h
    norms_per_layer = 4 if model.norm_placement == "sandwich" else 2
    residual = 2 * (EAGER_BINARY_BYTES + (EAGER_DROPOUT_BYTES if model.dropout else 0)) * th / sp
    # layout copies around attention as the fused count has them, and repeat_kv expanding K and V to every head
    # (torchtitan llama / Hugging Face repeat_kv: read kv_dim, write q_dim, 16-bit, each of K and V)
    layout = 16 * th / t + (2 * (2 * model.kv_dim + 2 * model.q_dim) * tokens / t
                            if model.kv_heads < model.heads else 0.0)
    activation = (EAGER_PYTHON_GELU_BYTES if model.activation_as_ops else EAGER_ACTIVATION_BYTES) \
        + (EAGER_BINARY_BYTES if model.glu else 0)
    scores = 0.0 if training.flash_attention else \
        score_bytes(model, kernel, softmax_fp32) * b * model.heads * s * s / t
    norm_bytes = EAGER_NORM_BYTES[model.norm] if norm_as_ops else EAGER_NORM_BYTES["layernorm"]   # one kernel
    return {"norms": norms_per_layer * norm_bytes * th / sp,
            "rope": (EAGER_ROPE_BYTES * (model.q_dim + model.kv_dim) * tokens / t * model.rotary_percent
                     if model.position == "rope" else 0.0),
            "qkv_layout": layout, "softmax_dropout": scores, "residual": residual,
            "mlp_act": activation * tokens * model.ffn_hidden / t}


def layer_ops(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, g: GemmContext,
              g_core: GemmContext, fw: Framework) -> LayerOps:
    """The dense layer one GPU runs for one micro-batch of ``model.seq_len`` tokens: QKV, attention core, output
    projection, FC1, FC2 split by TP (Megatron Sec. 3: column-parallel QKV / FC1, row-parallel projection / FC2);
    the memory-bound ops fused (`fused_elementwise_bytes`) or eager (`eager_elementwise_bytes`); the host's
    launches. ``g``: the GEMMs' rate (FP8's under FP8), ``g_core``: the attention core's (never FP8 in Transformer
    Engine)."""
    t, s, b, h = cand.tp, model.seq_len, cand.mbs, model.hidden
    tokens = s * b
    ffn_out = model.ffn_hidden * (2 if model.glu else 1)
    heads = b * max(1, model.heads // t)
    d = model.head_dim
    gemms = {"qkv": gemm_op("qkv", tokens, (model.q_dim + 2 * model.kv_dim) // t, h, g),
             "attn_scores": gemm_op("attn_scores", s, s, d, g_core, heads, attention=True),
             "attn_values": gemm_op("attn_values", s, d, s, g_core, heads, attention=True),
             "proj": gemm_op("proj", tokens, h, model.q_dim // t, g),
             "fc1": gemm_op("fc1", tokens, ffn_out // t, h, g),
             "fc2": gemm_op("fc2", tokens, h, model.ffn_hidden // t, g)}
    kernel = default_kernel(training, cluster.gpu, fw.eager)[0]
    if fw.eager:
        moved = eager_elementwise_bytes(model, cand, training, kernel)
    elif training.eager_ops:   # a Megatron-style trainer with PyTorch's element-wise ops: its norms as it says
        moved = eager_elementwise_bytes(model, cand, training, kernel, norm_as_ops=not training.fused_norm,
                                        softmax_fp32=True)
    else:
        moved = fused_elementwise_bytes(model, cand, training, kernel)
        if training.framework == "fsdp" and not training.fsdp_trainer and model.position == "rope":   # torchtitan
            moved["rope"] = COMPILED_COMPLEX_ROPE_BYTES * (model.q_dim + model.kv_dim) * tokens / t \
                * model.rotary_percent
    ops = []
    for name in ("norms", "rope", "qkv", "qkv_layout", "attn_scores", "softmax_dropout", "attn_values", "proj",
                 "residual", "fc1", "mlp_act", "fc2"):
        if name in gemms:
            ops.append(gemms[name])
        elif moved.get(name):
            ops.append(bytes_op(name, moved[name], cluster))
    return LayerOps(ops=tuple(ops), host_s=fw.host_s_per_layer_forward * cluster.host_scale)


__all__ = ["ATTENTION", "COMPILED_COMPLEX_ROPE_BYTES", "ELEMENTWISE", "GEMM", "HOST", "GemmContext", "LayerOps", "Op", "UNFUSED_NORM_EXTRA_BYTES",
           "bytes_op", "eager_elementwise_bytes", "elementwise_bw", "elementwise_s", "fused_elementwise_bytes", "gemm_efficiency", "gemm_op",
           "gemm_s", "layer_ops"]
