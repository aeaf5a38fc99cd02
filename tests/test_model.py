"""Model presets: parameter counts computed from the shape match the published counts."""

from __future__ import annotations

import json

import pytest

from planner.errors import InputError
from planner.model import PRESETS, get_preset, load_model

# (preset, published count, relative tolerance, source)
PUBLISHED = [
    ("bloom-176b", 176_247_271_424, 0.0, "BLOOM paper arXiv 2211.05100 / HF model card: 176,247,271,424"),
    ("llama2-7b", 6_738_415_616, 0.0, "HF meta-llama/Llama-2-7b-hf safetensors index total_size/2"),
    ("llama2-13b", 13_015_864_320, 0.0, "HF meta-llama/Llama-2-13b-hf"),
    ("llama2-70b", 68_976_648_192, 0.0, "HF meta-llama/Llama-2-70b-hf"),
    ("llama3-8b", 8_030_261_248, 0.0, "HF meta-llama/Meta-Llama-3-8B"),
    ("llama3-70b", 70_553_706_496, 0.0, "HF meta-llama/Meta-Llama-3-70B"),
    ("llama3-405b", 405_853_388_800, 0.0, "HF meta-llama/Llama-3.1-405B"),
    ("gpt3-175b", 175e9, 0.005, "Brown et al. 2020 Table 2.1: 175.0B"),
    ("mt-nlg-530b", 530e9, 0.005, "Smith et al. 2022: 530B"),
    ("megatron-1t", 1.008e12, 0.001, "Narayanan et al. 2021 Table 1: 1008B"),
    ("bigscience-1b3", 1.3e9, 0.02, "seed 003: 1.3B"),
    ("llama3.1-405b", 405_853_388_800, 0.0, "HF meta-llama/Llama-3.1-405B (same shape, 128K positions)"),
    ("mixtral-8x7b", 46.7e9, 0.002, "Jiang et al. 2024 arXiv 2401.04088 Sec. 2: 46.7B"),
    ("mixtral-8x22b", 141e9, 0.005, "Mistral AI Mixtral 8x22B announcement: 141B"),
    ("qwen3-30b-a3b", 30.5e9, 0.002, "Qwen3 Technical Report arXiv 2505.09388 Table 2: 30.5B"),
    ("deepseek-v3", 671e9, 0.001, "DeepSeek-V3 report arXiv 2412.19437 Sec. 1: 671B (MTP module excluded)"),
]


@pytest.mark.parametrize("name,count,tol,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_param_count_matches_published(name, count, tol, source):
    params = get_preset(name).params
    assert abs(params - count) <= tol * count, f"{name}: {params:,} vs {count:,.0f} ({source})"


def test_every_preset_is_tested_and_has_training_defaults():
    assert {p[0] for p in PUBLISHED} == set(PRESETS)
    for m in PRESETS.values():
        assert m.global_batch and m.global_batch > 0 and m.source


@pytest.mark.parametrize("short,name", [("176B", "bloom-176b"), ("1B3", "bigscience-1b3"), ("175b", "gpt3-175b"),
                                        ("530B", "mt-nlg-530b"), ("1T", "megatron-1t"), ("405B", "llama3-405b")])
def test_shorthands(short, name):
    assert load_model(short).name == name


def test_unknown_size_lists_presets():
    with pytest.raises(InputError) as err:
        load_model("42B")
    assert "bloom-176b" in str(err.value) and "llama3-405b" in str(err.value) and "\n" not in str(err.value)


def test_hf_config_json_reads_llama(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert m.params == get_preset("llama3-8b").params
    assert m.glu and m.kv_heads == 8 and not m.tied_embeddings


def test_hf_config_json_reads_bloom(tmp_path):
    cfg = {"model_type": "bloom", "n_embed": 14336, "hidden_size": 14336, "n_head": 112, "n_layer": 70,
           "vocab_size": 250880, "seq_length": 2048}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(path)).params == get_preset("176B").params


def test_model_yaml_round_trip(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: tiny\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 2\nffn_hidden: 256\nvocab: 128\n"
                    "seq_len: 32\nglu: true\ntied_embeddings: false\nrampup: [4, 4, 100]\nglobal_batch: 16\n")
    m = load_model(str(path))
    assert (m.layers, m.kv_heads, m.glu, m.rampup.as_list()) == (4, 2, True, [4, 4, 100])


@pytest.mark.parametrize("text,needle", [("name: x\nlayers: [\n", "malformed"),
                                         ("- 1\n- 2\n", "mapping"),
                                         ("name: x\nlayers: 2\n", "missing key hidden"),
                                         ("name: x\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 8\nseq_len: 8\nfoo: 1\n",
                                          "unknown key 'foo'"),
                                         ("name: x\nlayers: -2\nhidden: 64\nheads: 4\nvocab: 8\nseq_len: 8\n",
                                          "layers must be int in [1, 10,000], got -2")])
def test_bad_model_yaml_is_one_clear_error(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_model(str(path))
    assert needle in str(err.value) and "\n" not in str(err.value)
