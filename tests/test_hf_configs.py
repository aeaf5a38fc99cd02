"""Published Hugging Face config.json files (tests/fixtures/hf_configs, sources in its README.md), read by plantune and
emitted for Megatron-LM, Megatron-DeepSpeed (both forks) and torchtitan: every emitted set says what the file says,
or the emit refuses in one line naming what the target cannot express. Parameter counts are held to the published
sizes (model cards; the DeepSeek-V3, Gemma 2 and Gemma 3 reports). Gemma 3's files (4B and up) are
Gemma3ForConditionalGeneration's: plantune refuses them (the vision tower) and reads their text_config, as it tells
the user to.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.emit import RunSetup, render
from planner.emit.facts import torchtitan_model_args
from planner.errors import InputError
from planner.hardware import make_cluster
from planner.hf_config import read_hf
from planner.model import HF_DEFAULT_SEQ_LEN, HF_SEQ_NOTE, ModelSpec, load_model
from planner.space import Candidate, TrainingSpec

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


@dataclass(frozen=True)
class Published:
    file: str
    params: float | None
    """the published total, in parameters"""
    digits: float
    """the precision the size is published to (8.2B: 0.05e9); plantune's count must round to it"""
    source: str
    active: float | None = None
    non_embedding: float | None = None
    """the published count without the (tied) embedding table"""
    non_embedding_digits: float = 0.5
    """its precision (Gemma 2's report gives it to the parameter, Gemma 3's to the million)"""


PUBLISHED = [
    Published("Llama-3.1-8B.json", 8.03e9, 0.005e9, "HF meta-llama/Llama-3.1-8B: 8.03B params (safetensors)"),
    Published("Llama-3.1-70B-Instruct.json", 70.6e9, 0.05e9, "HF meta-llama/Llama-3.1-70B-Instruct: 70.6B params "
              "(safetensors)"),
    Published("Llama-3.2-3B.json", 3.21e9, 0.005e9, "Llama 3.2 model card: 3.21B"),
    Published("Llama-3.2-1B-Instruct.json", 1.24e9, 0.005e9, "HF meta-llama/Llama-3.2-1B-Instruct: 1.24B params"),
    Published("Qwen2.5-3B.json", 3.09e9, 0.005e9, "Qwen2.5-3B model card: 3.09B"),
    Published("Qwen2.5-7B.json", 7.61e9, 0.01e9, "Qwen2.5-7B model card: 7.61B"),
    Published("Qwen2.5-14B.json", 14.7e9, 0.1e9, "Qwen2.5-14B model card: 14.7B"),
    Published("Qwen2.5-32B.json", 32.5e9, 0.3e9, "Qwen2.5-32B model card: 32.5B (the card's own non-embedding 31.0B "
                                                 "+ 1.56B embeddings = 32.6B; plantune 32.76B: within 1%)"),
    Published("Qwen3-4B.json", 4.0e9, 0.05e9, "Qwen3-4B model card: 4.0B"),
    Published("Qwen3-8B.json", 8.2e9, 0.05e9, "Qwen3-8B model card: 8.2B"),
    Published("Qwen3-14B.json", 14.8e9, 0.05e9, "Qwen3-14B model card: 14.8B"),
    Published("Qwen3-32B.json", 32.8e9, 0.05e9, "Qwen3-32B model card: 32.8B"),
    Published("Qwen3-30B-A3B.json", 30.5e9, 0.05e9, "Qwen3-30B-A3B model card: 30.5B, 3.3B activated", active=3.3e9),
    Published("DeepSeek-V3.json", 671e9, 0.5e9, "DeepSeek-V3 report arXiv 2412.19437: 671B (MTP module apart)"),
    Published("phi-4.json", 14.7e9, 0.05e9, "HF microsoft/phi-4: 14.7B params"),
    Published("gemma-2-2b-it.json", 2.61e9, 0.005e9, "HF google/gemma-2-2b-it: 2.61B params; Gemma 2 report "
              "arXiv 2408.00118 Table 2: 2,024,517,888 non-embedding parameters", non_embedding=2_024_517_888),
    Published("gemma-3-4b-it.json", None, 0.5e6, "Gemma 3 report arXiv 2503.19786 Table 1: 3,209M non-embedding "
              "parameters (the 417M vision encoder apart)", non_embedding=3_209e6, non_embedding_digits=0.5e6),
    Published("gemma-3-27b-it.json", None, 0.5e6, "Gemma 3 report arXiv 2503.19786 Table 1: 25,600M non-embedding "
              "parameters (the 417M vision encoder apart)", non_embedding=25_600e6, non_embedding_digits=0.5e6),
    Published("gpt2-large.json", 774e6, 0.5e6, "HF openai-community/gpt2-large model card: the 774M parameter "
              "version of GPT-2"),
    Published("Mixtral-8x7B-v0.1.json", 46.7e9, 0.05e9, "Mistral AI, 'Mixtral of experts' (mistral.ai/news/"
              "mixtral-of-experts): 46.7B total parameters, 12.9B used per token", active=12.9e9),
    Published("Mistral-7B-Instruct-v0.3.json", 7.25e9, 0.005e9, "HF mistralai/Mistral-7B-Instruct-v0.3: 7.25B params"),
    Published("bloom.json", 176_247_271_424, 0.5, "bigscience/bloom model card (README.md, same copy): 176,247,271,424 "
              "parameters, 3,596,615,680 of them embedding parameters", non_embedding=176_247_271_424 - 3_596_615_680),
    Published("gemma-2b-it.json", 2.51e9, 0.005e9, "HF google/gemma-2b-it: 2.51B params; Gemma report arXiv "
              "2403.08295 Table 2: 1,981,884,416 non-embedding parameters (its 524,550,144 embedding parameters count "
              "a 256,128-row table; the file's vocabulary is 256,000)", non_embedding=1_981_884_416),
    Published("falcon-7b.json", 7e9, 0.5e9, "tiiuae/falcon-7b model card (the same copy's README.md): Falcon-7B is "
              "a 7B parameters causal decoder-only model"),
    Published("falcon-40b.json", 41_303_293_952, 0.5, "tiiuae/falcon-40b's checkpoint index (pytorch_model.bin."
              "index.json, same copy): total_size 83,671,941,120 bytes of bfloat16 = 41,835,970,560 stored, less the "
              "tied output head it stores a second time (lm_head.weight, 65,024 x 8,192)"),
]
FILES = sorted(p.name for p in FIXTURES.glob("*.json"))


