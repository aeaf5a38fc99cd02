"""Model shapes: `ModelSpec`, the presets, and readers for HF config.json and plantune YAML.

    >>> from planner.model import load_model
    >>> m = load_model("176B")          # BLOOM-176B
    >>> round(m.params / 1e9, 3)
    176.247

Parameter counts are computed from the shape, never typed in; tests pin them to the
published counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields
from functools import lru_cache
from pathlib import Path

from planner.errors import InputError
from planner.files import read_mapping
from planner.hf_cache import REPO_ID, cached_config
from planner.schema import check_model_yaml


@dataclass(frozen=True, slots=True, kw_only=True)
class Rampup:
    """Megatron's ``--rampup-batch-size START INCREMENT SAMPLES`` (megatron/microbatches.py)."""

    start: int
    """first global batch size (sequences)"""
    increment: int
    """added to the batch size at each rampup step"""
    samples: int
    """samples consumed while ramping from ``start`` to the final global batch"""

    def __post_init__(self) -> None:
        if self.start <= 0 or self.increment <= 0 or self.samples <= 0:
            raise InputError(
                f"rampup {self.start} {self.increment} {self.samples}: all three must be > 0; "
                "give --rampup START INCREMENT SAMPLES with positive integers")

    def batch_sizes(self, global_batch: int) -> list[int]:
        """Every batch size the run goes through, the final one included."""
        sizes = list(range(self.start, global_batch, self.increment))
        return sizes + [global_batch]

    def as_list(self) -> list[int]:
        return [self.start, self.increment, self.samples]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape and its default training settings."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    """key/value heads: == heads for MHA, fewer for GQA (Llama-2 70B, Llama-3)"""
    ffn_hidden: int
    vocab: int
    seq_len: int
    glu: bool = False
    """SwiGLU MLP (three ffn matrices) instead of GELU (two)"""
    tied_embeddings: bool = True
    position: str = "learned"
    """learned | rope | alibi: learned adds a seq_len x hidden table"""
    norm: str = "layernorm"
    """layernorm (weight + bias) | rmsnorm (weight only)"""
    bias: bool = True
    """linear layers carry biases (GPT/BLOOM yes, Llama no)"""
    embedding_norm: bool = False
    """a layernorm right after the word embedding (BLOOM)"""
    kv_channels: int | None = None
    """width of one attention head where it is not hidden / heads (Gemma-7B: 256 with hidden 3072 and 16
    heads; Megatron's --kv-channels); None: hidden / heads"""
    global_batch: int | None = None
    """the real run's global batch size in sequences"""
    rampup: Rampup | None = None
    train_tokens: float | None = None
    """tokens the real run was trained on (for days / GPU-hours)"""
    source: str = ""
    # mixture of experts, multi-latent attention, long context (planner.moe): 0 = absent
    num_experts: int = 0
    """routed experts per MoE layer (Megatron --num-experts)"""
    moe_topk: int = 0
    """experts each token is routed to (--moe-router-topk)"""
    moe_ffn_hidden: int = 0
    """one expert's FFN width (--moe-ffn-hidden-size); 0 = ffn_hidden"""
    shared_experts: int = 0
    """always-active experts of moe_ffn_hidden each (DeepSeek-V3: 1)"""
    moe_layer_freq: int = 1
    """every n-th layer (after first_dense_layers) has experts"""
    first_dense_layers: int = 0
    """leading dense layers (DeepSeek-V3 first_k_dense_replace: 3)"""
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    """multi-latent attention's compressed KV width (DeepSeek-V3: 512); 0 = no MLA"""
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_scaling: str = ""
    """RoPE scaling type from config.json (llama3, yarn); empty = none"""
    rope_scaling_factor: float = 1.0
    mtp_layers: int = 0
    """multi-token-prediction modules after the last layer (Megatron --mtp-num-layers; DeepSeek-V3: 1), each a
    transformer layer of the model's own kind plus a 2h x h projection, sharing the embedding and LM head"""
    # the model's own facts beyond its shape (planner.model_facts: checks, YAML defaults; planner.emit writes them)
    architecture: str = ""
    """the Hugging Face class the file names (``architectures[0]``: LlamaForCausalLM); empty for presets / YAML"""
    hub_id: str = ""
    """the Hugging Face repository the model is published as (meta-llama/Llama-3.1-8B): where its tokenizer is, for
    the launchers; a preset's, a config.json's ``_name_or_path`` or the cached repository it was read from; empty
    when unknown"""
    max_positions: int = 0
    """positions the model was built for (config.json max_position_embeddings: Llama-3.1 131,072); 0 = seq_len.
    seq_len is the default training length, this the limit a run may go up to"""
    rope_theta: float = 0.0
    """RoPE base (Llama 3: 500,000; Qwen2.5, Qwen3, Mistral v0.3: 1,000,000); 0 = RoFormer's 10,000"""
    rotary_percent: float = 1.0
    """fraction of each head's width that is rotated (GPT-NeoX rotary_pct 0.25)"""
    norm_eps: float = 0.0
    """epsilon of every LayerNorm/RMSNorm (Qwen: 1e-6); 0 = not stated (Megatron's 1e-5)"""
    qkv_bias: bool = False
    """q/k/v biases in a model whose other linear layers have none (Qwen2, Qwen2.5: Megatron --add-qkv-bias)"""
    qk_norm: str = ""
    """RMSNorm on queries and keys: "head" (per head, head_dim wide: Qwen3, Gemma 3; Megatron --qk-layernorm),
    "full" (over all heads, q_dim / kv_dim wide: OLMo 2), "" none"""
    norm_placement: str = "pre"
    """pre (norm before attention and MLP) | post (after each, OLMo 2) | sandwich (before and after each: Gemma 2/3)"""
    activation: str = ""
    """the MLP's activation: gelu | gelu_tanh | silu | relu; "" = gelu, or silu with glu (SwiGLU)"""
    activation_as_ops: bool = False
    """the activation runs as Python ops, a kernel each (transformers' NewGELUActivation for gelu_new / gelu_fast:
    GPT-2); False: one native kernel (torch's GELU, SiLU). Only an eager run's time reads it"""
    parallel_residual: bool = False
    """attention and MLP side by side from one residual (GPT-NeoX, Falcon, GPT-J)"""
    attn_softcap: float = 0.0
    """attention logits soft-capped at this value (Gemma 2: 50); 0 = none"""
    logit_softcap: float = 0.0
    """output logits soft-capped at this value (Gemma 2: 30); 0 = none"""
    sliding_window: int = 0
    """attention window in tokens (Mistral-7B-v0.1: 4096); 0 = full attention"""
    window_full_every: int = 0
    """with sliding_window: every n-th layer attends in full (Gemma 2: 2, Gemma 3: 6; Megatron
    --window-attn-skip-freq); 0 = every layer is windowed"""
    init_std: float = 0.0
    """weight-init standard deviation (config.json initializer_range: DeepSeek-V3 0.006); 0 = planner.emit.facts'"""
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    """YaRN attention scaling (DeepSeek-V2: 0.707, 0.707; DeepSeek-V3: 1, 1) with rope_scaling yarn"""
    moe_aux_loss_coeff: float = 0.0
    """load-balancing loss weight (Mixtral router_aux_loss_coef 0.02, Qwen3-MoE 0.001); 0 = none (Megatron's default)"""
    moe_seq_aux: bool = False
    """the balance loss per sequence, not per batch (DeepSeek seq_aux; Megatron seq_aux_loss)"""
    moe_score: str = "softmax"
    """router score function: softmax | sigmoid (DeepSeek-V3)"""
    moe_norm_topk: bool = True
    """top-k weights renormalised to sum 1 (norm_topk_prob); False: softmax over all experts, then top-k
    (Qwen2-MoE, DeepSeek-V2; Megatron --moe-router-pre-softmax)"""
    moe_topk_scale: float = 1.0
    """routed experts' weights times this (DeepSeek routed_scaling_factor: V2 16, V3 2.5)"""
    moe_groups: int = 0
    moe_group_topk: int = 0
    """group-limited routing: experts in moe_groups groups, tokens routed within moe_group_topk of them (DeepSeek
    n_group, topk_group)"""
    moe_expert_bias: bool = False
    """auxiliary-loss-free balancing: a per-expert bias on the routing scores (DeepSeek-V3 noaux_tc)"""
    moe_shared_gate: bool = False
    """a sigmoid gate on the shared experts' output (Qwen2-MoE shared_expert_gate)"""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        if self.kv_channels is not None and (not isinstance(self.kv_channels, int) or self.kv_channels <= 0):
            raise InputError(f"model {self.name!r}: kv_channels must be a positive integer, got {self.kv_channels!r}")
        if self.kv_channels is None and self.hidden % self.heads:
            raise InputError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise InputError(f"model {self.name!r}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.position not in ("learned", "rope", "alibi"):
            raise InputError(f"model {self.name!r}: position must be learned, rope or alibi")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise InputError(f"model {self.name!r}: norm must be layernorm or rmsnorm")
        for problem in shape_problems(self) + fact_problems(self):
            raise InputError(f"model {self.name!r}: {problem}")

    # -- derived shape ---------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """width of Q and of the attention output: heads * head_dim (== hidden unless kv_channels is set)"""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """width of K (and of V): kv_heads * head_dim"""
        return self.kv_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def params_per_layer(self) -> int:
        """One transformer block: attention (Q, K, V, O), MLP, two norms, optional biases."""
        if needs_own_shape(self):
            return mean_layer_params(self)   # MoE / MLA / head width: mean over dense and MoE layers
        h, f, kv, q = self.hidden, self.ffn_hidden, self.kv_dim, self.q_dim
        attn = h * (q + 2 * kv) + q * h
        mlp = (3 if self.glu else 2) * h * f
        biases = (q + 2 * kv + h + (2 if self.glu else 1) * f + h) if self.bias else 0
        return attn + mlp + biases + self.layer_vector_params

    @property
    def dropout(self) -> bool:
        """The model trains with hidden and attention dropout: GPT-style models (LayerNorm with biases: GPT-2's
        resid_pdrop / attn_pdrop 0.1, Megatron's --hidden-dropout / --attention-dropout default 0.1); Llama-style ones
        (RMSNorm, no biases) without (Touvron et al. 2023; Megatron-LM's examples/llama: 0.0)."""
        return self.norm != "rmsnorm" and self.bias

    @property
    def positions(self) -> int:
        """The longest sequence the model takes: max_positions when the file says it, else seq_len."""
        return self.max_positions or self.seq_len

    @property
    def layer_vector_params(self) -> int:
        """One block's norms and the vectors beside its matrices: two norms (four with sandwich norms, Gemma 2/3:
        HF Gemma2DecoderLayer), QK norms (head_dim each for q and k, Qwen3Attention q_norm/k_norm; q_dim + kv_dim,
        Olmo2Attention), q/k/v biases of a model otherwise without biases (Qwen2Attention q/k/v_proj bias=True)."""
        n = (4 if self.norm_placement == "sandwich" else 2) * self.norm_params
        if self.qk_norm:
            n += 2 * self.head_dim if self.qk_norm == "head" else self.q_dim + self.kv_dim
        if self.qkv_bias and not self.bias:
            n += self.q_dim + 2 * self.kv_dim
        return n

    @property
    def embedding_params(self) -> int:
        """Word embedding (+ learned positions, + embedding norm); the LM head when untied."""
        n = self.vocab * self.hidden
        if self.position == "learned":
            n += self.positions * self.hidden
        if self.embedding_norm:
            n += self.norm_params
        if not self.tied_embeddings:
            n += self.vocab * self.hidden
        return n

    @property
    def params(self) -> int:
        """Total parameters: embeddings + layers + final norm."""
        if needs_own_shape(self):
            return total_params(self)
        return self.embedding_params + self.layers * self.params_per_layer + self.norm_params

    @property
    def active_params(self) -> int:
        """Parameters one token goes through: == params for dense models, top-k experts for MoE."""
        return active_params(self) if is_moe(self) else self.params

    def with_overrides(self, **changes: object) -> "ModelSpec":
        clean = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **clean) if clean else self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rampup"] = self.rampup.as_list() if self.rampup else None
        return d


# -- the model's own facts (planner.model_facts: which a target can express) -----------------------------
QK_NORMS = ("", "head", "full")
NORM_PLACEMENTS = ("pre", "post", "sandwich")
ACTIVATIONS = ("", "gelu", "gelu_tanh", "silu", "relu")
MOE_SCORES = ("softmax", "sigmoid")
ROPE_SCALINGS = ("", "llama3", "yarn", "linear")
"""RoPE scalings plantune reads: Llama 3.1's (factor, 1/4/8192), YaRN (DeepSeek-V2/V3), linear interpolation"""

FACT_YAML_DEFAULTS: dict[str, object] = {
    "architecture": "", "hub_id": "", "max_positions": 0, "rope_theta": 0.0, "rotary_percent": 1.0, "norm_eps": 0.0,
    "qkv_bias": False, "qk_norm": "", "norm_placement": "pre", "activation": "", "activation_as_ops": False,
    "parallel_residual": False,
    "attn_softcap": 0.0, "init_std": 0.0, "logit_softcap": 0.0, "sliding_window": 0, "window_full_every": 0,
    "yarn_mscale": 1.0,
    "yarn_mscale_all_dim": 0.0, "moe_aux_loss_coeff": 0.0, "moe_seq_aux": False, "moe_score": "softmax",
    "moe_norm_topk": True, "moe_topk_scale": 1.0, "moe_groups": 0, "moe_group_topk": 0, "moe_expert_bias": False,
    "moe_shared_gate": False,
}
"""the fields above at their defaults: a model YAML leaves them out (and plan.yaml does not write them)"""


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def fact_problems(m: ModelSpec) -> list[str]:
    """What makes these facts meaningless (checked by ModelSpec on construction)."""
    out: list[str] = []
    for name in ("max_positions", "sliding_window", "window_full_every", "moe_groups", "moe_group_topk"):
        v = getattr(m, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            out.append(f"{name} must be a non-negative integer, got {v!r}")
    for name in ("rope_theta", "norm_eps", "attn_softcap", "logit_softcap", "moe_aux_loss_coeff", "yarn_mscale_all_dim",
                 "init_std"):
        v = getattr(m, name)
        if not _number(v) or v < 0:
            out.append(f"{name} must be a number >= 0, got {v!r}")
    for name in ("rotary_percent",):
        v = getattr(m, name)
        if not _number(v) or not 0 < v <= 1:
            out.append(f"{name} must be a number in (0, 1], got {v!r}")
    for name in ("moe_topk_scale", "yarn_mscale"):
        v = getattr(m, name)
        if not _number(v) or v <= 0:
            out.append(f"{name} must be a number > 0, got {v!r}")
    for name in ("qkv_bias", "activation_as_ops", "parallel_residual", "moe_seq_aux", "moe_norm_topk", "moe_expert_bias", "moe_shared_gate"):
        if not isinstance(getattr(m, name), bool):
            out.append(f"{name} must be true or false, got {getattr(m, name)!r}")
    for name, choices in (("qk_norm", QK_NORMS), ("norm_placement", NORM_PLACEMENTS), ("activation", ACTIVATIONS),
                          ("moe_score", MOE_SCORES), ("rope_scaling", ROPE_SCALINGS)):
        if getattr(m, name) not in choices:
            out.append(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {getattr(m, name)!r}")
    for name in ("architecture", "hub_id"):
        if not isinstance(getattr(m, name), str):
            out.append(f"{name} must be text, got {getattr(m, name)!r}")
    if out:
        return out
    if m.max_positions and m.max_positions < m.seq_len and m.position == "learned":
        out.append(f"seq_len {m.seq_len} is over the {m.max_positions} learned positions (max_positions)")
    if m.moe_group_topk > m.moe_groups or (m.moe_groups and m.num_experts % m.moe_groups):
        out.append(f"moe_groups {m.moe_groups} must divide the {m.num_experts} experts and be >= moe_group_topk "
                   f"{m.moe_group_topk}")
    if m.window_full_every and not m.sliding_window:
        out.append("window_full_every needs a sliding_window")
    return out


# -- mixture-of-experts and multi-latent attention: shape and parameters (planner.moe: the rest) ---------
# Sources: Jiang et al. 2024 "Mixtral of Experts" (arXiv 2401.04088) Sec. 2; DeepSeek-AI 2024 "DeepSeek-V3 Technical
# Report" (arXiv 2412.19437) Sec. 2.1 and 4.2; Qwen3 Technical Report (arXiv 2505.09388) Table 2.
def is_moe(m: ModelSpec) -> bool:
    return m.num_experts > 0


def expert_ffn(m: ModelSpec) -> int:
    """One routed expert's FFN width (Megatron ``--moe-ffn-hidden-size``; defaults to ffn_hidden)."""
    return m.moe_ffn_hidden or m.ffn_hidden


def moe_layer_count(m: ModelSpec) -> int:
    """Layers with experts: every ``moe_layer_freq``-th layer after the first ``first_dense_layers``
    (Megatron ``--moe-layer-freq``; DeepSeek-V3 ``first_k_dense_replace`` = 3)."""
    if not is_moe(m):
        return 0
    return -(-(m.layers - m.first_dense_layers) // m.moe_layer_freq)   # layers f, f+k, f+2k, ... below L


def dense_layer_count(m: ModelSpec) -> int:
    return m.layers - moe_layer_count(m)


def mlp_params(m: ModelSpec, ffn: int) -> int:
    """One (SwiGLU or GELU) MLP of width ``ffn``: (3 or 2)·h·ffn weights (+ biases)."""
    h = m.hidden
    biases = ((2 if m.glu else 1) * ffn + h) if m.bias else 0
    return (3 if m.glu else 2) * h * ffn + biases


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def attention_params(m: ModelSpec) -> int:
    """Q, K, V, O (+ biases). MLA (DeepSeek-V3 report Eq. 1-11): q down (h·q_lora) + norm + q up
    (q_lora·heads·(nope+rope)); kv down (h·(kv_lora+rope)) + norm + kv up (kv_lora·heads·(nope+v));
    output heads·v·h. Otherwise Q and O are heads·head_dim wide, K and V kv_heads·head_dim."""
    h, a = m.hidden, m.heads
    if m.kv_lora_rank:
        nope, rope, v = m.head_dim, m.qk_rope_head_dim, m.v_head_dim or m.head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * (nope + rope)) if m.q_lora_rank \
            else h * a * (nope + rope)
        kv = h * (m.kv_lora_rank + rope) + m.kv_lora_rank + m.kv_lora_rank * a * (nope + v)
        return q + kv + a * v * h
    q, kv = m.q_dim, m.kv_dim
    biases = (q + 2 * kv + h) if m.bias else 0
    return h * (q + 2 * kv) + q * h + biases


def router_params(m: ModelSpec) -> int:
    """The gate: h x experts (Mixtral ``block_sparse_moe.gate``)."""
    return m.hidden * m.num_experts


def expert_layer_params(m: ModelSpec) -> int:
    """Routed experts of one MoE layer: what EP and ETP shard."""
    return m.num_experts * mlp_params(m, expert_ffn(m))


def moe_layer_non_expert_params(m: ModelSpec) -> int:
    """One MoE layer without its routed experts: attention, router, shared experts (and their sigmoid gate, h x 1:
    Qwen2MoeSparseMoeBlock shared_expert_gate), norms and the other vectors (ModelSpec.layer_vector_params)."""
    shared = mlp_params(m, m.shared_experts * expert_ffn(m)) if m.shared_experts else 0
    gate = m.hidden if m.moe_shared_gate else 0
    return attention_params(m) + router_params(m) + shared + gate + m.layer_vector_params


def dense_layer_params(m: ModelSpec) -> int:
    return attention_params(m) + mlp_params(m, m.ffn_hidden) + m.layer_vector_params


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def layers_params(m: ModelSpec) -> int:
    """All transformer layers."""
    n_moe = moe_layer_count(m)
    return (dense_layer_count(m) * dense_layer_params(m)
            + n_moe * (moe_layer_non_expert_params(m) + expert_layer_params(m)))


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def active_layers_params(m: ModelSpec) -> int:
    """All layers counting only the ``moe_topk`` routed experts a token goes through (Mixtral Sec. 2)."""
    n_moe = moe_layer_count(m)
    active_experts = m.moe_topk * mlp_params(m, expert_ffn(m))
    return dense_layer_count(m) * dense_layer_params(m) + n_moe * (moe_layer_non_expert_params(m) + active_experts)


def total_params(m: ModelSpec) -> int:
    return m.embedding_params + layers_params(m) + m.norm_params


def active_params(m: ModelSpec) -> int:
    """Parameters one token touches: Mixtral's 12.9B of 46.7B, DeepSeek-V3's 37B of 671B."""
    return m.embedding_params + active_layers_params(m) + m.norm_params


def mtp_non_expert_params(m: ModelSpec) -> int:
    """What TP shards of the MTP modules: each has RMSNorms on the hidden state and on the next token's embedding,
    a projection M_k of [h; h] -> h (2h·h), one transformer layer (DeepSeek-V3's is a MoE layer: HF layer 61) and
    a final norm; the embedding and output head are the main model's (report Sec. 2.2, 'shared')."""
    if not m.mtp_layers:
        return 0
    layer = moe_layer_non_expert_params(m) if is_moe(m) else dense_layer_params(m)
    return m.mtp_layers * (2 * m.hidden * m.hidden + 3 * m.norm_params + layer)


def mtp_expert_params(m: ModelSpec) -> int:
    """The MTP layers' routed experts (sharded over EP x ETP like the others)."""
    return m.mtp_layers * expert_layer_params(m) if is_moe(m) else 0


def mtp_params(m: ModelSpec) -> int:
    """All MTP parameters: DeepSeek-V3's HF checkpoint (685B) holds 14B beyond the report's 671B, i.e. these
    plus its own copies of the embedding and output head (2·V·h)."""
    return mtp_non_expert_params(m) + mtp_expert_params(m)


def mean_layer_params(m: ModelSpec) -> int:
    return round(layers_params(m) / m.layers)


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def mean_non_expert_layer_params(m: ModelSpec) -> float:
    """Per-layer average of what TP (not EP) shards: attention, norms, router, shared and dense MLPs."""
    return (dense_layer_count(m) * dense_layer_params(m) + moe_layer_count(m) * moe_layer_non_expert_params(m)) / m.layers


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def mean_expert_layer_params(m: ModelSpec) -> float:
    return moe_layer_count(m) * expert_layer_params(m) / m.layers


def needs_own_shape(m: ModelSpec) -> bool:
    """Shapes the plain dense formula does not describe: MoE, MLA, or heads·head_dim != hidden."""
    return is_moe(m) or bool(m.kv_lora_rank) or m.q_dim != m.hidden


def shape_problems(m: ModelSpec) -> list[str]:
    """What makes a MoE / MLA shape meaningless (checked by ModelSpec on construction)."""
    out = []
    for name in ("num_experts", "moe_topk", "moe_ffn_hidden", "shared_experts", "first_dense_layers",
                 "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers"):
        value = getattr(m, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            out.append(f"{name} must be a non-negative integer, got {value!r}")
    if out:
        return out
    if not isinstance(m.moe_layer_freq, int) or m.moe_layer_freq < 1:
        out.append(f"moe_layer_freq must be an integer >= 1, got {m.moe_layer_freq!r}")
    if m.num_experts and not 0 < m.moe_topk <= m.num_experts:
        out.append(f"moe_topk {m.moe_topk} must be in 1..num_experts ({m.num_experts})")
    if m.num_experts and m.first_dense_layers >= m.layers:
        out.append(f"first_dense_layers {m.first_dense_layers} leaves no MoE layer of {m.layers}")
    if m.kv_lora_rank and not m.qk_rope_head_dim:
        out.append("multi-latent attention (kv_lora_rank > 0) needs qk_rope_head_dim")
    if not (isinstance(m.rope_scaling_factor, (int, float)) and m.rope_scaling_factor >= 1):
        out.append(f"rope_scaling_factor must be a number >= 1, got {m.rope_scaling_factor!r}")
    return out


# the FLOPs per token these weights imply (2 per weight per token; Narayanan et al. 2021 Sec. 5.1), which
# planner.flops, planner.moe and planner.recompute read
def attention_matmul_flops(m: ModelSpec, tokens: int) -> float:
    """Forward projections (2 FLOPs per weight per token, no biases) plus the core QK^T and AV:
    2·2·tokens·s·heads·head_dim (Narayanan et al. 2021 Sec. 5.1), with MLA's q/k width nope+rope
    and v width v_head_dim."""
    weights = attention_params(m) - (m.q_lora_rank + m.kv_lora_rank if m.kv_lora_rank else 0)
    if m.bias and not m.kv_lora_rank:
        weights -= m.q_dim + 2 * m.kv_dim + m.hidden
    return 2.0 * tokens * weights + attention_core_flops(m, tokens)


def attention_core_flops(m: ModelSpec, tokens: int) -> float:
    """QK^T and AV over the full s x s scores: 2·tokens·s·(q/k width + v width), MLA's widths nope+rope and
    v_head_dim."""
    qk = m.heads * (m.head_dim + m.qk_rope_head_dim) if m.kv_lora_rank else m.q_dim
    v = m.heads * (m.v_head_dim or m.head_dim) if m.kv_lora_rank else m.q_dim
    return 2.0 * tokens * m.seq_len * (qk + v)


def mlp_matmul_flops(m: ModelSpec, tokens: int, ffn: int) -> float:
    return 2.0 * tokens * m.hidden * ffn * (3 if m.glu else 2)


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def layer_forward_matmul_flops(m: ModelSpec, tokens: int) -> float:
    """Mean forward matmul FLOPs of one layer: the active experts (top-k), shared experts, router and
    dense-layer MLPs averaged over all layers (Megatron-Core's MoE FLOPs in training.py
    ``num_floating_point_operations`` count top-k experts the same way)."""
    n_moe, n_dense = moe_layer_count(m), dense_layer_count(m)
    moe_mlp = (mlp_matmul_flops(m, tokens, expert_ffn(m)) * (m.moe_topk + m.shared_experts)
               + 2.0 * tokens * router_params(m)) if n_moe else 0.0
    dense_mlp = mlp_matmul_flops(m, tokens, m.ffn_hidden)
    return attention_matmul_flops(m, tokens) + (n_moe * moe_mlp + n_dense * dense_mlp) / m.layers



MOE_YAML_KEYS = {"num_experts", "moe_topk", "moe_ffn_hidden", "shared_experts", "moe_layer_freq", "first_dense_layers",
             "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "rope_scaling",
             "rope_scaling_factor", "mtp_layers"}
"""plantune model YAML keys for the fields above (the ModelSpec field names)."""
MOE_YAML_DEFAULTS = {k: (1 if k == "moe_layer_freq" else 1.0 if k == "rope_scaling_factor" else "" if k == "rope_scaling"
                     else 0) for k in MOE_YAML_KEYS}
"""their defaults: a dense model's YAML leaves them out"""


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq_len: int = 2048,
         **kw: object) -> ModelSpec:
    """A Megatron/GPT-style model: MHA, 4h GELU MLP, LayerNorm, biases, tied embeddings."""
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                     ffn_hidden=4 * hidden, vocab=vocab, seq_len=seq_len, **kw)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
           seq_len: int, **kw: object) -> ModelSpec:
    """A Llama-style model: RoPE, RMSNorm, SwiGLU, no biases, untied embeddings."""
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                     ffn_hidden=ffn, vocab=vocab, seq_len=seq_len, glu=True, tied_embeddings=False,
                     position="rope", norm="rmsnorm", bias=False, **kw)


