"""Issue 11's malformed inputs, one by one: each is answered with one line and exit 2, never a traceback.

Run in-process (planner.cli.main) so the corpus is fast; every case names what it breaks. The base
inputs (tests/inputs_harness.py) are valid and answered with exit 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from inputs_harness import (CALIBRATION_YAML, CLUSTER_YAML, HF_CONFIG, MODEL_YAML, assert_contract, plan_yaml_base,
                            write)
from planner.errors import InputError
from planner.model import HF_DEFAULT_SEQ_LEN, load_model

J = ["--format", "json", "--top", "3"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("base")
    return {"model": write(d / "model.yaml", MODEL_YAML), "hf": write(d / "config.json", HF_CONFIG, as_json=True),
            "cluster": write(d / "cluster.yaml", CLUSTER_YAML), "calibration": write(d / "cal.yaml", CALIBRATION_YAML),
            "plan": write(d / "plan.yaml", plan_yaml_base())}


def argv_for(kind: str, path: Path, base: dict[str, Path]) -> list[str]:
    """The command line that reads a file of this kind."""
    return {"model": ["--model", str(path), "--gpus", "8"],
            "hf": ["--model", str(path), "--gpus", "8", "--global-batch", "16"],
            "cluster": ["--model", str(base["model"]), "--cluster", str(path)],
            "calibration": ["--model", str(base["model"]), "--gpus", "8", "--calibration", str(path)],
            "plan": ["--from", str(path)]}[kind] + (["--format", "json"] if kind == "plan" else J)


KINDS = ("model", "hf", "cluster", "calibration", "plan")


@pytest.mark.parametrize("kind", KINDS)
def test_base_inputs_are_answered(kind, base):
    assert_contract(argv_for(kind, base[kind], base), expect=0)


# -- files that are not config files ----------------------------------------------------------------------------
def _file(tmp: Path, kind: str, name: str, content: bytes | None) -> Path:
    path = tmp / f"{name}{'.json' if kind == 'hf' else '.yaml'}"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


NOT_CONFIG = {
    "not utf-8": (b"name: caf\xe9\n", "not UTF-8"),
    "binary": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary"),
    "a folder": (None, "is a folder"),
    "nested yaml": (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    "nested json": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "deep block yaml": ("\n".join(" " * i + "a:" for i in range(2000)).encode(), "nested too deeply"),
    "empty": (b"", "expected a mapping"),
    "a list": (b"[1, 2]\n", "expected a mapping"),
    "syntax": (b"{a: [1,\n", "malformed"),
    "huge json integer": (b'{"a": 1' + b"0" * 5000 + b"}", "malformed"),
    "bad timestamp": (b"a: 2001-13-45\n", "malformed"),
    "alias bomb": (b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n".encode()
        for i in range(20)), "unknown key 'a'"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", NOT_CONFIG)
def test_not_a_config_file(kind, case, base, tmp_path):
    content, needle = NOT_CONFIG[case]
    if kind == "hf" and case in ("nested yaml", "deep block yaml", "bad timestamp"):
        content = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        needle = "nested too deeply"
    if kind == "hf" and case in ("empty", "alias bomb"):
        needle = "malformed"
    _, _, err = assert_contract(argv_for(kind, _file(tmp_path, kind, "f", content), base), expect=2)
    assert needle in err, err


def test_a_path_with_a_newline_is_still_one_line(base, tmp_path):
    _, _, err = assert_contract(argv_for("model", tmp_path / "a\nb.yaml", base), expect=2)
    assert "does not exist" in err


def test_missing_and_oversized_and_unreadable_files(base, tmp_path):
    _, _, err = assert_contract(argv_for("cluster", tmp_path / "none.yaml", base), expect=2)
    assert "does not exist" in err
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(17 * 2**20)   # sparse: no 17 MiB written
    _, _, err = assert_contract(argv_for("model", big, base), expect=2)
    assert "over the" in err
    for kind in ("model", "cluster"):
        _, _, err = assert_contract(argv_for(kind, Path("/dev/null"), base), expect=2)
        assert "not a regular file" in err
    if hasattr(os, "geteuid") and os.geteuid() != 0:   # root reads anything
        locked = write(tmp_path / "locked.yaml", MODEL_YAML)
        locked.chmod(0)
        _, _, err = assert_contract(argv_for("model", locked, base), expect=2)
        assert "cannot be read" in err


# -- values of the wrong type, non-finite or out of range, in every file kind ---------------------------------------
BAD_VALUES = {"text": "abc", "null": None, "list": [1], "nan": float("nan"), "inf": float("inf"),
              "-inf": float("-inf"), "bool": True, "float for int": 1.5, "zero": 0, "negative": -3}
NUMERIC_KEYS = {
    "model": ["layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "global_batch",
              "train_tokens"],
    "hf": ["hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "intermediate_size",
           "vocab_size", "max_position_embeddings"],
    "cluster": ["gpus_per_node", "nodes", "inter_node_gbps", "intra_node_gbps"],
    "calibration": ["matmul_efficiency", "intra_node_busbw_gbps", "inter_node_busbw_gbps", "cuda_context_bytes"],
    "plan": ["num_layers", "hidden_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
             "micro_batch_size", "global_batch_size", "plantune.cluster.nodes", "plantune.cluster.inter_node_gbps",
             "plantune.training.memory_fraction", "plantune.prediction.mfu"],
}
# null is allowed where it means "not given" (the default applies): those keys take every other bad value
NULL_OK = {("model", "global_batch"), ("model", "train_tokens"), ("hf", "num_key_value_heads")}
ZERO_OK = {("calibration", "cuda_context_bytes"), ("plan", "plantune.prediction.mfu")}
# numbers that may be fractional: 1.5 is a fine value there (out of range only for fractions of 1)
FLOAT_OK = {("model", "train_tokens"), ("cluster", "inter_node_gbps"), ("cluster", "intra_node_gbps"),
            ("calibration", "intra_node_busbw_gbps"), ("calibration", "inter_node_busbw_gbps"),
            ("calibration", "cuda_context_bytes"), ("plan", "plantune.cluster.inter_node_gbps")}
CASES = [(kind, key, name) for kind, keys in NUMERIC_KEYS.items() for key in keys for name in BAD_VALUES
         if not (name == "null" and (kind, key) in NULL_OK) and not (name == "zero" and (kind, key) in ZERO_OK)
         and not (name == "float for int" and (kind, key) in FLOAT_OK)]


def _base_data(kind: str) -> dict:
    return {"model": MODEL_YAML, "hf": HF_CONFIG, "cluster": CLUSTER_YAML, "calibration": CALIBRATION_YAML,
            "plan": None}[kind] or plan_yaml_base()


def _set(data: dict, dotted: str, value: object) -> dict:
    data = json.loads(json.dumps(data))
    *parents, last = dotted.split(".")
    target = data
    for p in parents:
        target = target[p]
    target[last] = value
    return data


@pytest.mark.parametrize("kind,key,name", CASES, ids=[f"{k}-{key}-{n}" for k, key, n in CASES])
def test_bad_value_is_one_line(kind, key, name, base, tmp_path):
    data = _set(_base_data(kind), key, BAD_VALUES[name])
    path = tmp_path / f"f{'.json' if kind == 'hf' else '.yaml'}"
    if kind == "hf":
        path.write_text(json.dumps(data))          # NaN / Infinity as Python's json writes them
    else:
        path.write_text(yaml.safe_dump(data))      # .nan / .inf
    _, _, err = assert_contract(argv_for(kind, path, base), expect=2)
    assert key.split(".")[-1] in err, err


def test_1e400_in_json_and_yaml(base, tmp_path):
    without = lambda d, k: {x: v for x, v in d.items() if x != k}  # noqa: E731 - the key is given once, as 1e400
    (tmp_path / "c.json").write_text(json.dumps(without(HF_CONFIG, "rope_theta"))[:-1] + ', "rope_theta": 1e400}')
    _, _, err = assert_contract(argv_for("hf", tmp_path / "c.json", base), expect=2)
    assert "rope_theta" in err and "finite" in err
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(without(CLUSTER_YAML, "inter_node_gbps"))
                                     + "inter_node_gbps: 1.0e+400\n")
    _, _, err = assert_contract(argv_for("cluster", tmp_path / "c.yaml", base), expect=2)
    assert "inter_node_gbps" in err and "finite" in err


# -- the issue's named cases ------------------------------------------------------------------------------------------
def _with(kind: str, tmp: Path, **changes: object) -> Path:
    data = _base_data(kind)
    for k, v in changes.items():
        data = _set(data, k.replace("__", "."), v)
    return write(tmp / f"f{'.json' if kind == 'hf' else '.yaml'}", data, as_json=kind == "hf")


NAMED = [
    ("model", {"glu": "no"}, "glu must be true or false"),
    ("model", {"intermediate": 0}, "unknown key 'intermediate'"),
    ("model", {"ffn_hidden": 0}, "ffn_hidden must be int"),
    ("model", {"kv_heads": 0}, "kv_heads must be int"),
    ("model", {"position": "sinusoidal"}, "position must be one of learned, rope, alibi"),
    ("model", {"rampup": [4, 4]}, "rampup must be [START, INCREMENT, SAMPLES]"),
    ("model", {"layer": 4}, "did you mean 'layers'"),
    ("hf", {"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
    ("hf", {"intermediate_size": 0}, "intermediate_size must be int"),
    ("hf", {"num_key_value_heads": 0}, "num_key_value_heads must be int"),
    ("hf", {"num_local_experts": -8, "num_experts_per_tok": 2}, "num_local_experts"),
    ("hf", {"model_type": "dbrx"}, "DBRX's experts"),
    ("hf", {"use_mrope": True}, "use_mrope true"),
    ("hf", {"rope_scaling": {"rope_type": "longrope", "factor": 32.0}}, "rope_scaling type 'longrope'"),
    ("hf", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 2.0}}, "high_freq_factor"),
    ("hf", {"model_type": "t5"}, "model_type 't5' is not one plantune reads"),
    ("hf", {"window_layers": 6}, "key 'window_layers' is not understood"),
    # the same fact under two names (Gemma 2's sliding_window_size), disagreeing (issue 31.2)
    ("hf", {"sliding_window": 4096, "sliding_window_size": 6}, "sliding_window_size 6 and sliding_window 4096 name "
                                                               "one fact and disagree"),
    ("hf", {"hidden_sise": 64}, "did you mean 'hidden_size'"),
    ("cluster", {"nodes": 1.5}, "nodes must be int"),
    ("cluster", {"inter_node_gbps": 0}, "inter_node_gbps must be a number in (0,"),
    ("cluster", {"intra_node_gbps": -100}, "intra_node_gbps must be a number in (0,"),
    ("cluster", {"nodes": 10**9}, "10x the largest training clusters"),
    ("cluster", {"nodes": 480_000, "gpus_per_node": 8}, "3,840,000 GPUs is over the 1,000,000"),
    ("cluster", {"gpu": 100}, "gpu must be a catalog id"),
    ("calibration", {"matmul_efficiency": -0.5}, "matmul_efficiency must be a fraction of peak in (0, 1]"),
    ("calibration", {"matmul_efficiency": 5}, "matmul_efficiency must be a fraction of peak in (0, 1]"),
    ("calibration", {"inter_node_busbw_gbps": -10}, "inter_node_busbw_gbps must be a number in (0,"),
    ("calibration", {"intra_node_busbw_gbps": -10}, "intra_node_busbw_gbps must be a number in (0,"),
    ("calibration", {"matmul_eficiency": 0.5}, "did you mean 'matmul_efficiency'"),
    ("plan", {"tensor_model_parallel_size": 0}, "tensor_model_parallel_size must be int"),
    ("plan", {"recompute_granularity": "partial"}, "recompute_granularity must be null, full or selective"),
    ("plan", {"zero_stage": 4}, "zero_stage must be one of 0, 1, 2, 3"),
    ("plan", {"plantune__kind": "deepspeed"}, "plantune.kind must be one of"),
    ("plan", {"plantune__training__optimizer": "adam"}, "plantune.training.optimizer must be one of"),
    ("plan", {"plantune__model__glu": "no"}, "plantune.model.glu must be true or false"),
    ("plan", {"plantune__cluster__matmul_efficiency": 5}, "plantune.cluster.matmul_efficiency"),
    ("plan", {"global_batch_size": 1_000_000, "rampup_batch_size": [1, 1, 100]}, "over the 2,048"),
    ("plan", {"sequence_paralel": False}, "did you mean 'sequence_parallel'"),
]


@pytest.mark.parametrize("kind,changes,needle", NAMED, ids=[f"{k}-{'-'.join(c)}" for k, c, _ in NAMED])
def test_named_malformed_file(kind, changes, needle, base, tmp_path):
    _, _, err = assert_contract(argv_for(kind, _with(kind, tmp_path, **changes), base), expect=2)
    assert needle in err, err


FLAGS = [
    (["--model", "176B", "--gpus", "1000000000"], "--gpus must be int in [1, 1,000,000] (10x"),
    (["--model", "176B", "--gpus", "3840000"], "--gpus must be int in [1, 1,000,000]"),
    (["--model", "176B", "--nodes", "1000000000"], "--nodes must be int"),
    (["--model", "176B", "--nodes", "200000"], "1,600,000 GPUs is over the 1,000,000"),
    (["--model", "176B", "--gpus", "384", "--global-batch", str(10**12)], "--global-batch must be int in [1, 1,048,576]"),
    (["--model", "176B", "--gpus", "384", "--global-batch", "1000000", "--rampup", "1", "1", "100"], "over the 2,048"),
    (["--model", "176B", "--gpus", "384", "--train-tokens", "nan"], "not a finite number"),
    (["--model", "176B", "--gpus", "384", "--train-tokens", "inf"], "not a finite number"),
    (["--model", "176B", "--gpus", "384", "--train-tokens", "1e400"], "not a finite number"),
    (["--model", "176B", "--gpus", "384", "--train-tokens", "1e20"], "--train-tokens must be a number in"),
    (["--model", "176B", "--gpus", "384", "--inter-node-gbps", "nan"], "not a finite number"),
    (["--model", "176B", "--gpus", "384", "--memory-fraction", "nan"], "not a finite number"),
    (["--model", "176B", "--gpus", "384", "--memory-headroom", "nan"], "--memory-headroom"),
    (["--model", "176B", "--gpus", "384", "--seq-len", "100000000"], "--seq-len must be int"),
    (["--model", "176B", "--gpus", "384", "--rampup", "32", "32", "100", "--no-rampup"], "contradict"),
    (["--model", "176B", "--gpus", "384", "--recompute", "partial"], "--recompute"),
    (["--model", "176B", "--gpus", "384", "--pick", "2"], "--pick only applies with --emit"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12", "--top", "3"], "--top does not apply"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=two"], "mbs=two is not an integer"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,sp=2"], "sp=2 must be 1 or 0"),
    # issue 32: values no layout can hold are input errors, not a "RULED OUT" layout
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,zero=7"], "zero=7 is not a ZeRO stage"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=999999999999999999999999999999"],
     "is more than the 384 GPUs; give tp <= 384"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=" + "9" * 5000], "is more than the 384 GPUs"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=4096"], "more than the global batch 2,048"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,vpp=99999999999999999999"], "give vpp <= 10,000"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,ep=100000"], "give ep <= 384"),
    # a list flag that names nothing would have let the defaults apply silently
    (["--model", "176B", "--gpus", "384", "--recompute", ""], "--recompute '' names no value"),
    (["--model", "176B", "--gpus", "384", "--zero", ",,,"], "--zero ',,,' names no value"),
    (["--model", "176B", "--gpus", "384", "--cp", " , "], "--cp ' , ' names no value"),
    (["--model", "176B", "--gpus", "384", "--overlap", ""], "--overlap '' names nothing"),
    # unknown flags get the closest known one; an ambiguous prefix of two different options stays refused
    (["--model", "176B", "--gpus", "384", "--tpp", "4"], "--tpp: did you mean --tp?"),
    (["--model", "176B", "--gpus", "384", "--recompte", "full"], "--recompte: did you mean --recompute?"),
    (["--model", "176B", "--gpus", "384", "--g", "512"], "ambiguous option: --g could match --gpus, --gpu,"),
    # --explain's neighbours: a key given twice (which one was meant?) and a misspelt key
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,tp=8,pp=12"], "tp is given twice (tp=4 and tp=8)"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,pp=12"], "pp is given twice"),
    (["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,zeor=1"], "unknown key 'zeor' (did you mean 'zero'?)"),
]


@pytest.mark.parametrize("argv,needle", FLAGS, ids=[" ".join(a[2:]) for a, _ in FLAGS])
def test_bad_flags(argv, needle):
    _, _, err = assert_contract(argv, expect=2)
    assert needle in err, err
    assert err.count("did you mean") <= 1, err     # one hint, not argparse's and ours


@pytest.mark.parametrize("extra,needle", [
    (["--model", "176B"], "--model would be ignored"),
    (["--gpus", "8", "--top", "3"], "--gpus, --top would be ignored"),
    (["--explain", "tp=1,pp=1"], "the configuration is the one in"),
    (["--calibration", "cal.yaml"], "--calibration would be ignored"),
])
def test_from_refuses_flags_it_would_ignore(extra, needle, base):
    _, _, err = assert_contract(["--from", str(base["plan"]), *extra], expect=2)
    assert needle in err, err


def test_prefix_of_two_spellings_of_one_option_is_that_option():
    """--global matches --global-batch and --global_batch, one option written two ways: it is that option (argparse
    called it ambiguous), and the plan says the batch it used."""
    rc, out, _ = assert_contract(["--model", "176B", "--gpus", "384", "--global", "512", *J], expect=0)
    assert json.loads(out)["global_batch"] == 512
    _, _, err = assert_contract(["--model", "176B", "--gpus", "384", "--g", "512"], expect=2)
    assert err.count("--global") == 1 and "--global_batch" not in err, err   # one spelling listed per option


def test_explain_in_range_is_still_explained():
    """The bounds refuse only values no layout can hold: ZeRO 3 and TP = all GPUs are explained (fits or not)."""
    for cfg in ("tp=4,pp=12,zero=3", "tp=384,pp=1"):
        rc, out, _ = assert_contract(["--model", "176B", "--gpus", "384", "--explain", cfg, "--format", "json"],
                                     expect=0)
        assert json.loads(out)["tp"] in (4, 384)


@pytest.mark.parametrize("kind", ["model", "cluster", "calibration", "plan"])
def test_a_key_given_twice_is_refused(kind, base, tmp_path):
    """YAML (and JSON) readers keep the last of two equal keys; plantune names both lines instead."""
    text = yaml.safe_dump(_base_data(kind), sort_keys=False)
    first = text.splitlines()[0]
    path = tmp_path / "twice.yaml"
    path.write_text(text + first + "\n")
    _, _, err = assert_contract(argv_for(kind, path, base), expect=2)
    key = first.split(":")[0]
    assert f"key {key!r} is given twice (lines 1 and {len(text.splitlines()) + 1})" in err, err


def test_a_json_key_given_twice_is_refused(base, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIG)[:-1] + ', "hidden_size": 128}')
    _, _, err = assert_contract(argv_for("hf", path, base), expect=2)
    assert "key 'hidden_size' is given twice" in err, err


def test_yaml_merge_keys_still_override(tmp_path):
    """``<<: *base`` then a key of its own is YAML's override, not a key given twice."""
    path = tmp_path / "m.yaml"
    data = dict(MODEL_YAML)
    layers = data.pop("layers")
    body = yaml.safe_dump(data, sort_keys=False)
    path.write_text(f"<<: {{layers: {layers + 8}}}\nlayers: {layers}\n" + body)
    assert load_model(str(path)).layers == layers


