"""Every config.json family plantune reads (planner/hf_config.py), on files constructed here from each family's keys
as its transformers config class names them (small shapes; these are not published files: those are in
tests/fixtures/hf_configs and tests/test_hf_configs.py). What each key means for the spec, the emitted arguments, and
the one-line refusals of targets that cannot express it.
"""

from __future__ import annotations

import json

import pytest

from planner.emit import RunSetup, render
from planner.errors import InputError
from planner.hardware import make_cluster
from planner.hf_config import HF_FAMILIES
from planner.model import load_model
from planner.space import Candidate, TrainingSpec

BASE = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4,
        "intermediate_size": 1024, "vocab_size": 32000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu"}
FAMILIES = {
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
                "rope_theta": 1e6, "sliding_window": None, "output_router_logits": False},
    "qwen2_moe": {"model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
                  "shared_expert_intermediate_size": 1024, "norm_topk_prob": False, "router_aux_loss_coef": 0.001,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False,
                  "max_window_layers": 4},
    "gemma": {"model_type": "gemma", "head_dim": 128, "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"},
    "gemma2": {"model_type": "gemma2", "head_dim": 128, "hidden_activation": "gelu_pytorch_tanh",
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 128,
               "sliding_window": 4096, "cache_implementation": "hybrid"},
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 128, "hidden_activation": "gelu_pytorch_tanh",
                    "sliding_window": 512, "rope_local_base_freq": 10000.0, "rope_theta": 1e6,
                    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                    "attn_logit_softcapping": None, "final_logit_softcapping": None},
    "olmo2": {"model_type": "olmo2", "rope_theta": 500000.0, "attention_bias": False},
    "phi3": {"model_type": "phi3", "partial_rotary_factor": 1.0, "original_max_position_embeddings": 8192,
             "embd_pdrop": 0.0, "resid_pdrop": 0.0, "sliding_window": None},
    "deepseek_v2": {"model_type": "deepseek_v2", "n_routed_experts": 16, "n_shared_experts": 2,
                    "num_experts_per_tok": 6, "moe_intermediate_size": 128, "first_k_dense_replace": 1,
                    "moe_layer_freq": 1, "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
                    "routed_scaling_factor": 16.0, "scoring_func": "softmax", "norm_topk_prob": False,
                    "aux_loss_alpha": 0.001, "seq_aux": True, "kv_lora_rank": 128, "q_lora_rank": 256,
                    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
                    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096}},
    "gpt2": {"model_type": "gpt2", "n_embd": 512, "n_head": 8, "n_layer": 4, "n_positions": 1024,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "gpt_neox": {"model_type": "gpt_neox", "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
                 "layer_norm_eps": 1e-5, "hidden_act": "gelu"},
    "bloom": {"model_type": "bloom", "n_layer": 4, "n_head": 8, "layer_norm_epsilon": 1e-5, "seq_length": 2048},
    "falcon": {"model_type": "falcon", "multi_query": True, "parallel_attn": True, "bias": False, "alibi": False,
               "new_decoder_architecture": False, "layer_norm_epsilon": 1e-5},
}
DROP = {"gpt2": ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "num_key_value_heads",
                 "max_position_embeddings", "rms_norm_eps", "rope_theta", "hidden_act"),
        "bloom": ("num_attention_heads", "num_hidden_layers", "num_key_value_heads", "intermediate_size",
                  "max_position_embeddings", "rms_norm_eps", "rope_theta", "hidden_act"),
        "gpt_neox": ("rms_norm_eps", "rope_theta"), "falcon": ("rms_norm_eps", "num_key_value_heads",
                                                                "intermediate_size", "hidden_act",
                                                                "max_position_embeddings")}


def _model(tmp_path, family: str, **changes):
    own = FAMILIES.get(family, {"model_type": family})
    cfg = {k: v for k, v in BASE.items() if k not in DROP.get(family, ())} | own | changes
    path = tmp_path / f"{family}.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


