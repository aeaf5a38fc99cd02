"""The probes' CUDA path on one GPU: allocator and context memory, OOM, kernel timing split, NCCL names.

    python -m pytest -q tests/test_probes_cuda.py      # skips without a CUDA device (CI has none)

Everything here needs a CUDA device and skips cleanly without one. One GPU allows one rank per
process group (NCCL refuses two ranks on one device), so the multi-rank NCCL layouts are checked
on CPU/gloo by the other probe tests through the same code; here the single-rank CUDA path runs
for real, and the NCCL kernels' names are read from the profiler of a one-rank NCCL group.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from conftest_probes import PROBE_TIMEOUT_S, tiny_model, tiny_spec
from planner.hardware import catalog_id_for_device, make_cluster
from planner.memory import stage_memory
from planner.space import Candidate, TrainingSpec

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip(f"torch {torch.__version__} sees no CUDA device", allow_module_level=True)

from probes.extent import resolve_probe  # noqa: E402
from probes.launch import run_local  # noqa: E402
from probes.train import _comm_kind, run_probe  # noqa: E402

MEDIUM = dict(layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=8192, seq_len=512)
"""~59M parameters: big enough that the allocator's peaks dwarf its rounding, small enough for seconds"""


def cuda_spec(**kw):
    spec = tiny_spec(model=tiny_model(**MEDIUM), **{"mbs": 2, "gas": 1, **kw})
    return replace(spec, device="cuda")


def _planned(spec, precision):
    m = tiny_model(**MEDIUM)
    cand = Candidate(**spec.candidate)
    cluster = make_cluster(gpu=catalog_id_for_device(torch.cuda.get_device_name(0)), gpus_per_node=8, nodes=1)
    training = TrainingSpec(global_batch=cand.global_batch, seq_len=m.seq_len, precision=precision,
                            framework="megatron-lm")
    (only,) = stage_memory(m, cand, cluster, training)
    return only


def test_cuda_probe_reports_allocator_and_context_memory(tmp_path):
    spec = replace(cuda_spec(precision="bf16"), profile=True)
    r = run_local(spec, nproc=1, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    assert torch.cuda.get_device_name(0) in r.device
    rec = r.memory_per_rank[0]
    assert 0 < rec["peak_allocated_bytes"] <= rec["peak_reserved_bytes"]
    assert rec["context_bytes"] > 100 * 2**20            # a CUDA context is hundreds of MiB
    assert rec["non_allocator_bytes"] >= rec["context_bytes"] * 0.5
    plan = _planned(spec, "bf16")
    # fp32 master weights, fp32 grads and Adam's two moments are held tensors: exactly the planner's bytes
    assert rec["grads_bytes"] == plan.grads_bytes and rec["optimizer_bytes"] == plan.optimizer_bytes
    # the peak holds at least the model states the planner counts, and not more than its total
    states = plan.grads_bytes + plan.optimizer_bytes
    assert states < rec["peak_allocated_bytes"] < plan.total_bytes
    split = r.timing_split
    assert split["source"] == "cuda kernels"
    assert 0 < split["compute_s"] <= split["step_s"] * 1.05, split
    assert split["comm_s_by_collective"] == {}, split    # one rank: no collective runs


def test_cuda_losses_do_not_depend_on_the_micro_batch_split():
    """The same global batch as 2x2, 4x1 and 1x4 (full recompute) micro-batches gives the same fp32 losses.
    (Initial values are drawn by the device's generator: CUDA and CPU runs start from different weights.)"""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    losses = {}
    for mbs, gas, recompute in ((2, 2, "none"), (4, 1, "none"), (1, 4, "full")):
        spec = cuda_spec(precision="fp32", mbs=mbs, gas=gas, recompute=recompute)
        layout, ext = resolve_probe(spec, world=1)
        r = run_probe(spec, layout, 0, 1, torch.device("cuda", 0), time.time(), ext)
        losses[(mbs, gas, recompute)] = r.losses
    first, *rest = losses.values()
    assert len(first) > 0
    for other in rest:
        assert other == pytest.approx(first, rel=1e-4), losses


def test_full_recompute_lowers_the_cuda_peak(tmp_path):
    peaks = {}
    for recompute in ("none", "full"):
        spec = cuda_spec(precision="bf16", mbs=8, recompute=recompute)
        r = run_local(spec, nproc=1, workdir=tmp_path / recompute, timeout_s=PROBE_TIMEOUT_S)
        assert r.status == "ok", r.reason
        peaks[recompute] = r.memory_per_rank[0]["peak_allocated_bytes"]
    assert peaks["full"] < 0.8 * peaks["none"], peaks


def test_a_model_larger_than_the_gpu_is_recorded_as_oom(tmp_path):
    free, total = torch.cuda.mem_get_info(0)
    huge = tiny_model(layers=64, hidden=8192, heads=64, kv_heads=64, ffn_hidden=32768, vocab=32000, seq_len=512)
    assert huge.params * 4 > total                       # fp32 weights alone exceed the device
    spec = replace(tiny_spec(model=huge, mbs=1, gas=1, precision="bf16"), device="cuda")
    r = run_local(spec, nproc=1, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert r.status == "oom", (r.status, r.reason)
    assert "memory" in r.reason.lower()


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def test_nccl_kernel_names_are_classified_by_collective():
    """The profiler's NCCL kernel names on this GPU map to the collective that launched them."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        ops = {"all_reduce": lambda: dist.all_reduce(x),
               "all_gather": lambda: dist.all_gather_into_tensor(out, x),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, x),
               "all_to_all": lambda: dist.all_to_all_single(out, x),
               "broadcast": lambda: dist.broadcast(x, src=0)}
        seen: dict[str, list[str]] = {}
        for op, call in ops.items():
            call()                                       # warm: the communicator is made outside the profile
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            seen[op] = sorted({e.name for e in prof.events()
                               if e.device_type != torch.autograd.DeviceType.CPU})
        print("device events per collective (1-rank NCCL):", seen)
        nccl = {op: [n for n in names if "nccl" in n.lower()] for op, names in seen.items()}
        assert any(nccl.values()), seen
        for op, names in nccl.items():
            for name in names:
                assert _comm_kind(name) == op, (op, name)
    finally:
        dist.destroy_process_group()