@pytest.mark.parametrize("edit,needle", [
    (("data_parallel_size", 16), "data_parallel_size 16 disagrees with its 384 GPUs (48 nodes x 8) / (TP 4 x PP 12); "
                                 "set data_parallel_size 8"),
    (("data_parallel_size", 5), "data_parallel_size 5 disagrees"),
    (("gradient_accumulation_steps", 64), "gradient_accumulation_steps 64 = 1024 disagrees with global_batch_size "
                                          "2048; set gradient_accumulation_steps 128"),
])
def test_from_a_plan_whose_degrees_disagree(edit, needle, tmp_path):
    """plan --from: a DP that is not GPUs / (TP x PP), or a GAS that breaks the batch, is the file's error (one line,
    exit 2), not a layout explained as RULED OUT."""
    data = _set(plan_yaml_base(), *edit)
    path = write(tmp_path / "plan.yaml", data)
    for extra in ([], ["--explain"]):
        _, _, err = assert_contract(["--from", str(path), *extra], expect=2)
        assert needle in err, err


def test_from_with_bare_explain_is_answered(base):
    assert_contract(["--from", str(base["plan"]), "--explain", "--format", "json"], expect=0)


# -- accepted, and read right ----------------------------------------------------------------------------------------
def test_vocab_of_one_is_planned(base, tmp_path):
    assert_contract(argv_for("model", _with("model", tmp_path, vocab=1), base), expect=0)


