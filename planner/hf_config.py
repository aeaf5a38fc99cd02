"""Hugging Face config.json as the hubs publish them: one row per ``model_type``, every key read or refused.

A table rather than ``transformers``' config classes: with transformers 5.24.0 (and torch, which it then imports)
``AutoConfig.for_model("llama")`` takes 2.1 s on this project's machine (`python -c "import time; t=time.perf_counter();
from transformers import AutoConfig; AutoConfig.for_model('llama'); print(time.perf_counter()-t)"`, three runs
2.09-2.10 s), ten times what a whole `plan` may take, and pulls torch into `plan`. Each family's defaults below are its
transformers config class's (``configuration_<type>.py``), so a file that leaves a key out reads as transformers reads
it. A key that is neither read nor known to leave the model alone stops the reader: dropping it could plan a different
model (Mixtral's experts planned as a dense 7B).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.errors import InputError
from planner.hf_cache import REPO_ID, repo_of_snapshot
from planner.schema import Any, Bool, Field, Int, List, Num, Str, _WHY_SHAPE, _short, check, did_you_mean


@dataclass(frozen=True, slots=True, kw_only=True)
class HFFamily:
    """What a config.json's ``model_type`` implies beyond its numbers (its transformers config class's defaults)."""

    glu: bool
    tied: bool
    """tie_word_embeddings when the file does not say"""
    position: str
    norm: str
    bias: bool
    source: str
    embedding_norm: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    activation: str = ""
    """when the file names none"""
    head_dim: int | None = None
    """head width when the file gives none (Gemma: 256, Qwen3: 128); None = hidden / heads"""
    facts: dict = field(default_factory=dict)
    """ModelSpec facts the architecture fixes (Qwen2: qkv_bias; Qwen3: qk_norm "head"; OLMo 2: post norms)"""
    moe: dict = field(default_factory=dict)
    """expert settings when the file does not say (the config class's defaults)"""
    defaults: dict = field(default_factory=dict)
    """keys the config class fills in when the file leaves them out, under the file's key names (FalconConfig: 2048
    positions; Gemma3TextConfig: 8 heads, 4 KV heads, 262,208 tokens: Gemma 3's published text_configs give little
    more than hidden_size, intermediate_size and num_hidden_layers)"""


_LLAMA = dict(glu=True, tied=False, position="rope", norm="rmsnorm", bias=False, activation="silu")
_GEMMA = dict(_LLAMA, tied=True, activation="gelu_tanh", head_dim=256)
_DEEPSEEK = dict(norm_topk=False, aux=0.001, seq_aux=True)
"""DeepSeek's own configuration_deepseek.py (the files' auto_map) defaults: aux_loss_alpha 0.001, seq_aux true"""
HF_FAMILIES: dict[str, HFFamily] = {
    "llama": HFFamily(**_LLAMA, source="transformers LlamaConfig (SwiGLU, RMSNorm, RoPE, no biases)"),
    "mistral": HFFamily(**_LLAMA, facts={"sliding_window": 4096},
                        source="transformers MistralConfig (Llama shape, sliding window 4096 unless null)"),
    "mixtral": HFFamily(**_LLAMA, rope_theta=1e6, norm_eps=1e-5, moe={"aux": 0.001},
                        source="transformers MixtralConfig (Llama shape, top-k routed SwiGLU experts)"),
    "qwen2": HFFamily(**_LLAMA, facts={"qkv_bias": True},
                      source="transformers Qwen2Config (Llama shape, q/k/v biases: Qwen2Attention)"),
    "qwen2_moe": HFFamily(**_LLAMA, facts={"qkv_bias": True, "moe_shared_gate": True},
                          moe={"experts": 60, "topk": 4, "ffn": 1408, "shared_ffn": 5632, "aux": 0.001,
                               "norm_topk": False},
                          source="transformers Qwen2MoeConfig (q/k/v biases, routed experts, a gated shared expert)"),
    "qwen3": HFFamily(**_LLAMA, head_dim=128, facts={"qk_norm": "head"},
                      source="transformers Qwen3Config (Llama shape, head_dim 128, per-head q/k RMSNorm)"),
    "qwen3_moe": HFFamily(**_LLAMA, facts={"qk_norm": "head"}, moe={"experts": 128, "topk": 8, "ffn": 768,
                                                                    "aux": 0.001, "norm_topk": False},
                          source="transformers Qwen3MoeConfig (Qwen3 attention, routed experts)"),
    "gemma": HFFamily(**_GEMMA, source="transformers GemmaConfig (GeGLU, tied, head_dim 256)"),
    "gemma2": HFFamily(**_GEMMA, facts={"norm_placement": "sandwich", "attn_softcap": 50.0, "logit_softcap": 30.0,
                                        "sliding_window": 4096, "window_full_every": 2},
                       source="transformers Gemma2Config (GeGLU, sandwich norms, soft-capping, every other layer "
                              "windowed)"),
    "gemma3_text": HFFamily(**{**_GEMMA, "rope_theta": 1e6}, facts={"norm_placement": "sandwich", "qk_norm": "head",
                                                                     "sliding_window": 4096, "window_full_every": 6},
                            defaults={"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                                      "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                                      "max_position_embeddings": 131_072, "initializer_range": 0.02},
                            source="transformers Gemma3TextConfig (GeGLU, sandwich norms, per-head q/k norm, 5 "
                                   "windowed layers to 1 global)"),
    "phi3": HFFamily(**_LLAMA, norm_eps=1e-5, source="transformers Phi3Config (Llama shape, fused qkv/gate_up)"),
    "olmo2": HFFamily(**_LLAMA, norm_eps=1e-5, facts={"qk_norm": "full", "norm_placement": "post"},
                      source="transformers Olmo2Config (norms after attention and MLP, q/k RMSNorm over all heads)"),
    "deepseek_v2": HFFamily(**_LLAMA, moe=_DEEPSEEK,
                            source="transformers DeepseekV2Config (multi-latent attention, shared + routed experts)"),
    "deepseek_v3": HFFamily(**_LLAMA, moe=_DEEPSEEK,
                            source="transformers DeepseekV3Config (multi-latent attention, shared + routed experts)"),
    "gpt2": HFFamily(glu=False, tied=True, position="learned", norm="layernorm", bias=True, norm_eps=1e-5,
                     activation="gelu_tanh", source="transformers GPT2Config (n_inner null = 4 x n_embd)"),
    "gpt_neox": HFFamily(glu=False, tied=False, position="rope", norm="layernorm", bias=True, norm_eps=1e-5,
                         activation="gelu", facts={"parallel_residual": True, "rotary_percent": 0.25},
                         source="transformers GPTNeoXConfig (parallel residual, partial rotary)"),
    "bloom": HFFamily(glu=False, tied=True, position="alibi", norm="layernorm", bias=True, embedding_norm=True,
                      norm_eps=1e-5, activation="gelu_tanh",
                      source="transformers BloomConfig (ALiBi, embedding LayerNorm, BloomGelu: tanh GELU)"),
    "falcon": HFFamily(glu=False, tied=True, position="rope", norm="layernorm", bias=False, norm_eps=1e-5,
                       activation="gelu", facts={"parallel_residual": True}, defaults={"max_position_embeddings": 2048},
                       source="transformers FalconConfig (parallel attention, multi-query, 4h GELU MLP; Falcon-7B's "
                              "one shared input norm per layer counted as two)"),
}
"""the config.json families plantune reads; a new family is one row (and its keys below)"""

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
"""transformers ACT2FN names -> plantune's (gelu_new, gelu_fast, gelu_pytorch_tanh: the tanh approximation)"""

_SHAPE_INT = Int(1, 16_777_216, why=_WHY_SHAPE)
HF_KEYS: dict[str, Field] = {
    "model_type": Str(required=True, what="a model_type plantune reads (" + ", ".join(HF_FAMILIES) + ")"),
    # the model class's name: plantune keeps the first one in the spec (ModelSpec.architecture)
    "architectures": List(Str(), null=True, what="a list of model class names (e.g. [\"LlamaForCausalLM\"])"),
    **{k: _SHAPE_INT for k in ("hidden_size", "n_embd", "n_embed", "d_model", "num_attention_heads", "n_head",
                               "n_heads", "num_hidden_layers", "n_layer", "num_layers", "vocab_size",
                               "intermediate_size", "ffn_dim", "max_position_embeddings", "n_positions", "n_ctx",
                               "seq_length")},
    "num_key_value_heads": Int(1, 16_777_216, null=True), "num_kv_heads": Int(1, 16_777_216, null=True),
    "n_inner": Int(1, 16_777_216, null=True), "head_dim": Int(1, 16_777_216, null=True),
    "tie_word_embeddings": Bool(), "attention_bias": Bool(), "mlp_bias": Bool(), "bias": Bool(),
    "hidden_act": Str(null=True), "hidden_activation": Str(null=True), "activation_function": Str(null=True),
    "rope_theta": Num(0, open_lo=True), "rotary_emb_base": Num(0, open_lo=True), "rope_scaling": Any(),
    "rope_parameters": Any(), "rotary_pct": Num(0, 1, open_lo=True), "partial_rotary_factor": Num(0, 1, open_lo=True),
    "rms_norm_eps": Num(0, open_lo=True), "layer_norm_eps": Num(0, open_lo=True),
    "layer_norm_epsilon": Num(0, open_lo=True), "initializer_range": Num(0, open_lo=True),
    "sliding_window": Int(1, None, null=True), "use_sliding_window": Bool(), "max_window_layers": Int(0, None),
    "sliding_window_size": Int(1, None, null=True),   # the same fact as sliding_window (HF_SAME_FACT)
    "sliding_window_pattern": Int(1, None, null=True), "layer_types": Any(),
    "use_parallel_residual": Bool(), "parallel_attn": Bool(), "multi_query": Bool(),
    "new_decoder_architecture": Bool(), "alibi": Bool(), "apply_residual_connection_post_layernorm": Bool(),
    "use_mrope": Bool(), "attn_logit_softcapping": Num(0, null=True), "final_logit_softcapping": Num(0, null=True),
    # mixture of experts and multi-latent attention (hf_fields)
    **{k: Int(0, 1_000_000) for k in ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                      "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
                                      "moe_layer_freq", "decoder_sparse_step", "first_k_dense_replace",
                                      "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
    "q_lora_rank": Int(0, 1_000_000, null=True), "kv_lora_rank": Int(0, 1_000_000, null=True),
    "router_aux_loss_coef": Num(0), "aux_loss_alpha": Num(0), "norm_topk_prob": Bool(),
    "routed_scaling_factor": Num(0, open_lo=True), "scoring_func": Str(), "topk_method": Str(),
    "n_group": Int(1, 1_000_000, null=True), "topk_group": Int(1, 1_000_000, null=True), "seq_aux": Bool(),
    "mlp_only_layers": Any(),
    # DeepSeek-V3's multi-token-prediction module is not part of its 671B (the report's count excludes it)
    "num_nextn_predict_layers": Int(0, 1_000),
    # change neither the trained network, nor what plantune counts, nor an emitted flag
    "output_router_logits": Bool(), "router_jitter_noise": Num(0), "ep_size": Int(1, 1_000_000),
    "original_max_position_embeddings": Int(1, None),
    # Gemma 2/3's attention scale (query_pre_attn_scalar^-0.5: 168 on Gemma 3 27B, not its head width 128) and Gemma
    # 3's RoPE base on its windowed layers: they change the network but not what plantune counts, and no emitter
    # writes a Gemma (each refuses its norm placement and GeGLU, planner.model_facts.unexpressed)
    "query_pre_attn_scalar": Num(0, null=True), "rope_local_base_freq": Num(0, open_lo=True),
}
"""config.json keys plantune reads or knows to leave the model alone, with their types"""

HF_INERT = frozenset((
    "auto_map", "torch_dtype", "dtype", "transformers_version", "use_cache", "pretraining_tp",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "slow_but_exact",
    "offset_alibi", "masked_softmax_fusion", "skip_bias_add", "skip_bias_add_qkv", "bias_dropout_fusion",
    "attention_softmax_in_fp32", "task_specific_params", "id2label", "label2id", "tokenizer_class", "problem_type",
    "finetuning_task", "prefix", "max_length", "output_attentions", "output_hidden_states", "return_dict",
    "use_return_dict", "tie_encoder_decoder", "quantization_config", "attn_implementation", "bos_token_id",
    "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id", "cache_implementation",
    "use_bidirectional_attention",
))
"""metadata keys that do not describe the network (any value); names ending in _dropout/_pdrop also pass"""

HF_SAME_FACT = {"sliding_window_size": "sliding_window"}
"""keys that name a fact the reader already has under another name (older transformers wrote both: Gemma-2-9B's and
-27B's first config.json carry ``sliding_window_size`` beside ``sliding_window``, Gemma2Config reads the latter);
read when they agree, refused in one line when they do not"""

HF_UNREAD = {"dbrx": "DBRX's experts", "olmoe": "OLMoE's experts", "gemma3": "Gemma 3's vision tower (give the "
             "text_config part as a gemma3_text config.json)", "qwen2_vl": "Qwen2-VL's vision tower and M-RoPE"}
"""model types plantune does not read, and why"""


HF_LEGACY = ("RefinedWeb", "RefinedWebModel")
"""tiiuae's first Falcon model types (May 2023: RWForCausalLM, trust_remote_code configuration_RW.RWConfig), read as
transformers' falcon. Falcon-7B's files (RefinedWeb, then RefinedWebModel) say multi_query: one key/value head, one
shared input norm. Falcon-40B's (RefinedWeb) gives n_head_kv instead: its own modelling_RW.py runs n_head_kv key/value
groups with two norms per layer, FalconConfig's new_decoder_architecture (vLLM's RWConfig,
vllm/transformers_utils/configs/falcon.py, keys that on the 40B's hidden size 8192)."""


def _from_legacy(d: dict) -> dict:
    """A RefinedWeb / RefinedWebModel file under FalconConfig's names (HF_LEGACY); any other file unchanged."""
    if d.get("model_type") not in HF_LEGACY:
        return d
    out = {**{k: v for k, v in d.items() if k != "n_head_kv"}, "model_type": "falcon"}
    if d.get("n_head_kv") is not None:
        out.update(num_kv_heads=d["n_head_kv"], new_decoder_architecture=True)
    return out


def _inert(key: str) -> bool:
    return key in HF_INERT or key.startswith("_") or key.endswith(("_dropout", "_pdrop", "dropout_prob")) \
        or key.startswith("summary_")


def check_hf(data: dict, where: str) -> str:
    """A HF config.json checked key by key; returns its model_type (a key of HF_FAMILIES)."""
    if not isinstance(data.get("model_type"), str):
        check(data, {"model_type": HF_KEYS["model_type"]}, where, unknown="keep")
    model_type = data["model_type"]
    if model_type in HF_UNREAD:
        raise InputError(f"{where}: model_type {model_type} is not read ({HF_UNREAD[model_type]}); write a plantune "
                         "model YAML with its shape (see examples/model-tiny.yaml)")
    if model_type not in HF_FAMILIES:
        raise InputError(f"{where}: model_type {_short(model_type)} is not one plantune reads ("
                         f"{', '.join(HF_FAMILIES)}); write a plantune model YAML with its shape "
                         "(see examples/model-tiny.yaml)")
    for key, same in HF_SAME_FACT.items():
        if key in data and same in data and data[key] != data[same]:
            raise InputError(f"{where}: {key} {_short(data[key])} and {same} {_short(data[same])} name one fact and "
                             f"disagree; keep {same} (what transformers reads) and remove {key}")
    for key in data:
        if isinstance(key, str) and key not in HF_KEYS and not _inert(key):
            raise InputError(f"{where}: key {key!r} is not understood and may change the model"
                             f"{did_you_mean(key, HF_KEYS)}; plantune does not plan what it cannot read: "
                             "remove the key if it leaves the shape alone, or write a plantune model YAML")
    check(data, HF_KEYS, where, unknown="keep")
    return model_type


def _refuse(where: str, what: str) -> InputError:
    return InputError(f"{where}: {what} is not read (it changes the model); write a plantune model YAML that says "
                      "what plantune can plan, or remove the key")


def _rope(d: dict, fam: HFFamily, where: str) -> dict:
    """rope_theta and rope_scaling (transformers <= 4.x) or rope_parameters (5.x): Llama 3.1's llama3 scaling with
    Megatron's and torchtitan's fixed 1/4/8192 (megatron/core/models/common/embeddings/rope_utils.py
    apply_rope_scaling; torchtitan RoPEScalingArgs), YaRN with Megatron MLA's beta 32/1 and 4,096 original positions
    (MLATransformerConfig), linear interpolation by an integer factor (Megatron
    --rotary-seq-len-interpolation-factor)."""
    params = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    scaling = d.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    theta = d.get("rope_theta") or d.get("rotary_emb_base") or params.get("rope_theta") or fam.rope_theta
    out: dict = {"rope_theta": float(theta)}
    if d.get("rope_scaling") is not None and not isinstance(d["rope_scaling"], dict):
        raise InputError(f"{where}: rope_scaling must be a mapping or null, got {_short(d['rope_scaling'])}")
    if not scaling:
        return out
    kind = str(scaling.get("rope_type") or scaling.get("type") or "")
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 1:
        raise _refuse(where, f"rope_scaling {_short(scaling)} (no factor >= 1)")
    expect = {"llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
              "yarn": {"beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096},
              "linear": {}}
    if kind not in expect:
        raise _refuse(where, f"rope_scaling type {kind!r} (plantune reads {', '.join(expect)})")
    for k, v in expect[kind].items():
        if scaling.get(k, v) != v:
            raise _refuse(where, f"rope_scaling {kind} with {k} {scaling[k]} (the frameworks fix it at {v})")
    if kind == "linear" and factor != int(factor):
        raise _refuse(where, f"rope_scaling linear by {factor} (Megatron takes a whole factor)")
    out.update(rope_scaling=kind, rope_scaling_factor=float(factor))
    if kind == "yarn":
        out.update(yarn_mscale=float(scaling.get("mscale", 1.0)),
                   yarn_mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)))
    return out


def _window(d: dict, fam: HFFamily, layers: int, where: str) -> dict:
    """Sliding-window attention: Mistral's on every layer, Gemma 2/3's on all but every n-th (layer_types or
    sliding_window_pattern), Qwen's only with use_sliding_window (refused: from max_window_layers on)."""
    if "use_sliding_window" in d or "max_window_layers" in d:   # Qwen2/Qwen3: off unless use_sliding_window
        if d.get("use_sliding_window"):
            raise _refuse(where, "use_sliding_window true (a window from layer max_window_layers on)")
        return {}
    window = d.get("sliding_window", fam.facts.get("sliding_window", 0)) or 0
    if not window:
        return {"sliding_window": 0, "window_full_every": 0}
    every = fam.facts.get("window_full_every", 0)
    if d.get("sliding_window_pattern"):
        every = d["sliding_window_pattern"]
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise InputError(f"{where}: layer_types must list one attention type for each of the {layers} layers")
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        every = full[0] + 1 if full else 0
        if [t == "full_attention" for t in types] != [(i + 1) % every == 0 if every else False for i in range(layers)]:
            raise _refuse(where, "layer_types other than a full-attention layer every n layers")
    if every == 1:   # every layer attends in full
        return {"sliding_window": 0, "window_full_every": 0}
    return {"sliding_window": int(window), "window_full_every": int(every)}


def _moe_router(d: dict, fam: HFFamily, where: str) -> dict:
    """Load balancing and routing: router_aux_loss_coef (Mixtral, Qwen) / aux_loss_alpha with seq_aux (DeepSeek),
    softmax or sigmoid scores, norm_topk_prob, routed_scaling_factor, group-limited and aux-loss-free routing."""
    m = fam.moe
    out = {"moe_aux_loss_coeff": float(d.get("router_aux_loss_coef", d.get("aux_loss_alpha", m.get("aux", 0.0)))),
           "moe_seq_aux": bool(d.get("seq_aux", m.get("seq_aux", False))),
           "moe_norm_topk": bool(d.get("norm_topk_prob", m.get("norm_topk", True))),
           "moe_topk_scale": float(d.get("routed_scaling_factor") or 1.0),
           "moe_score": str(d.get("scoring_func", "softmax"))}
    if out["moe_score"] not in ("softmax", "sigmoid"):
        raise _refuse(where, f"scoring_func {out['moe_score']!r}")
    method = d.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise _refuse(where, f"topk_method {method!r}")
    if method != "greedy" and d.get("n_group"):
        out.update(moe_groups=int(d["n_group"]), moe_group_topk=int(d.get("topk_group") or 1))
    out["moe_expert_bias"] = method == "noaux_tc"
    if d.get("mlp_only_layers"):
        raise _refuse(where, f"mlp_only_layers {_short(d['mlp_only_layers'])} (dense layers among the MoE layers)")
    return out


def hf_fields(d: dict) -> dict:
    """MoE, MLA, explicit head_dim and rope-scaling keys of a Hugging Face config.json:
    MixtralForCausalLM (num_local_experts, num_experts_per_tok), Qwen3MoeForCausalLM (num_experts,
    moe_intermediate_size, decoder_sparse_step, head_dim), DeepseekV3ForCausalLM (n_routed_experts,
    n_shared_experts, first_k_dense_replace, moe_layer_freq, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim), and rope_scaling {rope_type|type, factor} (Llama 3.1, YaRN)."""
    out: dict = {}
    experts = d.get("num_local_experts") or d.get("n_routed_experts") or d.get("num_experts")
    if experts:
        out.update(num_experts=int(experts), moe_topk=int(d.get("num_experts_per_tok") or 2),
                   moe_ffn_hidden=int(d.get("moe_intermediate_size") or d.get("intermediate_size") or 0),
                   shared_experts=int(d.get("n_shared_experts") or 0),
                   moe_layer_freq=int(d.get("moe_layer_freq") or d.get("decoder_sparse_step") or 1),
                   first_dense_layers=int(d.get("first_k_dense_replace") or 0))
        if d.get("shared_expert_intermediate_size") and out["moe_ffn_hidden"]:   # Qwen2-MoE: shared width
            out["shared_experts"] = max(1, round(int(d["shared_expert_intermediate_size"]) / out["moe_ffn_hidden"]))
    if d.get("kv_lora_rank"):
        out.update(kv_lora_rank=int(d["kv_lora_rank"]), q_lora_rank=int(d.get("q_lora_rank") or 0),
                   qk_rope_head_dim=int(d.get("qk_rope_head_dim") or 0), v_head_dim=int(d.get("v_head_dim") or 0),
                   kv_channels=int(d.get("qk_nope_head_dim") or 0) or None)   # MLA's per-head width
    if d.get("num_nextn_predict_layers"):   # DeepseekV3ForCausalLM: the MTP modules
        out["mtp_layers"] = int(d["num_nextn_predict_layers"])
    scaling = d.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("factor"):
        out.update(rope_scaling=str(scaling.get("rope_type") or scaling.get("type") or ""),
                   rope_scaling_factor=float(scaling["factor"]))
    return out


def file_name(path: str, d: dict) -> str:
    """The model's name: the hub id it was saved from, else the folder holding config.json, else the file's stem."""
    p = Path(path)
    if repo_of_snapshot(p.parent):   # models--org--name/snapshots/<commit>/config.json: the repository's name
        return repo_of_snapshot(p.parent).split("/")[-1]
    if d.get("_name_or_path"):
        return str(d["_name_or_path"]).rstrip("/").split("/")[-1]
    return p.parent.name if p.stem == "config" and p.parent.name not in ("", ".") else p.stem


def hub_id(d: dict, path: str = "") -> str:
    """The repository a config.json comes from: the Hugging Face cache snapshot it sits in, else the file's
    ``_name_or_path`` when that is an org/name id; "" otherwise."""
    cached = repo_of_snapshot(Path(path).parent) if path else ""
    name = d.get("_name_or_path")
    return cached or (name if isinstance(name, str) and REPO_ID.match(name) else "")


def read_hf(d: dict, path: str, default_seq_len: int, seq_hint: str) -> dict:
    """ModelSpec fields of a config.json (planner.model builds the spec)."""
    where = f"config.json {path}"
    d = _from_legacy(d)
    model_type = check_hf(d, where)
    d = {**{same: d[key] for key, same in HF_SAME_FACT.items() if key in d and same not in d},
         **{k: v for k, v in d.items() if k not in HF_SAME_FACT}}
    fam = HF_FAMILIES[model_type]
    d = {**fam.defaults, **d}
    if d.get("use_mrope"):
        raise _refuse(where, "use_mrope true (multimodal rotary sections)")
    if d.get("apply_residual_connection_post_layernorm"):
        raise _refuse(where, "apply_residual_connection_post_layernorm true")

    def pick(*keys: str, default: object = None) -> object:
        for k in keys:
            if d.get(k) is not None:
                return d[k]
        if default is None:
            raise InputError(f"{where}: lacks {' / '.join(keys)}; add it from the model's card")
        return default
    hidden = pick("hidden_size", "n_embd", "n_embed", "d_model")
    heads = pick("num_attention_heads", "n_head", "n_heads")
    layers = pick("num_hidden_layers", "n_layer", "num_layers")
    positions = pick("max_position_embeddings", "n_positions", "n_ctx", default=0) or 0
    if d.get("seq_length") is not None:
        seq, seq_note = d["seq_length"], "from its seq_length"
    elif fam.position == "learned" or (model_type == "falcon" and d.get("alibi")):
        if not positions:
            raise InputError(f"{where}: lacks n_positions / max_position_embeddings (the learned position table)")
        seq, seq_note = positions, "from its learned position table (n_positions)"
    else:
        seq = min(positions, default_seq_len) if positions else default_seq_len
        seq_note = (f"assumed, the file gives no training length (max_position_embeddings {positions:,} is the "
                    f"context limit); {seq_hint}")
    kv_heads = d.get("num_key_value_heads") or d.get("num_kv_heads") or heads
    if model_type == "falcon" and not d.get("new_decoder_architecture") and d.get("multi_query", True):
        kv_heads = 1   # FalconConfig: multi_query (default true) = one key/value head
    head_dim = d.get("head_dim") or fam.head_dim
    act_name = d.get("hidden_activation") or d.get("hidden_act") or d.get("activation_function")
    if act_name is not None and act_name not in ACTIVATIONS:
        raise _refuse(where, f"activation {act_name!r} (plantune reads {', '.join(ACTIVATIONS)})")
    activation = ACTIVATIONS[act_name] if act_name else fam.activation
    if model_type.startswith("gemma") and act_name == "gelu":   # Gemma's files say gelu, its code runs tanh GELU
        activation = "gelu_tanh"
    bias = fam.bias or bool(d.get("attention_bias")) or bool(d.get("mlp_bias")) or bool(d.get("bias"))
    position = "alibi" if d.get("alibi") else fam.position
    facts = {k: v for k, v in fam.facts.items() if k not in ("sliding_window", "window_full_every")}
    if "use_parallel_residual" in d or "parallel_attn" in d:
        facts["parallel_residual"] = bool(d.get("use_parallel_residual", d.get("parallel_attn")))
    if d.get("rotary_pct") or d.get("partial_rotary_factor"):
        facts["rotary_percent"] = float(d.get("rotary_pct") or d.get("partial_rotary_factor"))
    for key, name in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "logit_softcap")):
        if key in d:
            facts[name] = float(d[key] or 0.0)
    extra = hf_fields({**{k: v for k, v in _moe_defaults(fam).items() if k not in d}, **d})
    for key in ("rope_scaling", "rope_scaling_factor"):   # read (and checked) by _rope
        extra.pop(key, None)
    if extra.get("num_experts"):
        extra.update(_moe_router(d, fam, where))
    eps = d.get("rms_norm_eps") or d.get("layer_norm_eps") or d.get("layer_norm_epsilon") or fam.norm_eps
    return dict(
        name=file_name(path, d), architecture=str((d.get("architectures") or [""])[0]), hub_id=hub_id(d, path),
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        kv_channels=extra.pop("kv_channels", head_dim if head_dim is not None and head_dim * heads != hidden else None),
        ffn_hidden=pick("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
        vocab=pick("vocab_size"), seq_len=seq, max_positions=positions if positions > seq else 0,
        glu=fam.glu, tied_embeddings=d.get("tie_word_embeddings", fam.tied),
        position=position, norm=fam.norm, bias=bias, embedding_norm=fam.embedding_norm,
        activation=activation, activation_as_ops=act_name in ("gelu_new", "gelu_fast"), norm_eps=float(eps), init_std=float(d.get("initializer_range") or 0.0),
        source=f"Hugging Face config.json ({path}), {fam.source}; seq_len {seq} {seq_note}",
        **facts, **(_rope(d, fam, where) if position == "rope" else {}), **_window(d, fam, layers, where), **extra)


def _moe_defaults(fam: HFFamily) -> dict:
    """The expert keys' class defaults, under the file's key names (Qwen2MoeConfig: 60 experts, top-4, ...)."""
    m = fam.moe
    keys = {"experts": "num_experts", "topk": "num_experts_per_tok", "ffn": "moe_intermediate_size",
            "shared_ffn": "shared_expert_intermediate_size"}
    return {keys[k]: v for k, v in m.items() if k in keys}


__all__ = ["ACTIVATIONS", "HF_FAMILIES", "HF_INERT", "HF_KEYS", "HF_LEGACY", "HF_SAME_FACT", "HFFamily", "check_hf",
           "file_name", "hub_id", "read_hf"]