_LLAMA3 = dict(rope_theta=500000.0, norm_eps=1e-5)
"""Llama 3's RoPE base (Dubey et al. 2024 Sec. 3.1.1: 500,000) and RMSNorm epsilon (HF config.json rms_norm_eps)"""

# Presets: (shape source, training settings source) in each `source`.
PRESETS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec(name="bloom-176b", layers=70, hidden=14336, heads=112, kv_heads=112, ffn_hidden=57344,
              vocab=250880, seq_len=2048, position="alibi", embedding_norm=True, global_batch=2048,
              rampup=Rampup(start=192, increment=16, samples=9_765_625), train_tokens=366e9,
              source="bigscience tr11-176B-ml.slurm (shape, GBS 2048, rampup 192 16 9765625); "
                     "BLOOM paper arXiv 2211.05100 (176,247,271,424 params, 366B tokens)"),
    _gpt("bigscience-1b3", 24, 2048, 16, vocab=50257, embedding_norm=True, global_batch=512,
         rampup=Rampup(start=32, increment=32, samples=2_000_000), train_tokens=300e9,
         source="bigscience tr3m-1B3-emb-norm-pile.slurm (seed 003: GBS 512, rampup from 32)"),
    _gpt("gpt3-175b", 96, 12288, 96, vocab=50257, global_batch=1536,
         rampup=Rampup(start=16, increment=16, samples=5_859_375), train_tokens=300e9,
         source="Brown et al. 2020 Table 2.1 (shape, 300B tokens); Narayanan et al. 2021 (GBS 1536)"),
    _gpt("mt-nlg-530b", 105, 20480, 128, global_batch=1920,
         rampup=Rampup(start=32, increment=32, samples=5_859_375), train_tokens=270e9,
         source="Smith et al. 2022 arXiv 2201.11990 Sec. 3 (shape; batch 32 -> 1920 over 12B tokens)"),
    _gpt("megatron-1t", 128, 25600, 160, global_batch=3072,
         source="Narayanan et al. 2021 arXiv 2104.04473 Table 1 (1T row: GBS 3072)"),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, global_batch=1024, train_tokens=2e12, norm_eps=1e-5,
           source="Touvron et al. 2023 arXiv 2307.09288 Table 1 (4M-token batch, 2T tokens); HF config.json"),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, global_batch=1024, train_tokens=2e12, norm_eps=1e-5,
           source="Touvron et al. 2023 arXiv 2307.09288 Table 1; HF config.json"),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, global_batch=1024, train_tokens=2e12, norm_eps=1e-5,
           source="Touvron et al. 2023 arXiv 2307.09288 Table 1 (GQA); HF config.json"),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, global_batch=512, train_tokens=15e12, **_LLAMA3,
           source="Llama 3 HF config.json; Dubey et al. 2024 arXiv 2407.21783 (15T tokens)"),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, global_batch=512, train_tokens=15e12, **_LLAMA3,
           source="Llama 3 HF config.json; Dubey et al. 2024 arXiv 2407.21783"),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, global_batch=2048, train_tokens=15.6e12,
           **_LLAMA3,
           source="Dubey et al. 2024 arXiv 2407.21783 Table 3 (shape; 16M-token batch at seq 8192)"),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072, global_batch=128, train_tokens=800e9,
           rope_scaling="llama3", rope_scaling_factor=8.0, **_LLAMA3,
           source="Dubey et al. 2024 arXiv 2407.21783 Table 3 (shape), Table 4 (128K row: 16M tokens a batch), "
                  "Sec. 3.4.2 (~800B long-context tokens); HF Llama-3.1-405B config.json (rope_scaling llama3, 8)"),
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, num_experts=8, moe_topk=2, global_batch=512,
           rope_theta=1e6, norm_eps=1e-5, moe_aux_loss_coeff=0.02,
           source="Jiang et al. 2024 arXiv 2401.04088 Table 1 (shape, 32K context), Sec. 2 (46.7B total, "
                  "12.9B active); HF Mixtral-8x7B-v0.1 config.json; NVIDIA NeMo recipes/mixtral_8x7b.py (GBS 512)"),
    _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536, num_experts=8, moe_topk=2, global_batch=512,
           rope_theta=1e6, norm_eps=1e-5, moe_aux_loss_coeff=0.001,
           source="Mistral AI, Mixtral 8x22B announcement 2024 (141B total, 39B active, 64K context); "
                  "HF Mixtral-8x22B-v0.1 config.json; NVIDIA NeMo recipes/mixtral_8x22b.py (GBS 512)"),
    _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 32768, num_experts=128, moe_topk=8, moe_ffn_hidden=768,
           kv_channels=128, train_tokens=36e12, global_batch=32, rope_theta=1e6, norm_eps=1e-6, qk_norm="head",
           moe_aux_loss_coeff=0.001,
           source="Qwen3 Technical Report arXiv 2505.09388 Table 2 (48 layers, 32/4 heads, 128 experts, 8 active; "
                  "30.5B total, 3.3B active; 36T tokens); HF Qwen3-30B-A3B config.json (head_dim 128, "
                  "moe_intermediate_size 768); NVIDIA NeMo recipes/qwen3_30b_a3b.py (GBS 32, one node)"),
    _llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096, num_experts=256, moe_topk=8, moe_ffn_hidden=2048,
           shared_experts=1, first_dense_layers=3, kv_channels=128, q_lora_rank=1536, kv_lora_rank=512,
           qk_rope_head_dim=64, v_head_dim=128, global_batch=15360, train_tokens=14.8e12, mtp_layers=1,
           norm_eps=1e-6, init_std=0.006, moe_score="sigmoid", moe_expert_bias=True, moe_topk_scale=2.5,
           moe_groups=8, moe_group_topk=4, moe_aux_loss_coeff=0.0001, moe_seq_aux=True,
           source="DeepSeek-AI 2024 arXiv 2412.19437 Sec. 4.2 (61 layers, h 7168, 128 heads, MLA ranks 1536/512, "
                  "1 shared + 256 routed experts of 2048, top-8, first 3 layers dense; 671B total, 37B active; 1 MTP module "
                  "(Sec. 2.2, 4.2: depth D = 1; 14B more in the HF checkpoint); "
                  "batch 15360 x 4K; 14.8T tokens; init std 0.006; sequence-wise balance loss alpha 0.0001); Sec. "
                  "2.1.2 (sigmoid affinities, bias-based auxiliary-loss-free balancing); HF DeepSeek-V3 config.json "
                  "(routed_scaling_factor 2.5, n_group 8, topk_group 4, rms_norm_eps 1e-6)"),
)}