def test_yaml_booleans_stay_booleans(tmp_path):
    m = load_model(str(_with("model", tmp_path, glu=False, tied_embeddings=True)))
    assert (m.glu, m.tied_embeddings) == (False, True)


def _hf(tmp_path: Path, name: str, cfg: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


# Published configs (Hugging Face Hub config.json) and parameter counts (safetensors index / model cards)
GEMMA_7B = {"architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 2,
            "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 3072, "initializer_range": 0.02,
            "intermediate_size": 24576, "max_position_embeddings": 8192, "model_type": "gemma",
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16, "pad_token_id": 0,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
            "transformers_version": "4.38.0.dev0", "use_cache": True, "vocab_size": 256000}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
              "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
              "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}
LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
              "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
              "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}
GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
        "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}, "vocab_size": 50257}
NEOX_20B = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu_fast",
            "hidden_size": 6144, "initializer_range": 0.02, "intermediate_size": 24576, "layer_norm_eps": 1e-05,
            "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 64,
            "num_hidden_layers": 44, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
            "torch_dtype": "float16", "transformers_version": "4.24.0.dev0", "use_cache": True,
            "use_parallel_residual": True, "vocab_size": 50432}


@pytest.mark.parametrize("name,cfg,params,seq", [
    ("gemma-7b", GEMMA_7B, 8_537_680_896, HF_DEFAULT_SEQ_LEN),        # Gemma model card: 8.54B
    ("mistral-7b", MISTRAL_7B, 7_241_732_096, HF_DEFAULT_SEQ_LEN),    # mistralai/Mistral-7B-v0.1
    ("llama-3.1-8b", LLAMA31_8B, 8_030_261_248, HF_DEFAULT_SEQ_LEN),  # meta-llama/Llama-3.1-8B
    ("gpt2", GPT2, 124_439_808, 1024),                                  # openai-community/gpt2
    ("gpt-neox-20b", NEOX_20B, 20_554_567_680, 2048),                   # EleutherAI/gpt-neox-20b
], ids=lambda v: v if isinstance(v, str) else "")
def test_hf_configs_read_right(tmp_path, name, cfg, params, seq):
    m = load_model(_hf(tmp_path, name, cfg))
    assert m.params == params and m.seq_len == seq


