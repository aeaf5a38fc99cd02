"""What a `tune calibrate` file changes in the planner's figures for one machine (`plan --calibration FILE`).

    >>> cluster = apply_calibration(make_cluster(gpu="H200", gpus=8), "calibration.yaml")

- GEMMs: the file's timed GEMM shapes (``measurements.matmul``: m, n, k, seconds, dtype) fit the *base* efficiency
  of the planner's own shape model (`planner.ops.gemm_efficiency`: tile, wave and short-k penalties), so that
  the model reproduces the measured total time of those shapes; every other shape keeps its tile/wave effects
  (one flat measured rate would give MBS 2, 4 and 8 one prediction). A file without timed shapes (hand-written)
  gives its ``matmul_efficiency`` as that base.
- Host: ``host_s_per_layer_forward``, the time to launch one transformer layer's forward (the probes' layer,
  `probes.gpt.Block`, at negligible FLOPs, forward + backward / 3), scales every framework's fitted host constant
  by ``measured / HOST_REFERENCE_S`` (the probes' layer is a Megatron-style one: fused SwiGLU, SDPA).
- Element-wise: ``measurements.elementwise`` (a large add timed: bytes moved / seconds) over the catalog's HBM
  bandwidth gives ``ClusterSpec.elementwise_efficiency`` (in place of planner.constants.ELEMENTWISE_BW_EFFICIENCY):
  every memory-bound op of the list, the loss, the optimizer step. A hand-written ``elementwise_efficiency`` when
  nothing was timed.
- Attention: ``measurements.attention`` (scaled_dot_product_attention, causal, the model's heads and head_dim at
  the plan's sequence length, forward + backward) gives ``ClusterSpec.attention_efficiency``: the op list's
  attention FLOPs (QK^T and AV over the full s x s square, 3x for forward + backward: `attention_flops`) per
  second over the dtype's catalog peak; the ATTENTION ops then run at that rate (flash attention only).
- Network: measured all-reduce bus bandwidths used as measured; ``cuda_context_bytes``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.constants import ELEMENTWISE_BW_EFFICIENCY, MEGATRON_HOST_S
from planner.ops import GemmContext, gemm_s
from planner.files import read_mapping
from planner.framework import get_framework
from planner.errors import InputError
from planner.hardware import Accelerator, ClusterSpec, accelerator_from
from planner.schema import CALIBRATION, check

HOST_REFERENCE_S = MEGATRON_HOST_S
"""the planner's host time per layer forward for a Megatron-style layer (planner.constants.MEGATRON_HOST_S, fitted
on V100 hosts): the figure a measured probe layer's host time is compared with"""
DTYPE_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
"""torch dtype name in the file -> the catalog peak the GEMM ran against"""


def gemm_base_efficiency(acc: Accelerator, rows: list[dict]) -> float:
    """Base efficiency b with sum_i model_seconds_i(b) = sum_i measured_seconds_i over the timed GEMMs, where
    model_seconds_i(b) = model_seconds_i(1) / b is the planner's GEMM time at the catalog peak of the dtype measured
    (`planner.ops.gemm_s`: tile, wave and short-k penalties, misaligned shapes)."""
    model_s = measured_s = 0.0
    for r in rows:
        peak = acc.peak_flops(DTYPE_PRECISION.get(str(r.get("dtype")), "bf16"))
        g = GemmContext(peak=peak, sm_count=acc.sm_count, base=1.0, cuda_core_ratio=1.0)
        model_s += gemm_s(int(r["m"]), int(r["n"]), int(r["k"]), g)
        measured_s += float(r["seconds"])
    return model_s / measured_s