def _load(name: str) -> tuple[dict, ModelSpec]:
    """The file and plantune's spec; for a Gemma 3 file, its text_config (the language model) and the spec of it."""
    path = FIXTURES / name
    d = json.loads(path.read_text())
    if d["model_type"] == "gemma3":
        return d["text_config"], ModelSpec(**read_hf(d["text_config"], name, HF_DEFAULT_SEQ_LEN, HF_SEQ_NOTE))
    return d, load_model(str(path))


def test_every_fixture_has_a_published_size_and_a_source():
    readme = (FIXTURES / "README.md").read_text()
    assert {p.file for p in PUBLISHED} == set(FILES)
    assert all(f in readme for f in FILES)


@pytest.mark.parametrize("pub", PUBLISHED, ids=lambda p: p.file)
def test_parameters_match_the_published_size(pub):
    _, m = _load(pub.file)
    if pub.params:
        tolerance = max(pub.digits, 0.01 * pub.params) if pub.file == "Qwen2.5-32B.json" else pub.digits
        assert abs(m.params - pub.params) <= tolerance, (m.params, pub.source)
    if pub.non_embedding:
        embedding = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
        assert abs(m.params - embedding - pub.non_embedding) <= pub.non_embedding_digits, (m.params - embedding,
                                                                                           pub.source)
    if pub.active:
        assert abs(m.active_params - pub.active) <= 0.06e9, (m.active_params, pub.source)


# -- what the file says, as plantune reads it ---------------------------------------------------------------------
CLASS_DEFAULTS = {
    # transformers Gemma3TextConfig (models/gemma3/configuration_gemma3.py): Gemma 3's published text_configs leave
    # out all but a few of these
    "gemma3_text": {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
                    "initializer_range": 0.02, "tie_word_embeddings": True, "sliding_window_pattern": 6},
    "gemma2": {"tie_word_embeddings": True},   # Gemma2Config
    "gpt2": {"tie_word_embeddings": True},     # GPT2Config
    "gemma": {"tie_word_embeddings": True},    # GemmaConfig
    "bloom": {"tie_word_embeddings": True},    # BloomConfig
    # Falcon's first files (RWConfig): FalconConfig's 2,048 positions, RoPE base 10,000, tied head; n_head_kv
    # key/value heads (40B), or one (7B: multi_query)
    "RefinedWeb": {"max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": True},
}
"""the transformers config class's value of a key the published file leaves out (tie_word_embeddings is false
for the other families here)"""


