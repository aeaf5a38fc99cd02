"""Where the GPU-hours went: each probe's phases x the GPUs it held, per phase and per probe; a table and a plot.

    >>> print(format_phases(records))                  # tune report
    >>> steps_line(records, reservation_gpu_s=...)     # tune's final line: the share that measured steps

A probe records its phases (`probes.result.PHASES`: queue, launch, rendezvous, build, warmup, steps, teardown)
in its trial (``phases``, seconds) and the processes it ran (``probe_gpus``, one GPU each). A probe without
phases (a backend that does not report them, e.g. the user's Megatron command) counts its whole wall time as
``other``. GPU-hours = seconds x GPUs / 3600. Reads only trial records, like `search.report`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tabulate import tabulate

from probes.result import PHASES

if TYPE_CHECKING:
    from search.objective import TrialRecord

COLUMNS = (*PHASES, "other")
"""the phases, then the wall time of a probe that did not report its phases"""
PHASE_COLORS = {"queue": "tab:gray", "launch": "tab:brown", "rendezvous": "tab:purple", "build": "tab:orange",
                "warmup": "gold", "steps": "tab:green", "teardown": "tab:red", "other": "lightgray"}


def probed(records: list[TrialRecord]) -> list[TrialRecord]:
    """The trials that ran a probe of their own (not answered from storage), in trial order."""
    return [r for r in sorted(records, key=lambda r: r.number)
            if "probe_wall_s" in r.attrs and "duplicate_of" not in r.attrs]


def gpus_of(record: TrialRecord) -> int:
    """GPUs (processes) the probe held: as it recorded, else its candidate's world, else 1."""
    n = record.attrs.get("probe_gpus")
    if n:
        return int(n)
    c = record.attrs.get("candidate") or {}
    world = int(c.get("tp", 1)) * int(c.get("pp", 1)) * int(c.get("dp", 1)) * int(c.get("cp", 1))
    return max(world, 1)


def phase_seconds(record: TrialRecord) -> dict[str, float]:
    """Seconds of the probe by phase; a probe without phases: its wall time as ``other``."""
    phases = record.attrs.get("phases") or {}
    if phases:
        return {k: float(v) for k, v in phases.items() if k in COLUMNS and v}
    wall = float(record.attrs.get("probe_wall_s") or 0.0)
    return {"other": wall} if wall > 0 else {}


def gpu_seconds(records: list[TrialRecord]) -> dict[str, float]:
    """GPU-seconds per phase over the probes of ``records``."""
    out = {k: 0.0 for k in COLUMNS}
    for r in probed(records):
        g = gpus_of(r)
        for k, v in phase_seconds(r).items():
            out[k] += v * g
    return out


def format_phases(records: list[TrialRecord], *, per_probe: bool = True) -> str:
    """GPU-hours per phase (total and share), then one row per probe (seconds per phase, its GPUs and GPU-hours)."""
    from search.report import short
    rows = probed(records)
    if not rows:
        return "GPU-hours by phase: no probe ran"
    totals = gpu_seconds(records)
    cols = [k for k in COLUMNS if totals[k] > 0] or ["steps"]
    grand = sum(totals.values())
    lines = [f"GPU-hours by phase ({len(rows)} probes, {grand / 3600:.4g} GPU-h in all)",
             tabulate([[k, f"{totals[k] / 3600:.4g}", f"{100 * totals[k] / grand:.1f}%" if grand else "-"]
                       for k in cols], headers=["phase", "GPU-h", "share"], tablefmt="simple", disable_numparse=True)]
    if per_probe:
        table = []
        for r in rows:
            secs = phase_seconds(r)
            g = gpus_of(r)
            table.append([r.number, short(r.config or "?"), r.outcome or r.state, g,
                          *(f"{secs[k]:.3g}" if secs.get(k) else "" for k in cols),
                          f"{sum(secs.values()) * g / 3600:.3g}"])
        lines += ["", "per probe (seconds by phase)",
                  tabulate(table, headers=["trial", "configuration", "outcome", "GPUs", *cols, "GPU-h"],
                           tablefmt="simple", disable_numparse=True)]
    return "\n".join(lines)


def steps_share(records: list[TrialRecord], reservation_gpu_s: float) -> tuple[float, float]:
    """(GPU-seconds of measured steps of ``records``' probes, their share of ``reservation_gpu_s``)."""
    steps = gpu_seconds(records)["steps"]
    return steps, (steps / reservation_gpu_s if reservation_gpu_s > 0 else 0.0)


def steps_line(records: list[TrialRecord], *, reservation_gpu_s: float, gpus: int, elapsed_s: float) -> str:
    """The final line: what share of the reservation (``gpus`` x ``elapsed_s``) measured steps."""
    steps, share = steps_share(records, reservation_gpu_s)
    probes = gpu_seconds(records)
    return (f"measured steps took {100 * share:.1f}% of the reservation ({steps / 3600:.3g} of "
            f"{reservation_gpu_s / 3600:.3g} GPU-h: {gpus} GPUs x {elapsed_s:.0f} s; probes held "
            f"{sum(probes.values()) / 3600:.3g} GPU-h); tune report shows where the rest went")


def plot_phases(records: list[TrialRecord], path: Path, study: str = "") -> None:
    """Where did the GPU-hours go? One bar per probe, its GPU-hours stacked by phase; the totals in the legend."""
    from search.report import _figure, _legend_outside      # the report's figure helpers (no pyplot)

    rows = probed(records)
    totals = gpu_seconds(records)
    cols = [k for k in COLUMNS if totals[k] > 0]
    fig = _figure(8.5, 4.5)
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        secs, g, left = phase_seconds(r), gpus_of(r), 0.0
        for k in cols:
            v = secs.get(k, 0.0) * g / 3600
            if v:
                ax.barh(i, v, left=left, color=PHASE_COLORS[k], edgecolor="white", linewidth=0.3)
                left += v
    grand = sum(totals.values())
    for k in cols:
        ax.barh([], [], color=PHASE_COLORS[k],
                label=f"{k}: {totals[k] / 3600:.3g} GPU-h ({100 * totals[k] / grand:.0f}%)" if grand else k)
    ax.set_yticks(range(len(rows)), [f"{r.number} {(r.outcome or r.state)}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GPU-hours (phase seconds x GPUs / 3600)")
    ax.set_ylabel("trial, outcome")
    ax.set_title(f"Where did the GPU-hours go? {study}".strip(), fontsize=10)
    if not rows:
        ax.text(0.5, 0.5, "no probe ran", transform=ax.transAxes, ha="center", va="center", color="gray")
    _legend_outside(ax)
    fig.savefig(path)


PLOT = "gpu_hours_by_phase.png"

__all__ = ["COLUMNS", "PLOT", "format_phases", "gpu_seconds", "gpus_of", "phase_seconds", "plot_phases", "probed",
           "steps_line", "steps_share"]