def _timed_gemms(d: dict) -> list[dict]:
    rows = (d.get("measurements") or {}).get("matmul") if isinstance(d.get("measurements"), dict) else None
    keep = []
    for r in rows or []:
        try:
            if min(int(r["m"]), int(r["n"]), int(r["k"])) > 0 and 0 < float(r["seconds"]) < math.inf:
                keep.append(r)
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
    return keep


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float:
    """Forward + backward FLOPs of one attention core as the op list counts them (planner.ops.layer_ops'
    attn_scores and attn_values: 2·s·s·d each per head, the full square; backward 2x forward)."""
    return 3 * 2 * (2.0 * seq_len * seq_len * head_dim) * batch * heads


def _positive(row: dict, *keys: str) -> bool:
    try:
        return all(0 < float(row[k]) < math.inf for k in keys)
    except (KeyError, TypeError, ValueError, OverflowError):
        return False


def _timed(d: dict, name: str, *keys: str) -> dict | None:
    """``measurements.<name>`` when it is a mapping with every one of ``keys`` a positive number."""
    m = d.get("measurements")
    row = m.get(name) if isinstance(m, dict) else None
    return row if isinstance(row, dict) and _positive(row, *keys) else None


def elementwise_fraction(acc: Accelerator, row: dict) -> float:
    """The timed memory-bound kernel's bytes/s over the catalog's HBM bandwidth."""
    return float(row["bytes"]) / float(row["seconds"]) / acc.memory_bw_bytes_per_s


def attention_fraction(acc: Accelerator, row: dict) -> float:
    """The timed attention core's `attention_flops` per second over the catalog peak of the dtype it ran in."""
    peak = acc.peak_flops(DTYPE_PRECISION.get(str(row.get("dtype")), "bf16"))
    flops = attention_flops(int(row["batch"]), int(row["heads"]), int(row["seq_len"]), int(row["head_dim"]))
    return flops / float(row["forward_backward_s"]) / peak


