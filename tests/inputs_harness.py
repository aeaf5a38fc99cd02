"""Shared by the input corpus and fuzz tests: valid base inputs of every kind, and `plan` run in-process.

The contract (issue 11): `plan` exits 0 with a finite, physically possible answer, or exits 2 with one
line on stderr; it never raises (a traceback) and never exits otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import yaml

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]

MODEL_YAML = {"name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 256, "vocab": 128,
              "seq_len": 32, "glu": True, "tied_embeddings": False, "position": "rope", "norm": "rmsnorm",
              "bias": False, "global_batch": 16, "rampup": [4, 4, 1000], "train_tokens": 1.0e9}
HF_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 256,
             "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 128,
             "max_position_embeddings": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1}
CLUSTER_YAML = {"name": "c", "gpu": "A100-80GB", "gpus_per_node": 4, "nodes": 2, "inter_node_gbps": 400,
                "intra_node_gbps": 2400}
CALIBRATION_YAML = {"device": "cpu (gloo), 1 processes, 1 node(s)", "matmul_efficiency": 0.6,
                    "matmul_peak_tflops": 1.0, "matmul_peak_source": "best measured GEMM rate",
                    "cuda_context_bytes": 1.0e9, "intra_node_busbw_gbps": 1000.0, "inter_node_busbw_gbps": 100.0,
                    "notes": ["one process"], "measurements": {"matmul": []}}


def plan_yaml_base() -> dict:
    """A plan.yaml written by `plan --emit` (the BLOOM example on disk)."""
    return yaml.safe_load((ROOT / "examples" / "bloom-176b-48x8-a100" / "plan.yaml").read_text())


def write(path: Path, data: object, *, as_json: bool = False) -> Path:
    path.write_text(json.dumps(data) if as_json else yaml.safe_dump(data, sort_keys=False))
    return path


def run_plan(argv: list[str]) -> tuple[int, str, str]:
    """`plan ARGV` in this process: (exit status, stdout, stderr); an exception escapes (that is a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def _numbers(obj: object):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


def _physical(e: dict) -> list[str]:
    """What is impossible in one estimate (a candidate of the plan, or --explain's answer); JSON figures are
    rounded (step_time_s to 1 ms, mfu to 1e-4), so a tiny model may show 0 there but never below."""
    bad = []
    if e.get("mfu") is not None and not 0 <= e["mfu"] <= 1:
        bad.append(f"mfu {e['mfu']}")
    for key in ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu"):
        if e.get(key) is not None and not e[key] >= 0:
            bad.append(f"{key} {e[key]}")
    for key in ("memory_gb_per_gpu", "tokens_per_s"):
        if e.get(key) is not None and not e[key] > 0:
            bad.append(f"{key} {e[key]}")
    return bad


def assert_contract(argv: list[str], *, expect: int | None = None) -> tuple[int, str, str]:
    """Exit 2 with one line, or exit 0 with a finite, physically possible JSON answer (argv has --format json)."""
    rc, out, err = run_plan(argv)
    assert rc in (0, 2), f"exit {rc}: {err[-2000:]}"
    assert "Traceback" not in err, err
    if rc == 2:
        assert err.count("\n") == 1 and err.endswith("\n") and err.startswith("plan: error: "), repr(err)
    elif "--format" in argv and argv[argv.index("--format") + 1] == "json":
        doc = json.loads(out)
        assert all(math.isfinite(x) for x in _numbers(doc)), out[:2000]
        estimates = doc["candidates"] if "candidates" in doc else [doc]
        assert estimates
        for e in estimates:
            assert not _physical(e), (_physical(e), e)
    if expect is not None:
        assert rc == expect, f"expected exit {expect}, got {rc}: {err or out[:500]}"
    return rc, out, err
