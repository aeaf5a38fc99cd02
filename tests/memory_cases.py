"""Dev-data runs with a memory outcome, as planner inputs: Hagemann et al.'s 422 Llama-13B rows (ran / OOM),
BLOOM tr11 and tr8-104B nvidia-smi maxima, torchtitan and fms-fsdp runs (ran, so they must fit).

Shared by tests/test_memory_published.py and tests/bench/memory_fit.py. The rows (tests/data copies of
../shared/data/hagemann_13b_dev.yaml and published_dev.yaml) become planner inputs in search.published_runs,
the one home of that conversion and its assumptions; this module only picks the runs with a memory outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.space import Candidate, TrainingSpec
from published import runs_of
from search.published_runs import PublishedRun


@dataclass(frozen=True)
class MemoryCase:
    id: str
    table: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    cand: Candidate
    ran: bool
    """the run trained (False: the source reports an out-of-memory error)"""
    measured_gib: float | None = None
    """peak memory per GPU in GiB as the source measured it (None: not recorded)"""
    definition: str = ""
    """what the measurement counts: nvidia-smi (context and allocator cache included) | peak allocated"""


def _case(r: PublishedRun, table: str) -> MemoryCase:
    return MemoryCase(id=r.id, table=table, model=r.model, cluster=r.cluster, training=r.training, cand=r.cand,
                      ran=not r.oom, measured_gib=r.memory_gib, definition=r.memory_definition)


def _dev_runs() -> tuple[PublishedRun, ...]:
    return runs_of("published_dev.yaml")


def _group(r: PublishedRun) -> str:
    return {"Megatron-DeepSpeed": "bigscience", "FSDP/torchtitan": "torchtitan_2024_04_a100",
            "FSDP/fms-fsdp": "fms_fsdp_llama2_a100_h100"}.get(r.framework, r.framework)


def hagemann_cases() -> list[MemoryCase]:
    """Hagemann et al. 2023 sheets (A100-80GB), one table per sheet."""
    return [_case(r, r.table.removeprefix("Hagemann ")) for r in runs_of("hagemann_13b_dev.yaml")]


def bigscience_cases() -> list[MemoryCase]:
    """BLOOM tr11 prequel (48x8 A100-80GB) and tr8-104B (V100-32GB): nvidia-smi's maximum on the first node."""
    out = []
    for r in _dev_runs():
        if r.table.startswith("bloom tr11"):
            out.append(_case(r, "bloom176b_tr11_prequel_topology_search"))
        elif r.table.startswith("bigscience tr8"):
            out.append(_case(r, "bigscience_tr8_104b_v100_tuning"))
    return out


def fsdp_cases() -> list[MemoryCase]:
    """torchtitan 2024-04 (FSDP2 on 64 A100) and fms-fsdp (FSDP/HSDP on A100/H100): every listed run trained;
    torchtitan's footnote OOM (Llama-2 70B at local batch 2, selective AC) as a run that did not."""
    return [_case(r, _group(r)) for r in _dev_runs() if r.framework.startswith("FSDP/")]


def all_cases() -> list[MemoryCase]:
    return hagemann_cases() + bigscience_cases() + fsdp_cases()