def _expected(d: dict) -> dict:
    """The facts every emitted set must carry, straight from the file (the transformers class defaults where the
    file is silent: CLASS_DEFAULTS)."""
    d = {**CLASS_DEFAULTS.get(d["model_type"], {}), **d}
    heads = d.get("num_attention_heads", d.get("n_head"))
    hidden = d.get("hidden_size", d.get("n_embd", d.get("n_embed")))
    head_dim = d.get("head_dim") or d.get("qk_nope_head_dim") or hidden // heads
    scaling = d.get("rope_scaling") or {}
    return {"layers": d.get("num_hidden_layers", d.get("n_layer")), "hidden": hidden, "heads": heads,
            "kv_heads": d.get("num_key_value_heads", d.get("n_head_kv", 1 if d.get("multi_query") else heads)),
            "ffn": d.get("intermediate_size") or d.get("n_inner") or 4 * hidden,   # GPT2Config: n_inner null = 4h
            # BLOOM's ALiBi has no position table: the training length plantune assumes
            "vocab": d["vocab_size"],
            "positions": d.get("max_position_embeddings", d.get("n_positions")) or HF_DEFAULT_SEQ_LEN,
            "theta": float(d.get("rope_theta", 0.0)), "eps": float(d.get("rms_norm_eps", d.get("layer_norm_epsilon"))),
            "tied": d.get("tie_word_embeddings", False), "head_dim": head_dim,
            "qkv_bias": d["model_type"] in ("qwen2", "qwen2_moe"),
            # DeepSeek's MLA normalises its compressed q and kv latents (q_a_layernorm, kv_a_layernorm): Megatron's
            # --qk-layernorm under --multi-latent-attention
            "qk_norm": d["model_type"].startswith("qwen3") or d["model_type"] == "gemma3_text" or "kv_lora_rank" in d,
            "scaling": (scaling.get("rope_type") or scaling.get("type"), float(scaling["factor"])) if scaling else None,
            "experts": d.get("num_experts") or d.get("n_routed_experts"), "topk": d.get("num_experts_per_tok"),
            # DeepSeek-V3's file leaves aux_loss_alpha to its configuration_deepseek.py (auto_map): 0.001
            "aux": d.get("router_aux_loss_coef", d.get("aux_loss_alpha", 0.001)), "init": d["initializer_range"]}


@pytest.mark.parametrize("name", FILES)
def test_the_spec_says_what_the_file_says(name):
    d, m = _load(name)
    e = _expected(d)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.vocab) == (e["layers"], e["hidden"], e["heads"], e["kv_heads"],
                                                                 e["vocab"])
    assert m.ffn_hidden == e["ffn"] and m.head_dim == e["head_dim"] and m.positions == e["positions"]
    assert (m.rope_theta, m.norm_eps, m.tied_embeddings, m.init_std) == (e["theta"], e["eps"], e["tied"], e["init"])
    assert (m.qkv_bias, m.qk_norm == "head" or bool(m.kv_lora_rank)) == (e["qkv_bias"], e["qk_norm"])
    assert ((m.rope_scaling, m.rope_scaling_factor) if m.rope_scaling else None) == e["scaling"]
    assert m.architecture == d.get("architectures", [""])[0] and m.name == name.removesuffix(".json")
    if e["experts"]:
        assert (m.num_experts, m.moe_topk, m.moe_aux_loss_coeff) == (e["experts"], e["topk"], e["aux"])


@pytest.mark.parametrize("name,heads,kv_heads,head_dim", [("gemma-3-4b-it.json", 8, 4, 256),
                                                          ("gemma-3-27b-it.json", 32, 16, 128)])
def test_gemma3_files_are_refused_and_their_text_config_read(name, heads, kv_heads, head_dim):
    """Gemma 3's published 4B and 27B files: the reader refuses the vision model and says to give the text_config.
    That text_config gives little more than hidden, FFN and layer counts, a 1024-token window and linear RoPE
    scaling 8; the rest reads from Gemma3TextConfig's defaults, as transformers reads it (the 4B's 8 heads of 256
    are not hidden / heads)."""
    with pytest.raises(InputError, match="text_config"):
        load_model(str(FIXTURES / name))
    _, m = _load(name)
    assert (m.heads, m.kv_heads, m.head_dim, m.vocab, m.positions) == (heads, kv_heads, head_dim, 262_208, 131_072)
    assert (m.sliding_window, m.window_full_every, m.rope_scaling, m.rope_scaling_factor) == (1024, 6, "linear", 8.0)
    assert m.tied_embeddings and m.qk_norm == "head" and m.norm_placement == "sandwich" and m.init_std == 0.02


def test_mixtral_file_without_a_window_key_reads_as_no_window():
    """Mixtral-8x7B-v0.1's first published config.json has no sliding_window key (a later Hub revision adds
    "sliding_window": null): full attention over the 32,768 positions, not Mistral's 4096-token window."""
    _, m = _load("Mixtral-8x7B-v0.1.json")
    assert (m.sliding_window, m.window_full_every, m.positions) == (0, 0, 32_768)


@pytest.mark.parametrize("name,heads,kv_heads,ffn", [("falcon-7b.json", 71, 1, 18_176),
                                                     ("falcon-40b.json", 128, 8, 32_768)])
