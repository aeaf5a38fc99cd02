"""Shared helpers for the probes tests: a tiny fp32 GPT spec that runs in seconds on CPU.

    from conftest_probes import tiny_spec, no_process_left
"""

from __future__ import annotations

from planner.model import ModelSpec
from planner.space import Candidate
from probes.result import ProbeResult, ProbeSpec

TINY = dict(name="tiny", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=128, seq_len=32,
            tied_embeddings=False)
"""4 layers, hidden 64, 4 heads, seq 32, vocab 128; untied so every layout builds the same weights"""
PROBE_TIMEOUT_S = 300.0


def tiny_model(**changes: object) -> ModelSpec:
    return ModelSpec(**{**TINY, **changes})


def tiny_spec(*, model: ModelSpec | None = None, warmup_steps: int = 1, steps: int = 3, max_cv: float = 100.0,
              pp_schedule: str = "1F1B", layers_run: int | None = None, precision: str = "fp32",
              **candidate: object) -> ProbeSpec:
    """A ProbeSpec for the tiny model; ``candidate`` keys as `planner.space.Candidate` (defaults 1, mbs 2)."""
    c = {"tp": 1, "pp": 1, "dp": 1, "mbs": 2, "gas": 2, **candidate}
    return ProbeSpec(model=(model or tiny_model()).to_dict(), candidate=Candidate(**c).to_dict(),
                     precision=precision, warmup_steps=warmup_steps, steps=steps, max_cv=max_cv,
                     pp_schedule=pp_schedule, layers_run=layers_run, device="cpu")


def no_process_left(result: ProbeResult) -> list[int]:
    """The probe's recorded pids (torchrun and workers) that still run; [] when all are gone."""
    import psutil

    alive = []
    for pid in result.extra.get("pids", []):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive
