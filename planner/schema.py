"""One schema per input kind, checked at the boundary: types, ranges, finite numbers, known keys.

Every file plantune reads (model YAML, HF config.json, cluster YAML, calibration YAML, plan.yaml) and
the numeric flags of `plan`/`tune` pass through :func:`check` with one table of :class:`Field` per
kind, so the rest of the code can trust its inputs. A problem is one :class:`InputError` line naming
the key, what it must be, and what was given; an unknown key gets a "did you mean".

    >>> check({"gpu": "A100", "nodes": 2}, CLUSTER, "cluster YAML c.yaml")
    {'gpu': 'A100', 'nodes': 2}

A hand-written table rather than pydantic: importing pydantic and building five models costs
~135 ms (`python -X importtime`, see readme-inputs), half of what a whole `plan` run may take.

Upper bounds are not physics: they keep the arithmetic and the enumeration bounded and refuse
numbers no training run has (each says why in its error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from planner.errors import InputError

# -- bounds (each refuses what no training run uses, and keeps the planner's work bounded) -----------------------
MAX_GPUS = 1_000_000
WHY_GPUS = "10x the largest training clusters built so far, ~100,000 GPUs in 2024"
MAX_GPUS_PER_NODE = 1024
WHY_GPUS_PER_NODE = "above any NVLink domain announced (NVL576)"
MAX_GLOBAL_BATCH = 1_048_576
WHY_GLOBAL_BATCH = "512x the 2,048-sequence batches of BLOOM-176B and Llama-3.1-405B"
MAX_SEQ_LEN = 16_777_216
WHY_SEQ_LEN = "above any published training context (10M tokens, Llama 4 Scout)"
MAX_RAMPUP_STEPS = 2048
WHY_RAMPUP_STEPS = "BLOOM-176B ramped its batch in 116 steps; every step is a constraint per candidate"
MAX_TRAIN_TOKENS = 1e15
WHY_TRAIN_TOKENS = "60x the 15.6T tokens of Llama-3.1-405B"
MAX_MBS = 65_536
MAX_GBPS = 1e6
WHY_GBPS = "over 100x NVLink5 (7,200 Gbit/s per GPU and direction)"
_WHY_SHAPE = "far beyond any published model (Megatron-1T: 128 layers, hidden 25,600)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """What one key may hold. ``kind``: int | num | bool | str | enum | list | map | scalar | any."""

    kind: str
    lo: float | None = None
    """lower bound, included unless ``open_lo``"""
    open_lo: bool = False
    hi: float | None = None
    """upper bound, included"""
    why: str = ""
    """why the upper bound (said in the error)"""
    null: bool = False
    """null (None) is allowed"""
    required: bool = False
    choices: tuple = ()
    item: "Field | None" = None
    """for lists: every item"""
    length: int | None = None
    """for lists: exact length"""
    sub: "Mapping[str, Field] | None" = None
    """for maps: the nested schema"""
    what: str = ""
    """how to describe the value in errors, instead of the generated words"""


def Int(lo: float | None = 1, hi: float | None = None, **kw: object) -> Field:
    return Field(kind="int", lo=lo, hi=hi, **kw)  # type: ignore[arg-type]


def Num(lo: float | None = None, hi: float | None = None, **kw: object) -> Field:
    return Field(kind="num", lo=lo, hi=hi, **kw)  # type: ignore[arg-type]


def Bool(**kw: object) -> Field:
    return Field(kind="bool", **kw)  # type: ignore[arg-type]


def Str(**kw: object) -> Field:
    return Field(kind="str", **kw)  # type: ignore[arg-type]


def Enum(*choices: object, **kw: object) -> Field:
    return Field(kind="enum", choices=choices, **kw)  # type: ignore[arg-type]


def Map(sub: Mapping[str, Field], **kw: object) -> Field:
    return Field(kind="map", sub=sub, **kw)  # type: ignore[arg-type]


def List(item: Field, length: int | None = None, **kw: object) -> Field:
    return Field(kind="list", item=item, length=length, **kw)  # type: ignore[arg-type]


def Any(**kw: object) -> Field:
    return Field(kind="any", **kw)  # type: ignore[arg-type]


def Scalar(**kw: object) -> Field:
    """A number (finite), text, true/false or null: for keys another module adds and validates itself."""
    return Field(kind="scalar", null=True, **kw)  # type: ignore[arg-type]


# -- the validator -------------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def describe(f: Field) -> str:
    """Words for what ``f`` accepts: 'int >= 1', 'number in (0, 1]', 'one of a, b'."""
    if f.what:
        text = f.what
    elif f.kind in ("int", "num"):
        text = "int" if f.kind == "int" else "a number"
        lo = None if f.lo is None else _fmt(int(f.lo) if f.kind == "int" else f.lo)
        hi = None if f.hi is None else _fmt(int(f.hi) if f.kind == "int" else f.hi)
        if lo is not None and hi is not None:
            text += f" in {'(' if f.open_lo else '['}{lo}, {hi}]"
        elif lo is not None:
            text += f" {'>' if f.open_lo else '>='} {lo}"
        elif hi is not None:
            text += f" <= {hi}"
        if f.kind == "num":
            text += " (finite)"
    elif f.kind == "bool":
        text = "true or false"
    elif f.kind == "str":
        text = "text"
    elif f.kind == "enum":
        text = "one of " + ", ".join("null" if c is None else str(c) for c in f.choices)
    elif f.kind == "list":
        n = f"{f.length} " if f.length else ""
        text = f"a list of {n}{describe(f.item) if f.item else 'values'}"
    elif f.kind == "map":
        text = "a mapping of keys"
    elif f.kind == "scalar":
        text = "a number, text, true/false or null"
    else:
        text = "a value"
    if f.null and f.kind not in ("enum", "scalar"):
        text += " or null"
    return text


def _short(value: object) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _in_range(f: Field, v: float) -> bool:
    if f.lo is not None and (v <= f.lo if f.open_lo else v < f.lo):
        return False
    return f.hi is None or v <= f.hi


def _problem(f: Field, v: object) -> bool:
    """True when ``v`` does not fit ``f`` (nested lists/maps are checked by the caller)."""
    if v is None:
        return not f.null and f.kind != "any" and not (f.kind == "enum" and None in f.choices)
    if f.kind == "int":
        return not _is_int(v) or not _in_range(f, v)  # type: ignore[arg-type]
    if f.kind == "num":
        return not _is_num(v) or not _in_range(f, v)  # type: ignore[arg-type]
    if f.kind == "bool":
        return not isinstance(v, bool)
    if f.kind == "str":
        return not isinstance(v, str) or len(v) > 2000
    if f.kind == "enum":
        return not any(type(v) is type(c) and v == c for c in f.choices)
    if f.kind == "list":
        return not isinstance(v, list) or (f.length is not None and len(v) != f.length)
    if f.kind == "map":
        return not isinstance(v, dict)
    if f.kind == "scalar":
        return not (isinstance(v, (bool, str)) or _is_num(v))
    return False


def did_you_mean(key: str, known: object) -> str:
    import difflib   # here: only a misspelled key needs it (not imported at start-up)

    close = difflib.get_close_matches(key, [str(k) for k in known], n=1, cutoff=0.6)  # type: ignore[union-attr]
    return f" (did you mean {close[0]!r}?)" if close else ""


def check(data: object, schema: Mapping[str, Field], where: str, *, prefix: str = "",
          label: "callable | None" = None, unknown: str = "error") -> dict:
    """``data`` checked against ``schema``; InputError ``"{where}: {key} must be ..."`` at the first problem.

    ``prefix`` is put before nested key names (``plantune.cluster.``); ``label`` turns a key into the
    name the user typed (``--global-batch``); ``unknown="keep"`` lets keys outside the schema through.
    """
    name = label or (lambda k: f"{prefix}{k}")
    at = f"{where}: " if where else ""
    if not isinstance(data, dict):
        raise InputError(f"{at}{prefix.rstrip('.') or 'the file'} must be a mapping of keys, got {_short(data)}")
    for key in data:
        if not isinstance(key, str):
            raise InputError(f"{at}key {_short(key)} is not a name; keys are text such as "
                             f"{next(iter(schema), 'name')!r}")
        if key not in schema and unknown == "error":
            raise InputError(f"{at}unknown key {name(key)!r}{did_you_mean(key, schema)}; known: "
                             f"{', '.join(sorted(schema))}")
    for key, f in schema.items():
        if key not in data:
            if f.required:
                raise InputError(f"{at}missing key {name(key)} ({describe(f)})")
            continue
        _check_value(data[key], f, where, name(key))
    return data


def _check_value(v: object, f: Field, where: str, label: str) -> None:
    if _problem(f, v):
        why = f" ({f.why})" if f.why and (_is_num(v) and f.hi is not None and v > f.hi) else ""  # type: ignore[operator]
        raise InputError(f"{where + ': ' if where else ''}{label} must be {describe(f)}{why}, got {_short(v)}")
    if v is None:
        return
    if f.kind == "list" and f.item is not None:
        for i, item in enumerate(v):  # type: ignore[arg-type]
            _check_value(item, f.item, where, f"{label}[{i}]")
    elif f.kind == "map" and f.sub is not None:
        check(v, f.sub, where, prefix=f"{label}.")


# -- the schemas ---------------------------------------------------------------------------------------------------
RAMPUP = List(Int(1, MAX_GLOBAL_BATCH * MAX_RAMPUP_STEPS), 3, null=True,
               what="[START, INCREMENT, SAMPLES] positive integers")

MODEL: dict[str, Field] = {
    "name": Str(required=True),
    "layers": Int(1, 10_000, why=_WHY_SHAPE, required=True),
    "hidden": Int(1, 1_048_576, why=_WHY_SHAPE, required=True),
    "heads": Int(1, 65_536, why=_WHY_SHAPE, required=True),
    "kv_heads": Int(1, 65_536, why=_WHY_SHAPE),
    "kv_channels": Int(1, 65_536, why=_WHY_SHAPE, null=True),
    "ffn_hidden": Int(1, 4_194_304, why=_WHY_SHAPE),
    "vocab": Int(1, 16_777_216, why="64x the largest published vocabulary (Gemma, 256,000)", required=True),
    "seq_len": Int(1, MAX_SEQ_LEN, why=WHY_SEQ_LEN, required=True),
    "glu": Bool(),
    "tied_embeddings": Bool(),
    "position": Enum("learned", "rope", "alibi"),
    "norm": Enum("layernorm", "rmsnorm"),
    "bias": Bool(),
    "embedding_norm": Bool(),
    "global_batch": Int(1, MAX_GLOBAL_BATCH, why=WHY_GLOBAL_BATCH, null=True),
    "rampup": RAMPUP,
    "train_tokens": Num(0, MAX_TRAIN_TOKENS, open_lo=True, why=WHY_TRAIN_TOKENS, null=True),
    "source": Str(null=True),
    "hub_id": Str(what="a Hugging Face repository id (org/name), the model's tokenizer for the launchers"),
}
"""plantune model YAML (the fields of planner.model.ModelSpec)"""

CLUSTER: dict[str, Field] = {
    "name": Str(),
    "gpu": Any(required=True, what="a catalog id, a GPU YAML path, or a mapping of GPU YAML keys"),
    "gpus_per_node": Int(1, MAX_GPUS_PER_NODE, why=WHY_GPUS_PER_NODE),
    "nodes": Int(1, MAX_GPUS, why=WHY_GPUS),
    "inter_node_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "intra_node_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "nics_per_node": Int(1, MAX_GPUS_PER_NODE, why=WHY_GPUS_PER_NODE),
    "nic_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "nvlink_domain": Int(1, MAX_GPUS_PER_NODE, why=WHY_GPUS_PER_NODE),
    "notes": Any(),
    "source": Str(),
}
"""cluster YAML (planner.hardware.load_cluster)"""

CALIBRATION: dict[str, Field] = {
    "matmul_efficiency": Num(0, 1, open_lo=True, what="a fraction of peak in (0, 1]"),
    "intra_node_busbw_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "inter_node_busbw_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "cuda_context_bytes": Num(0, 1e12, what="bytes in [0, 1e12]"),
    "gpu": Map(None, what="a mapping of GPU YAML keys (ACCELERATOR) replacing the catalog's figures"),
    "host_s_per_layer_forward": Num(0, 1, open_lo=True, what="seconds in (0, 1]"),
    "elementwise_efficiency": Num(0, 1, open_lo=True, what="a fraction of HBM bandwidth in (0, 1]"),
    "attention_efficiency": Num(0, 4, open_lo=True, what="a fraction of peak in (0, 4] (the full s x s square's "
                                                          "FLOPs: a causal kernel may exceed 1)"),
    # written by `tune calibrate` for the record, not read by the planner
    "device": Any(), "matmul_peak_tflops": Any(), "matmul_peak_source": Any(), "notes": Any(),
    "measurements": Any(),
}
"""calibration YAML written by `tune calibrate` (planner.calibration.apply_calibration)"""

_TFLOPS = "TFLOP/s, dense (no sparsity)"
ACCELERATOR: dict[str, Field] = {
    "id": Str(), "base": Str(what="a catalog id to start from (its keys are kept unless given)"),
    "memory_gib": Num(0, 65_536, open_lo=True, what="GiB of device memory, a number in (0, 65,536]"),
    **{k: Num(0, 1e6, open_lo=True, null=True, what=f"{_TFLOPS} in (0, 1e6] or null")
       for k in ("bf16_tflops", "fp8_tflops", "tf32_tflops")},
    **{k: Num(0, 1e6, open_lo=True, what=f"{_TFLOPS} in (0, 1e6]") for k in ("fp16_tflops", "fp32_tflops")},
    "hbm_gb_per_s": Num(0, 1e6, open_lo=True, what="GB/s of memory bandwidth in (0, 1e6]"),
    "intra_node_gb_per_s": Num(0, 1e6, open_lo=True, what="GB/s per GPU and direction in (0, 1e6] (half the "
                                                          "datasheet's bidirectional NVLink figure)"),
    "intra_node_link": Str(),
    "gpus_per_node": Int(1, MAX_GPUS_PER_NODE, why=WHY_GPUS_PER_NODE),
    "nic_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "nvlink_domain": Int(1, MAX_GPUS_PER_NODE, null=True, why=WHY_GPUS_PER_NODE),
    "mx_block_scaling": Bool(),
    "sm_count": Int(1, 100_000),
    "gemm_efficiency": Num(0, 1, open_lo=True, what="a fraction of the dense peak in (0, 1]"),
    "attention_tflops": Map(None, null=True, what="the attention kernels' published forward + backward TFLOP/s "
                                                  "(planner/accelerators.yaml, A100-40GB)"),
    "cuda_context_gib": Num(0, 1024, what="GiB in [0, 1024]"),
    "host_memory_gib": Num(0, 1_048_576, open_lo=True, null=True, what="GiB of host memory in the usual node, in "
                                                                       "(0, 1,048,576] or null"),
    "host_memory_gb_per_s": Num(0, 1e6, open_lo=True, null=True, what="GB/s of host memory bandwidth in the usual "
                                                                     "node, in (0, 1e6] or null"),
    "host_link_gb_per_s": Num(0, 1e5, open_lo=True, what="GB/s per direction between the GPU and its host memory "
                                                         "(PCIe Gen5 x16: 64), in (0, 1e5]"),
    "power_w": Num(0, 100_000, open_lo=True, null=True),
    "source": Str(),
    "aliases": List(Str()),
    "notes": Any(),
}
"""one accelerator in a GPU YAML, a cluster YAML's gpu, or planner/accelerators.yaml (planner.hardware)"""


FLAGS: dict[str, Field] = {
    "gpus": Int(1, MAX_GPUS, why=WHY_GPUS),
    "nodes": Int(1, MAX_GPUS, why=WHY_GPUS),
    "gpus_per_node": Int(1, MAX_GPUS_PER_NODE, why=WHY_GPUS_PER_NODE),
    "nvlink_domain": Int(1, MAX_GPUS_PER_NODE, why=WHY_GPUS_PER_NODE),
    "global_batch": Int(1, MAX_GLOBAL_BATCH, why=WHY_GLOBAL_BATCH),
    "seq_len": Int(1, MAX_SEQ_LEN, why=WHY_SEQ_LEN),
    "train_tokens": Num(0, MAX_TRAIN_TOKENS, open_lo=True, why=WHY_TRAIN_TOKENS),
    "max_mbs": Int(1, MAX_MBS),
    "inter_node_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "intra_node_gbps": Num(0, MAX_GBPS, open_lo=True, why=WHY_GBPS),
    "memory_fraction": Num(0, 1, open_lo=True),
    "memory_headroom": Num(0, 0.99),
    "rampup": List(Int(1, MAX_GLOBAL_BATCH * MAX_RAMPUP_STEPS), 3),
}
"""the numeric setup flags of `plan` and `tune` (argparse has already made them numbers)"""