def test_falcon_first_files_read_as_falcon(name, heads, kv_heads, ffn):
    """Falcon's first published config.json files (model_type RefinedWeb, RWForCausalLM): the 7B multi-query (one
    key/value head), the 40B n_head_kv 8 key/value heads (the new decoder architecture its own modelling_RW.py runs);
    attention beside the MLP, RoPE, no biases. Refused before ("model_type 'RefinedWeb' is not one plantune reads")."""
    _, m = _load(name)
    assert (m.heads, m.kv_heads, m.ffn_hidden, m.positions) == (heads, kv_heads, ffn, 2048)
    assert (m.parallel_residual, m.position, m.norm, m.bias, m.glu, m.activation) == (True, "rope", "layernorm",
                                                                                      False, False, "gelu")


def test_gemma2_window_soft_caps_and_head_width_are_read():
    _, m = _load("gemma-2-2b-it.json")
    assert (m.sliding_window, m.window_full_every, m.attn_softcap, m.logit_softcap) == (4096, 2, 50.0, 30.0)
    assert (m.activation, m.norm_placement, m.kv_channels) == ("gelu_tanh", "sandwich", 256)


# -- emitted sets ------------------------------------------------------------------------------------------------
def _setup(m: ModelSpec, framework: str) -> RunSetup:
    """8 H100s, TP=1 PP=1 DP=8 (EP=8 for the MoE models), sequence 4096 (GPT-2's 1024 positions: 1024), global
    batch 64."""
    zero = 3 if framework == "fsdp" else 1
    t = TrainingSpec(global_batch=64, seq_len=min(4096, m.positions), framework=framework, precision="bf16",
                     flash_attention=framework != "megatron-deepspeed", zero_options=(zero,))
    c = Candidate(tp=1, pp=1, dp=8, mbs=1, gas=8, zero=zero, recompute="full", ep=8 if m.num_experts else 1)
    return RunSetup(model=m, cluster=make_cluster(gpu="H100", gpus=8), training=t, candidate=c)


def _args(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in text.splitlines()}


def _one(args: dict, flag: str) -> str:
    return args[flag][0]


GEMMA_FACTS = ("norms before and after attention and MLP", "a gated gelu_tanh MLP (GeGLU")
"""what no emitter writes for Gemma 2 and 3 (Gemma 2 adds soft-capped logits)"""


@pytest.mark.parametrize("name", FILES)
def test_megatron_lm_set_carries_the_files_facts(name):
    d, m = _load(name)
    e = _expected(d)
    if d["model_type"].startswith("gemma"):
        refusal = _refusal(m, "megatron-lm")
        # Gemma (1) has GeGLU but pre-norms only
        assert all(what in refusal for what in GEMMA_FACTS[d["model_type"] == "gemma":])
        assert ("before and after" in refusal) == (d["model_type"] != "gemma")
        assert ("soft-capped logits" in refusal) == (d["model_type"] == "gemma2")
        # no other emitter writes these either: the refusal says so instead of pointing at the BigScience fork
        assert "plan without --emit" in refusal and "bigscience" not in refusal
        return
    if d["model_type"] == "bloom":   # ALiBi and the embedding LayerNorm: the BigScience fork's
        refusal = _refusal(m, "megatron-lm")
        assert "ALiBi" in refusal and "layernorm after the word embedding" in refusal and "bigscience" in refusal
        return
    if d.get("parallel_attn"):   # Falcon: attention and MLP side by side, which no emitter writes
        refusal = _refusal(m, "megatron-lm")
        assert "parallel residual" in refusal and "plan without --emit" in refusal
        return
    a = _args(render(_setup(m, "megatron-lm"), "megatron-lm")["args.txt"])
    assert [int(_one(a, f)) for f in ("--num-layers", "--hidden-size", "--num-attention-heads",
                                      "--max-position-embeddings")] == [e["layers"], e["hidden"], e["heads"],
                                                                        e["positions"]]
    assert float(_one(a, "--norm-epsilon")) == e["eps"]
    if d["model_type"] == "gpt2":   # learned positions, LayerNorm, biases, 4h GELU MLP
        assert _one(a, "--position-embedding-type") == "learned_absolute" and "--rotary-base" not in a
        assert _one(a, "--normalization") == "LayerNorm" and "--disable-bias-linear" not in a and "--swiglu" not in a
        # gelu_new is the tanh GELU: Megatron-Core's MLP with biases runs bias_gelu_impl, the tanh form
        # (megatron/core/transformer/mlp.py, fusions/fused_bias_gelu.py), unless --no-bias-gelu-fusion
        assert "--no-bias-gelu-fusion" not in a
    else:
        assert int(_one(a, "--rotary-base")) == e["theta"]
    assert float(_one(a, "--init-method-std")) == e["init"]
    assert ("--untie-embeddings-and-output-weights" in a) == (not e["tied"])
    assert ("--add-qkv-bias" in a) == e["qkv_bias"] and ("--qk-layernorm" in a) == e["qk_norm"]
    assert int(a.get("--num-query-groups", [e["heads"]])[0]) == e["kv_heads"]
    if e["scaling"] and e["scaling"][0] == "llama3":
        assert "--use-rope-scaling" in a and float(_one(a, "--rope-scaling-factor")) == e["scaling"][1]
    elif e["scaling"]:   # DeepSeek-V3's YaRN, as MLA takes it
        assert float(_one(a, "--rotary-scaling-factor")) == e["scaling"][1]
        assert float(_one(a, "--mscale")) == d["rope_scaling"]["mscale"]
        assert float(_one(a, "--mscale-all-dim")) == d["rope_scaling"]["mscale_all_dim"]
    else:
        assert "--use-rope-scaling" not in a and "--rotary-scaling-factor" not in a
    if "kv_lora_rank" in d:
        assert [int(_one(a, f)) for f in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
                                          "--v-head-dim")] == [d["q_lora_rank"], d["kv_lora_rank"],
                                                               d["qk_nope_head_dim"], d["qk_rope_head_dim"],
                                                               d["v_head_dim"]]
    elif e["head_dim"] * e["heads"] != e["hidden"]:
        assert int(_one(a, "--kv-channels")) == e["head_dim"]
    else:
        assert int(_one(a, "--ffn-hidden-size")) == e["ffn"]
    if e["experts"]:
        assert (int(_one(a, "--num-experts")), int(_one(a, "--moe-router-topk"))) == (e["experts"], e["topk"])
        assert int(_one(a, "--moe-ffn-hidden-size")) == d["moe_intermediate_size"]
        assert float(_one(a, "--moe-aux-loss-coeff")) == e["aux"]