def test_hf_seq_len_is_said_and_overridable(tmp_path):
    path = _hf(tmp_path, "mistral", MISTRAL_7B)
    rc, out, err = assert_contract(["--model", path, "--gpus", "64", "--global-batch", "512", *J], expect=0)
    assert json.loads(out)["seq_len"] == HF_DEFAULT_SEQ_LEN
    assert err.startswith("plan: note:") and "set --seq-len" in err and "32,768" in err
    rc, out, err = assert_contract(["--model", path, "--gpus", "64", "--global-batch", "512", "--seq-len", "8192",
                                    *J], expect=0)
    assert json.loads(out)["seq_len"] == 8192 and err == ""


def test_gemma_is_refused_where_its_geglu_cannot_be_written(tmp_path):
    """Gemma-7B's gated tanh-GELU MLP has no Megatron-LM argument (--swiglu is SiLU-gated): the emit refuses in one
    line rather than train a SwiGLU model; `plan` alone still plans it (its FLOPs and memory are Gemma's)."""
    path = _hf(tmp_path, "gemma", GEMMA_7B)
    _, _, err = assert_contract(["--model", path, "--gpus", "64", "--global-batch", "512", "--framework", "megatron-lm",
                                 "--emit", "megatron-lm", "--out", str(tmp_path / "run")], expect=2)
    assert "GeGLU" in err and len(err.strip().splitlines()) == 1
    assert_contract(["--model", path, "--gpus", "64", "--global-batch", "512", "--framework", "megatron-lm"], expect=0)


def test_hf_understood_keys_cover_every_family(tmp_path):
    """Every family in the table reads a config made of the keys plantune knows."""
    from planner.hf_config import HF_FAMILIES

    for name in HF_FAMILIES:
        cfg = {**HF_CONFIG, "model_type": name, **({"n_positions": 64} if name == "gpt2" else {})}
        try:
            load_model(_hf(tmp_path, name, cfg))
        except InputError as err:
            raise AssertionError(f"{name}: {err}") from None


def test_nesting_is_refused_before_parsing_only_past_the_stated_depth():
    from planner.files import MAX_FLOW_NESTING, _too_deep

    deep = MAX_FLOW_NESTING
    assert not _too_deep("a: " + "[" * deep + "]" * deep + "\n")
    assert _too_deep("a: " + "[" * (deep + 1) + "]" * (deep + 1) + "\n")
    assert not _too_deep('{"a": [1, {"b": [2, 3]}], "c": "]]]"}')