def apply_calibration(cluster: ClusterSpec, path: str) -> ClusterSpec:
    """``cluster`` with a calibration YAML's figures (keys all optional; module docstring)."""
    d = check(read_mapping(path, "calibration file"), CALIBRATION, f"calibration YAML {path}")
    changes: dict = {}
    notes: list[str] = []
    if "gpu" in d:   # GPU YAML keys measured or known on this machine replace the accelerator's figures
        if not isinstance(d["gpu"], dict):
            raise InputError(f"calibration YAML {path}: gpu must be a mapping of GPU YAML keys to replace on "
                             f"{cluster.gpu.id} (e.g. gpu: {{memory_gib: 96}}), got {d['gpu']!r}")
        changes["gpu"] = accelerator_from({"id": cluster.gpu.id, **d["gpu"], "base": cluster.gpu.id},
                                          f"calibration YAML {path}: gpu", known={cluster.gpu.id: cluster.gpu})
    gpu = changes.get("gpu", cluster.gpu)
    rows = _timed_gemms(d)
    if rows:
        base = gemm_base_efficiency(gpu, rows)
        changes["matmul_efficiency"] = min(base, 1.0)
        dtypes = "/".join(sorted({DTYPE_PRECISION.get(str(r.get("dtype")), "bf16") for r in rows}))
        notes.append(f"GEMM base efficiency {base:.3g} fitted to {len(rows)} {dtypes} GEMM shapes timed by tune "
                     f"calibrate (catalog {gpu.gemm_efficiency:g}; calibrate in the plan's --precision)" + (
                         f", used as 1: the catalog's {gpu.id} peak is below what this machine ran"
                         if base > 1 else ""))
    elif "matmul_efficiency" in d:
        changes["matmul_efficiency"] = float(d["matmul_efficiency"])
        notes.append(f"GEMM base efficiency {d['matmul_efficiency']:g} from the file's matmul_efficiency "
                     f"(no timed shapes in it; catalog {gpu.gemm_efficiency:g})")
    ew = _timed(d, "elementwise", "bytes", "seconds")
    if ew is not None:
        frac = elementwise_fraction(gpu, ew)
        changes["elementwise_efficiency"] = min(frac, 1.0)
        notes.append(f"element-wise at {frac:.3g} of HBM bandwidth ({float(ew['bytes']) / float(ew['seconds']) / 1e9:.3g}"
                     f" GB/s timed; constant {ELEMENTWISE_BW_EFFICIENCY:g})" + (
                         f", used as 1: the catalog's {gpu.id} bandwidth is below what this machine ran"
                         if frac > 1 else ""))
    elif "elementwise_efficiency" in d:
        changes["elementwise_efficiency"] = float(d["elementwise_efficiency"])
        notes.append(f"element-wise at {d['elementwise_efficiency']:g} of HBM bandwidth from the file's "
                     f"elementwise_efficiency (constant {ELEMENTWISE_BW_EFFICIENCY:g})")
    att = _timed(d, "attention", "batch", "heads", "seq_len", "head_dim", "forward_backward_s")
    if att is not None:
        frac = attention_fraction(gpu, att)
        changes["attention_efficiency"] = frac
        notes.append(f"attention core at {frac:.3g} of peak in the op list's FLOPs (timed: {att['heads']} heads x "
                     f"{att['head_dim']}, sequence {att['seq_len']}, forward + backward; flash attention plans)")
    elif "attention_efficiency" in d:
        changes["attention_efficiency"] = float(d["attention_efficiency"])
        notes.append(f"attention core at {d['attention_efficiency']:g} of peak from the file's attention_efficiency")
    if "host_s_per_layer_forward" in d:
        host = float(d["host_s_per_layer_forward"])
        changes["host_scale"] = host / HOST_REFERENCE_S
        notes.append(f"host launch {host * 1e3:.3g} ms per layer forward measured, x{host / HOST_REFERENCE_S:.3g} "
                     "the fitted constant")
    # measured bus bandwidths are used as measured: no link-efficiency derate (planner.topology)
    if "intra_node_busbw_gbps" in d:
        changes["intra_node_bw_bytes_per_s"] = float(d["intra_node_busbw_gbps"]) * 1e9 / 8
        changes["intra_node_bw_measured"] = True
    if "inter_node_busbw_gbps" in d:
        changes["inter_node_bw_bytes_per_s"] = float(d["inter_node_busbw_gbps"]) * 1e9 / 8 * cluster.gpus_per_node
        changes["inter_node_bw_measured"] = True
        changes["network"] = f"measured by tune calibrate ({path})"
    if "cuda_context_bytes" in d:
        changes["cuda_context_bytes"] = float(d["cuda_context_bytes"])
    changes["calibration"] = f"{path}: " + "; ".join(notes) if notes else path
    return replace(cluster, **changes)


def compute_line(cluster: ClusterSpec, framework: str) -> str:
    """The GEMM and host figures a plan assumed, in one line, with where they came from."""
    acc = cluster.gpu
    calibrated = cluster.matmul_efficiency is not None
    base = cluster.matmul_efficiency if calibrated else acc.gemm_efficiency
    host = get_framework(framework).host_s_per_layer_forward * cluster.host_scale
    where = (f"calibrated ({cluster.calibration})" if cluster.calibration else
             f"catalog {acc.id} and {framework}'s host constant, fitted on V100 hosts; measure this machine with "
             "tune calibrate, then plan --calibration FILE")
    timed = ("" if cluster.elementwise_efficiency is None else
             f"; element-wise at {cluster.elementwise_efficiency:.3g} of HBM bandwidth")
    timed += ("" if cluster.attention_efficiency is None else
              f"; flash attention at {cluster.attention_efficiency:.3g} of peak")
    return (f"compute: large GEMMs at {base:.3g} of peak, less tile/wave/short-k losses per shape{timed}; host "
            f"launch {host * 1e3:.3g} ms per layer forward; {where}")


__all__ = ["HOST_REFERENCE_S", "apply_calibration", "attention_flops", "attention_fraction", "compute_line",
           "elementwise_fraction", "gemm_base_efficiency"]