def test_deepseek_v3_router_is_emitted_as_published():
    """sigmoid scores, aux-loss-free expert bias (noaux_tc), routed scale 2.5, 8 groups top-4, sequence-wise balance
    loss (seq_aux absent: false), first 3 layers dense, one shared expert."""
    _, m = _load("DeepSeek-V3.json")
    a = _args(render(_setup(m, "megatron-lm"), "megatron-lm")["args.txt"])
    assert _one(a, "--moe-router-score-function") == "sigmoid" and "--moe-router-enable-expert-bias" in a
    assert float(_one(a, "--moe-router-topk-scaling-factor")) == 2.5
    assert (int(_one(a, "--moe-router-num-groups")), int(_one(a, "--moe-router-group-topk"))) == (8, 4)
    assert _one(a, "--moe-layer-freq") == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    assert int(_one(a, "--moe-shared-expert-intermediate-size")) == 2048


def _refusal(m: ModelSpec, kind: str, flavor: str = "bigscience") -> str:
    framework = "fsdp" if kind == "fsdp" else kind
    with pytest.raises(InputError) as err:
        render(_setup(m, framework), kind, flavor=flavor)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_refusals_name_only_emitters_that_write_the_model():
    """BLOOM: only the BigScience fork writes ALiBi and the embedding LayerNorm; Falcon: no emitter writes its
    parallel residual. torchtitan's refusal sent both to --framework megatron-lm, which refuses them too."""
    _, bloom = _load("bloom.json")
    for kind, flavor in (("fsdp", "bigscience"), ("megatron-lm", "bigscience"), ("megatron-deepspeed", "microsoft")):
        refusal = _refusal(bloom, kind, flavor)
        assert "use --framework megatron-deepspeed --emit-flavor bigscience" in refusal
        assert "use --framework megatron-lm" not in refusal
    _, falcon = _load("falcon-40b.json")
    refusal = _refusal(falcon, "fsdp")
    assert "plan without --emit" in refusal and "megatron-lm" not in refusal


@pytest.mark.parametrize("name", FILES)
def test_megatron_deepspeed_microsoft_carries_the_facts_or_refuses(name):
    d, m = _load(name)
    e = _expected(d)
    cannot = {"qwen2": "q/k/v biases", "qwen3": "per-head q/k RMSNorm", "qwen3_moe": "mixture-of-experts",
              "mixtral": "mixture-of-experts", "deepseek_v3": "mixture-of-experts", "gemma2": "soft-capped logits",
              "gemma3_text": "norms before and after", "RefinedWeb": "parallel residual", "gemma": "GeGLU",
              "bloom": "ALiBi positions"}
    cannot = cannot.get(d["model_type"]) or ("RoPE scaling" if e["scaling"] else None)
    if cannot:
        refusal = _refusal(m, "megatron-deepspeed", "microsoft")
        assert cannot in refusal
        if d["model_type"] == "qwen3":   # the fix names the emitter that writes per-head q/k norms
            assert "use --framework megatron-lm" in refusal and "bigscience" not in refusal
        return
    a = _args(render(_setup(m, "megatron-deepspeed"), "megatron-deepspeed", flavor="microsoft")["args.txt"])
    if d["model_type"] == "gpt2":
        assert "--use-rotary-position-embeddings" not in a and "--normalization" not in a
    else:
        assert int(_one(a, "--rotary-position-embeddings-theta")) == e["theta"]
    assert float(_one(a, "--layernorm-epsilon")) == e["eps"]
    assert int(a.get("--num-key-value-heads", [e["heads"]])[0]) == e["kv_heads"]
    assert int(_one(a, "--max-position-embeddings")) == e["positions"]
    assert ("--untie-embeddings-and-output-weights" in a) == (not e["tied"])