def check_flags(args: object) -> None:
    """The setup flags in range, finite, and not contradicting each other (shared by `plan` and `tune`)."""
    values = {k: getattr(args, k) for k in FLAGS if getattr(args, k, None) is not None}
    check(values, FLAGS, "", label=lambda k: "--" + k.replace("_", "-"))
    if getattr(args, "rampup", None) and getattr(args, "no_rampup", False):
        raise InputError("--rampup and --no-rampup contradict each other; keep one")


def check_training(global_batch: int, rampup: object, where: str = "") -> None:
    """A rampup short enough to check per candidate: at most MAX_RAMPUP_STEPS batch sizes."""
    if rampup is None or global_batch <= rampup.start:  # type: ignore[attr-defined]
        return
    steps = -(-(global_batch - rampup.start) // rampup.increment)  # type: ignore[attr-defined]
    if steps > MAX_RAMPUP_STEPS:
        raise InputError(f"{where + ': ' if where else ''}rampup {rampup.start} {rampup.increment} "  # type: ignore
                         f"{rampup.samples} to global batch {global_batch:,} takes {steps:,} batch sizes, over the "
                         f"{MAX_RAMPUP_STEPS:,} plantune checks ({WHY_RAMPUP_STEPS}); use a larger increment")


def check_world(nodes: int, gpus_per_node: int) -> None:
    """The cluster's GPU count within MAX_GPUS, whichever input it came from (flags, cluster YAML, plan.yaml)."""
    if nodes * gpus_per_node > MAX_GPUS:
        raise InputError(f"{nodes:,} nodes x {gpus_per_node} GPUs = {nodes * gpus_per_node:,} GPUs is over the "
                         f"{MAX_GPUS:,} plantune plans for ({WHY_GPUS}); give fewer GPUs")


def check_model_yaml(data: dict, where: str, model_fields: tuple[str, ...]) -> dict:
    """A plantune model YAML; ``model_fields`` (ModelSpec's) that other modules add pass as plain values (they check
    them)."""
    extra = {name: Scalar() for name in model_fields if name not in MODEL}
    return check(data, {**MODEL, **extra}, where)


__all__ = ["ACCELERATOR", "CALIBRATION", "CLUSTER", "Field", "MODEL", "MAX_GPUS", "MAX_GLOBAL_BATCH", "check",
           "describe", "did_you_mean"]