def _render(m, kind: str = "megatron-lm", flavor: str = "bigscience") -> dict[str, list[str]]:
    framework = "fsdp" if kind == "fsdp" else kind
    t = TrainingSpec(global_batch=64, seq_len=1024, framework=framework, precision="bf16",
                     flash_attention=kind != "megatron-deepspeed")
    c = Candidate(tp=1, pp=1, dp=8, mbs=1, gas=8, zero=3 if kind == "fsdp" else 1, recompute="full",
                  ep=8 if m.num_experts else 1)
    files = render(RunSetup(model=m, cluster=make_cluster(gpu="H100", gpus=8), training=t, candidate=c), kind,
                   flavor=flavor)
    return {line.split()[0]: line.split()[1:] for line in files.get("args.txt", "").splitlines()}


def test_every_family_in_the_table_is_covered_here():
    assert set(FAMILIES) | {"llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3"} == set(HF_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_reads(tmp_path, family):
    m = _model(tmp_path, family)
    assert m.params > 0 and m.architecture in ("", FAMILIES[family].get("architectures", [""])[0])


def test_mistral_window_is_emitted_for_megatron_lm(tmp_path):
    """HF's window of 4096 holds the token and the 4095 before it (masking_utils sliding_window_overlay)."""
    a = _render(_model(tmp_path, "mistral"))
    assert a["--window-size"] == ["4095,0"] and "--window-attn-skip-freq" not in a
    assert "--window-size" not in _render(_model(tmp_path, "mistral", sliding_window=None))
    with pytest.raises(InputError, match="sliding-window attention"):
        _render(_model(tmp_path, "mistral"), "megatron-deepspeed", "microsoft")


def test_mixtral_router_loss_is_the_files(tmp_path):
    """Megatron's --moe-aux-loss-coeff default is 0.0: without the file's 0.02 the router trains unbalanced."""
    a = _render(_model(tmp_path, "mixtral"))
    assert a["--moe-aux-loss-coeff"] == ["0.02"] and a["--moe-router-load-balancing-type"] == ["aux_loss"]
    assert a["--rotary-base"] == ["1000000"]


def test_qwen2_moe_gated_shared_expert_and_unnormalised_top_k(tmp_path):
    m = _model(tmp_path, "qwen2_moe")
    assert (m.shared_experts, m.moe_shared_gate, m.moe_norm_topk, m.qkv_bias) == (4, True, False, True)
    a = _render(m)
    assert "--moe-shared-expert-gate" in a and "--moe-router-pre-softmax" in a and "--add-qkv-bias" in a
    assert a["--moe-shared-expert-intermediate-size"] == ["1024"] and a["--moe-aux-loss-coeff"] == ["0.001"]


def test_gemma_families_are_planned_but_refused_by_every_emitter(tmp_path):
    g2 = _model(tmp_path, "gemma2")
    assert (g2.attn_softcap, g2.logit_softcap, g2.norm_placement) == (50.0, 30.0, "sandwich")
    assert (g2.sliding_window, g2.window_full_every, g2.activation) == (4096, 2, "gelu_tanh")
    g3 = _model(tmp_path, "gemma3_text")
    assert (g3.sliding_window, g3.window_full_every, g3.qk_norm, g3.rope_theta) == (512, 4, "head", 1e6)
    for m, what in ((g2, "soft-capped logits"), (g3, "GeGLU")):
        for kind, flavor in (("megatron-lm", "bigscience"), ("megatron-deepspeed", "microsoft"),
                             ("fsdp", "bigscience")):
            with pytest.raises(InputError, match=what):
                _render(m, kind, flavor)
    # four norms a layer (input, post-attention, pre- and post-feed-forward: Gemma2DecoderLayer)
    assert g2.layer_vector_params - _model(tmp_path, "gemma").layer_vector_params == 2 * 512


def test_olmo2_norms_are_counted_and_refused(tmp_path):
    m = _model(tmp_path, "olmo2")
    assert (m.qk_norm, m.norm_placement, m.rope_theta) == ("full", "post", 500000.0)
    plain = _model(tmp_path, "olmo2", model_type="llama")
    assert m.params - plain.params == 4 * (m.q_dim + m.kv_dim)   # Olmo2Attention q_norm/k_norm, 4 layers
    with pytest.raises(InputError, match="norms after attention and MLP"):
        _render(m)


def test_deepseek_v2_router_and_yarn(tmp_path):
    m = _model(tmp_path, "deepseek_v2")
    a = _render(m)
    assert a["--moe-router-load-balancing-type"] == ["seq_aux_loss"] and "--moe-router-pre-softmax" in a
    assert a["--moe-router-topk-scaling-factor"] == ["16"]
    assert (a["--moe-router-num-groups"], a["--moe-router-group-topk"]) == (["8"], ["3"])
    assert (a["--rotary-scaling-factor"], a["--mscale"], a["--mscale-all-dim"]) == (["40"], ["0.707"], ["0.707"])
    assert "--moe-router-enable-expert-bias" not in a


def test_gpt2_bloom_neox_falcon(tmp_path):
    gpt2 = _model(tmp_path, "gpt2")
    assert (gpt2.position, gpt2.activation, gpt2.seq_len, gpt2.tied_embeddings) == ("learned", "gelu_tanh", 1024, True)
    bloom = _model(tmp_path, "bloom")
    assert (bloom.position, bloom.embedding_norm, bloom.seq_len) == ("alibi", True, 2048)
    neox = _model(tmp_path, "gpt_neox")
    assert (neox.rotary_percent, neox.parallel_residual, neox.tied_embeddings) == (0.25, True, False)
    falcon = _model(tmp_path, "falcon")
    assert (falcon.kv_heads, falcon.parallel_residual, falcon.bias, falcon.positions) == (1, True, False, 2048)
    for m in (neox, falcon):
        with pytest.raises(InputError, match="parallel residual"):
            _render(m)


def test_first_falcon_files_read_as_falcon(tmp_path):
    """tiiuae's May 2023 files (RWConfig, planner.hf_config.HF_LEGACY): Falcon-7B's RefinedWebModel is multi-query (one
    key/value head); a RefinedWeb file with n_head_kv (Falcon-40B's) the new decoder architecture with that many."""
    base = {k: v for k, v in BASE.items() if k not in DROP["falcon"]}
    old = {k: v for k, v in FAMILIES["falcon"].items() if k != "new_decoder_architecture"}
    (tmp_path / "7.json").write_text(json.dumps(base | old | {"model_type": "RefinedWebModel"}))
    (tmp_path / "40.json").write_text(json.dumps(base | old | {"model_type": "RefinedWeb", "n_head_kv": 2}))
    seven, forty = load_model(str(tmp_path / "7.json")), load_model(str(tmp_path / "40.json"))
    assert (seven.kv_heads, forty.kv_heads) == (1, 2)
    assert seven.parallel_residual and forty.parallel_residual and seven.positions == forty.positions == 2048


def test_gpt2_vocabulary_is_padded_as_the_bigscience_fork_requires(tmp_path):
    """The fork's _vocab_size_with_padding (megatron/tokenizer/tokenizer.py) raises "50257 is not divisible by 128"
    for --pad-vocab-size-to 50257; the emit pads GPT-2's vocabulary to 50,304 (a multiple of 128 and of TP)."""
    a = _render(_model(tmp_path, "gpt2", vocab_size=50257), "megatron-deepspeed", "bigscience")
    assert a["--pad-vocab-size-to"] == ["50304"]


@pytest.mark.parametrize("changes,needle", [
    ({"use_mrope": True}, "use_mrope true"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
     "original_max_position_embeddings 32768"),
    ({"hidden_act": "gelu_10"}, "activation 'gelu_10'"),
    ({"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention", "full_attention",
                                                   "sliding_attention"]}, "layer_types"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window true"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": [0]}, "mlp_only_layers"),
    ({"model_type": "deepseek_v3", "topk_method": "sinkhorn", "n_routed_experts": 8, "num_experts_per_tok": 2},
     "topk_method 'sinkhorn'"),
])
def test_keys_that_would_change_the_model_are_refused(tmp_path, changes, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(")) as err:
        _model(tmp_path, "llama" if "model_type" not in changes else changes["model_type"], **changes)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [True, {"": 0}, [3]])
def test_a_malformed_architectures_key_is_one_line(tmp_path, value):
    """Found by tests/test_inputs_fuzz.py: architectures true or {"": 0} was a TypeError / KeyError traceback."""
    with pytest.raises(InputError, match="architectures") as err:
        _model(tmp_path, "llama", architectures=value)
    assert "\n" not in str(err.value)