@pytest.mark.parametrize("name", FILES)
def test_bigscience_fork_refuses_what_it_cannot_express(name):
    """The BigScience fork has LayerNorm, biases, tied embeddings and a RoPE base fixed at 10,000: of these files only
    GPT-2 and BLOOM (trained with it: ALiBi, the embedding LayerNorm) are models it can train; each refusal says why
    (Falcon's: its parallel residual, which no emitter writes, and its grouped-query attention)."""
    d, m = _load(name)
    if d["model_type"] == "bloom":
        a = _args(render(_setup(m, "megatron-deepspeed"), "megatron-deepspeed", flavor="bigscience")["args.txt"])
        assert [int(_one(a, f)) for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                                          "--pad-vocab-size-to")] == [70, 14336, 112, 57344, 250880]
        assert _one(a, "--position-embedding-type") == "alibi" and "--embed-layernorm" in a
        assert float(_one(a, "--layernorm-epsilon")) == 1e-5 and "--glu-activation" not in a
        return
    if d["model_type"] == "gpt2":
        a = _args(render(_setup(m, "megatron-deepspeed"), "megatron-deepspeed", flavor="bigscience")["args.txt"])
        assert [int(_one(a, f)) for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                                          "--max-position-embeddings")] == [36, 1280, 20, 5120, 1024]
        assert float(_one(a, "--layernorm-epsilon")) == 1e-5 and "--glu-activation" not in a
        assert "--position-embedding-type" not in a or _one(a, "--position-embedding-type") == "absolute"
        return
    refusal = _refusal(m, "megatron-deepspeed", "bigscience")
    assert ("parallel residual" in refusal and "grouped-query" in refusal) if d.get("parallel_attn") else \
        "RMSNorm" in refusal


@pytest.mark.parametrize("name", FILES)
def test_torchtitan_model_args_or_refusal(name):
    d, m = _load(name)
    e = _expected(d)
    # Llama's shape; Mistral's too where its window is null (v0.3)
    llama = d["model_type"] in ("llama", "phi3") or (d["model_type"] == "mistral" and not d.get("sliding_window"))
    expressible = llama and not e["tied"] and e["head_dim"] * e["heads"] == e["hidden"]
    if not expressible:
        refusal = _refusal(m, "fsdp")
        assert "cannot express" in refusal or "kv_channels" in refusal
        # issue 31.5: each fact named (Llama 3.2 1B's tied embeddings were "this architecture")
        assert ("tied input/output embeddings" in refusal) == e["tied"]
        assert ("mixture-of-experts layers" in refusal) == bool(m.num_experts)
        assert ("multi-latent attention" in refusal) == ("kv_lora_rank" in d)
        assert "this architecture" not in refusal
        return
    render(_setup(m, "fsdp"), "fsdp")
    args = torchtitan_model_args(m)
    assert (args["dim"], args["n_layers"], args["n_heads"], args["n_kv_heads"], args["vocab_size"]) == (
        e["hidden"], e["layers"], e["heads"], e["kv_heads"], e["vocab"])
    assert (args["rope_theta"], args["norm_eps"], args["max_seq_len"]) == (e["theta"], e["eps"], e["positions"])
    # torchtitan/models/llama3/model/model.py FeedForward: int(2 * 4 * dim / 3), times ffn_dim_multiplier, rounded up
    # to multiple_of
    hidden = int((args["ffn_dim_multiplier"] or 1) * int(2 * 4 * args["dim"] / 3))
    assert args["multiple_of"] * math.ceil(hidden / args["multiple_of"]) == e["ffn"]
    scaling = args["rope_scaling_args"]["scaling_factor"]
    assert scaling == (e["scaling"][1] if e["scaling"] else 1.0)