HUB_IDS: dict[str, str] = {
    "bloom-176b": "bigscience/bloom", "llama2-7b": "meta-llama/Llama-2-7b-hf",
    "llama2-13b": "meta-llama/Llama-2-13b-hf", "llama2-70b": "meta-llama/Llama-2-70b-hf",
    "llama3-8b": "meta-llama/Meta-Llama-3-8B", "llama3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama3.1-405b": "meta-llama/Llama-3.1-405B", "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
}
"""the Hugging Face repository of each preset published with weights (its tokenizer: the launchers' default)"""
PRESETS = {name: replace(m, hub_id=HUB_IDS.get(name, "")) for name, m in PRESETS.items()}

# Size shorthands a person types; `176B` is BLOOM-176B as in BigScience's usage.
SHORTHANDS: dict[str, str] = {
    "176b": "bloom-176b", "bloom": "bloom-176b", "1b3": "bigscience-1b3", "1.3b": "bigscience-1b3",
    "175b": "gpt3-175b", "gpt3": "gpt3-175b", "530b": "mt-nlg-530b", "1t": "megatron-1t",
    "7b": "llama2-7b", "13b": "llama2-13b", "70b": "llama2-70b", "8b": "llama3-8b",
    "405b": "llama3-405b", "mixtral": "mixtral-8x7b", "8x7b": "mixtral-8x7b", "8x22b": "mixtral-8x22b",
    "deepseek": "deepseek-v3", "671b": "deepseek-v3",
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> ModelSpec:
    key = name.strip().lower()
    key = SHORTHANDS.get(key, key)
    if key not in PRESETS:
        raise InputError(f"unknown model {name!r}; presets: {', '.join(preset_names())} "
                         f"(shorthands: {', '.join(sorted(SHORTHANDS))}), or a path to a "
                         "config.json / model YAML")
    return PRESETS[key]


# RoPE base (the rules judge it, the emitters write it)
DEFAULT_ROPE_THETA = 10000.0
"""RoFormer's RoPE base (Su et al. 2021), Megatron's --rotary-base default: for a model that states none"""


def rope_theta(model: ModelSpec) -> float:
    """The model's RoPE base (ModelSpec.rope_theta: the file's, or the preset's), else RoFormer's 10,000."""
    return float(model.rope_theta or DEFAULT_ROPE_THETA)


HF_DEFAULT_SEQ_LEN = 4096
"""training length assumed for a HF config.json that does not say it: Llama 2's pretraining context
(Touvron et al. 2023, Table 1); max_position_embeddings is the context limit, not a run's length"""
HF_SEQ_NOTE = "set --seq-len to your run's length"


POSITIONS_RAISED = "max_position_embeddings raised"
"""what a model's source says when --seq-len went past its positions (planner.model.at_seq_len)"""


def at_seq_len(model: ModelSpec, seq_len: int | None) -> ModelSpec:
    """The model for a run of ``seq_len`` tokens (--seq-len; None: the model's own). A config.json's assumed training
    length becomes the run's; positions the model lacks are raised to ``seq_len``, as a run trained from scratch at
    that length has them (its source says so, and `plan` prints it), so that plan and emit agree; a learned position
    table (GPT-2) is refused instead: its rows are weights of that many positions."""
    if seq_len is None:
        return model
    positions = model.positions
    if seq_len > positions and model.position == "learned":
        raise InputError(f"--seq-len {seq_len} is over {model.name}'s {positions} learned positions (a table of "
                         f"{positions} rows in its weights); use --seq-len <= {positions}")
    if HF_SEQ_NOTE in model.source and "; seq_len " in model.source:   # the run's length, no longer an assumption
        source = model.source[:model.source.rindex("; seq_len ")] + f"; seq_len {seq_len} from --seq-len"
        model = replace(model, seq_len=seq_len, max_positions=positions if positions > seq_len else 0, source=source)
    if seq_len > positions:
        model = replace(model, max_positions=seq_len, source=(
            f"{model.source}; {POSITIONS_RAISED} from {positions} to {seq_len} for --seq-len {seq_len} (a run "
            "trained from scratch at that length; fine-tuning the published weights this long needs RoPE scaling)"))
    return model


def positions_note(model: ModelSpec) -> str | None:
    """The one line `plan` prints when at_seq_len raised the model's positions; None otherwise."""
    at = model.source.find(POSITIONS_RAISED)
    return None if at < 0 else f"{model.name}: {model.source[at:]}"


def _from_hf(d: dict, name: str) -> ModelSpec:
    """Hugging Face config.json of a family in ``hf_config.HF_FAMILIES``; every key is understood or refused."""
    from planner.hf_config import read_hf   # here: a preset (every `plan --model NAME`) never reads a config.json

    return ModelSpec(**read_hf(d, name, HF_DEFAULT_SEQ_LEN, HF_SEQ_NOTE))


def _from_yaml(d: dict, name: str) -> ModelSpec:
    """plantune model YAML: name, layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, ..."""
    check_model_yaml(d, f"model YAML {name}", tuple(f.name for f in dataclass_fields(ModelSpec)))
    d = dict(d)
    d.setdefault("kv_heads", d["heads"])
    d.setdefault("ffn_hidden", 4 * d["hidden"])
    if d.get("rampup") is not None:
        start, increment, samples = d["rampup"]
        d["rampup"] = Rampup(start=start, increment=increment, samples=samples)
    d["source"] = d.get("source") or f"model YAML {name}"
    return ModelSpec(**d)


def load_model(arg: str) -> ModelSpec:
    """A preset name or shorthand, a HF config.json, a folder holding one (a downloaded snapshot), a repository id
    found in the local Hugging Face cache (planner.hf_cache), or a plantune model YAML."""
    path = Path(arg)
    if path.is_dir() and path.suffix.lower() not in (".json", ".yaml", ".yml"):
        if not (path / "config.json").is_file():
            raise InputError(f"model folder {arg} holds no config.json; give a Hugging Face model folder (with its "
                             "config.json), a config.json, a model YAML or a preset")
        path = path / "config.json"
        return _from_hf(read_mapping(path, "model file"), str(path))
    if REPO_ID.match(arg) and not path.exists() and path.suffix.lower() not in (".json", ".yaml", ".yml"):
        path = cached_config(arg)
        return _from_hf(read_mapping(path, "model file"), str(path))
    if path.suffix.lower() in (".json", ".yaml", ".yml") or path.is_file() or ("/" in arg and path.exists()):
        data = read_mapping(path, "model file", missing_hint=f"; give a preset ({', '.join(preset_names())}) "
                                                             "or an existing config.json / model YAML")
        return _from_hf(data, arg) if path.suffix.lower() == ".json" else _from_yaml(data, arg)
    return get_preset(arg)


def model_to_yaml_dict(model: ModelSpec) -> dict:
    """The plantune model YAML for a spec (inverse of the YAML reader)."""
    d = model.to_dict()
    defaults = {**MOE_YAML_DEFAULTS, **FACT_YAML_DEFAULTS}
    return {k: v for k, v in d.items() if v is not None and v != "" and defaults.get(k, ...) != v}


__all__ = ["ModelSpec", "POSITIONS_RAISED", "Rampup", "PRESETS", "SHORTHANDS", "at_seq_len", "get_preset",
           "load_model", "model_to_yaml_dict", "positions_note", "preset_names"]