def test_emit_takes_the_files_positions_not_a_4096_guess(tmp_path):
    """Issue 21: a config.json with 131,072 positions emits at 8,192 tokens (it refused above 4,096)."""
    _, m = _load("Llama-3.1-8B.json")
    setup = _setup(m, "megatron-lm")
    setup = RunSetup(model=m, cluster=setup.cluster, candidate=setup.candidate,
                     training=TrainingSpec(global_batch=64, seq_len=8192, framework="megatron-lm", precision="bf16"))
    a = _args(render(setup, "megatron-lm")["args.txt"])
    assert (int(_one(a, "--seq-length")), int(_one(a, "--max-position-embeddings"))) == (8192, 131072)
    too_long = RunSetup(model=m, cluster=setup.cluster, candidate=setup.candidate,
                        training=TrainingSpec(global_batch=64, seq_len=262144, framework="megatron-lm"))
    with pytest.raises(InputError, match="131072 positions"):
        render(too_long, "megatron-lm")


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B.json", "DeepSeek-V3.json", "Qwen2.5-7B.json"])
def test_plan_yaml_keeps_every_fact(tmp_path, name):
    """plan.yaml carries the model's facts (plantune.model), so `plan --from plan.yaml --emit` writes the same set."""
    from planner.emit import load_plan_yaml

    _, m = _load(name)
    files = render(_setup(m, "megatron-lm"), "megatron-lm")
    (tmp_path / "plan.yaml").write_text(files["plan.yaml"])
    back = load_plan_yaml(tmp_path / "plan.yaml")
    assert back.model == m
    assert render(back, "megatron-lm")["args.txt"] == files["args.txt"]


def test_a_model_yaml_says_the_facts_too(tmp_path):
    """A plantune model YAML can state what a config.json does: RoPE base, q/k/v biases, QK norm, norm epsilon,
    tied embeddings, soft-capping; the emit carries them or refuses the one it cannot write."""
    import yaml

    doc = {"name": "qwenish", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn_hidden": 1024,
           "vocab": 32000, "seq_len": 4096, "glu": True, "tied_embeddings": False, "position": "rope",
           "norm": "rmsnorm", "bias": False, "rope_theta": 1000000.0, "qkv_bias": True, "qk_norm": "head",
           "norm_eps": 1e-6, "max_positions": 32768}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc))
    m = load_model(str(tmp_path / "m.yaml"))
    a = _args(render(_setup(m, "megatron-lm"), "megatron-lm")["args.txt"])
    assert (a["--rotary-base"], a["--norm-epsilon"], a["--max-position-embeddings"]) == (["1000000"], ["1e-06"],
                                                                                         ["32768"])
    assert "--add-qkv-bias" in a and "--qk-layernorm" in a and "--untie-embeddings-and-output-weights" in a
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**doc, "attn_softcap": 50.0}))
    assert "soft-capped" in _refusal(load_model(str(tmp_path / "m.yaml")), "megatron-lm")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**doc, "qk_norm": "yes"}))
    with pytest.raises(InputError, match="qk_norm must be one of"):
        load_model(str(tmp_path / "m.yaml"))


@pytest.mark.parametrize("preset,theta,eps", [("llama2-7b", 10000, 1e-5), ("llama3-8b", 500000, 1e-5),
                                              ("llama3.1-405b", 500000, 1e-5), ("mixtral-8x7b", 1000000, 1e-5),
                                              ("qwen3-30b-a3b", 1000000, 1e-6), ("deepseek-v3", 10000, 1e-6)])
def test_presets_emit_their_own_rope_base_and_epsilon(preset, theta, eps):
    """The presets state their RoPE base and norm epsilon (each preset's source: the HF config.json of the model);
    the emitter no longer guesses them from the name (Mixtral and Qwen3 went out with 10,000)."""
    from planner.model import get_preset

    a = _args(render(_setup(get_preset(preset), "megatron-lm"), "megatron-lm")["args.txt"])
    assert (int(_one(a, "--rotary-base")), float(_one(a, "--norm-epsilon"))) == (theta, eps)


@pytest.mark.parametrize("source", ["DeepSeek-V3.json", "deepseek-v3"])
def test_mla_emits_the_norms_on_its_latents(source):
    """Issue 31.1: DeepSeek's MLA normalises the compressed q and kv latents (q_a_layernorm, kv_a_layernorm; plantune
    counts them: planner.moe.attention_params). Megatron-Core builds them only with --qk-layernorm beside
    --multi-latent-attention (gpt_layer_specs.py, core_v0.17.1: linear_q_up_proj / linear_kv_up_proj become
    column_parallel_layer_norm_linear when qk_layernorm), as its own DeepSeek-V2-Lite launcher passes
    (examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-V2-Lite.sh)."""
    from planner.model import get_preset

    m = _load(source)[1] if source.endswith(".json") else get_preset(source)
    a = _args(render(_setup(m, "megatron-lm"), "megatron-lm")["args.txt"])
    assert "--multi-latent-attention" in a and "--qk-layernorm" in a
    # a model without MLA or q/k norms gets neither
    _, llama = _load("Llama-3.1-8B.json")
    b = _args(render(_setup(llama, "megatron-lm"), "megatron-lm")["args.txt"])
    assert "--qk-layernorm" not in b and "--multi-latent-attention" not in b


def test_a_key_naming_a_fact_already_read_does_not_stop_the_reader(tmp_path):
    """Issue 31.2: Gemma-2-9B's first config.json carries ``sliding_window_size`` beside ``sliding_window`` (older
    transformers wrote both; Gemma2Config reads sliding_window). Constructed here from the published gemma-2-2b-it
    file with that one key added (no published Gemma-2-9B file is in the fixtures: see their README): it reads as the
    file without it; the key alone reads as the window; the two disagreeing is refused in one line."""
    d = json.loads((FIXTURES / "gemma-2-2b-it.json").read_text())
    plain = load_model(str(FIXTURES / "gemma-2-2b-it.json"))
    path = tmp_path / "gemma-2-2b-it.json"
    path.write_text(json.dumps({**d, "sliding_window_size": d["sliding_window"]}))
    assert load_model(str(path)) == ModelSpec(**{**plain.to_dict(), "rampup": None,
                                                 "source": plain.source.replace(str(FIXTURES / "gemma-2-2b-it.json"),
                                                                                str(path))})
    alone = {k: v for k, v in d.items() if k != "sliding_window"}
    path.write_text(json.dumps({**alone, "sliding_window_size": 2048}))
    assert load_model(str(path)).sliding_window == 2048
    path.write_text(json.dumps({**d, "sliding_window_size": 2048}))
    with pytest.raises(InputError, match=r"sliding_window_size 2048 and sliding_window 4096 name one fact and "
                                         r"disagree; keep sliding_window") as err:
        load_model(str(path))
    assert "\n" not in str(err.value)


QWEN25_TOKENIZER = 151_665
"""Qwen2.5's tokenizer: 151,643 regular tokens and 22 control tokens (Qwen2.5 Technical Report, arXiv 2412.15115,
Sec. 3.1 "Tokenizer"), fewer than its config.json's 152,064 embedding rows"""


def _megatron_rows(argv: dict, tokenizer: int, tp: int) -> int:
    """Megatron's vocab_size_with_padding: the tokenizer's size rounded up to --make-vocab-size-divisible-by x TP."""
    step = int(argv["--make-vocab-size-divisible-by"][0]) * tp
    return -(-tokenizer // step) * step


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_megatron_embedding_has_the_files_rows_for_a_smaller_tokenizer(tp):
    """Issue 31.6: Megatron pads the tokenizer's size, config.json's vocab_size is the embedding's rows. With the
    default divisor 128 Qwen2.5's 151,665 tokens padded to 151,680 rows, and its converted 152,064-row checkpoint
    would not load; the emitted divisor (vocab / TP) lands on 152,064 at every TP, and the header says so."""
    _, m = _load("Qwen2.5-7B.json")
    setup = _setup(m, "megatron-lm")
    setup = RunSetup(model=m, cluster=setup.cluster, training=setup.training,
                     candidate=Candidate(tp=tp, pp=1, dp=8 // tp, mbs=1, gas=64 // (8 // tp), zero=1,
                                         recompute="full", sp=tp > 1))
    files = render(setup, "megatron-lm")
    a = _args(files["args.txt"])
    assert _megatron_rows(a, QWEN25_TOKENIZER, tp) == 152_064 == m.vocab
    if tp == 1:   # what Megatron's default divisor 128 gave
        assert -(-QWEN25_TOKENIZER // 128) * 128 == 151_680
    assert "the embedding has the model's 152064 rows" in files["megatron_args.sh"]


def test_vocabulary_rows_are_said_by_every_emitter():
    """Issue 31.6, each target: the BigScience fork pads GPT-2's 50,257 to 50,304 (a checkpoint must be padded to
    load), torchtitan takes the model's rows as they are."""
    _, gpt2 = _load("gpt2-large.json")
    files = render(_setup(gpt2, "megatron-deepspeed"), "megatron-deepspeed", flavor="bigscience")
    assert "--pad-vocab-size-to 50304" in files["megatron_args.sh"].replace("'", "")
    assert "a checkpoint of the model's 50257 rows loads only with its embedding (and output layer) padded to " \
           "50304 rows" in files["megatron_args.sh"]
    _, mistral = _load("Mistral-7B-Instruct-v0.3.json")
    files = render(_setup(mistral, "megatron-deepspeed"), "megatron-deepspeed", flavor="microsoft")
    assert "--make-vocab-size-divisible-by 32768" in files["args.txt"]
    assert "the embedding has the model's 32768 rows" in files["megatron_args.sh"]
    _, llama = _load("Llama-3.1-8B.json")
    for version in ("0.3.0", "0.2.2"):
        job = render(_setup(llama, "fsdp"), "fsdp", torchtitan_version=version)
        text = job["plantune_torchtitan.py"] if version == "0.3.0" else job["torchtitan.toml"]
        assert "vocab_size 128256, the model's rows (torchtitan does not pad)" in text
