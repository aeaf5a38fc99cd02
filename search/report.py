"""What a study measured: per-configuration summaries ranked by measured TFLOPs, tables, JSON, plots.

    >>> from search.report import summarize, format_table
    >>> print(format_table(summarize(records)))

Reads only trial records (`search.objective.TrialRecord`): a study can be reported from its
storage alone (``tune report --study NAME --storage URL``). TFLOPs are model TFLOPs per GPU
(no recompute FLOPs), measured for the full configuration; memory is GB = 1e9 bytes (peak per
rank as the probe measured it: CUDA max allocated on GPUs, RSS on CPU).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from tabulate import tabulate

if TYPE_CHECKING:                      # search.objective imports optuna; reports need only its records
    from search.objective import TrialRecord


CONFIRM_SPREAD = 0.10
"""a re-probed configuration is ``confirmed`` when all its measurements lie within this spread,
(max - min) / median <= 10% (i.e. about +-5% around the median); above it the table marks it unsteady"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSummary:
    config: str
    candidate: dict
    outcome: str
    """ok when any probe measured it, else the first final outcome"""
    reason: str
    tflops: tuple[float, ...]
    """every measurement of it (first probe and confirmations), model TFLOPs per GPU"""
    step_s: float | None
    memory_gb: float | None
    pred_analytic_tflops: float | None
    pred_before_tflops: float | None
    pred_after_tflops: float | None
    trials: tuple[int, ...]
    reprobed: bool = False
    """measured again by confirmation re-probes"""

    @property
    def confirmed(self) -> bool:
        """Re-probed, and every measurement within `CONFIRM_SPREAD` of the others."""
        return self.reprobed and (self.spread or 0.0) <= CONFIRM_SPREAD

    @property
    def agreement(self) -> str:
        """How sure the measurement is, in words."""
        n = len(self.tflops)
        if n <= 1:
            return "one measurement, not confirmed"
        half = 100 * (self.spread or 0.0) / 2
        if self.confirmed:
            return f"confirmed: {n} measurements within ±{half:.1f}%"
        return (f"NOT confirmed: {n} measurements spread ±{half:.1f}% (confirmed needs ±{100 * CONFIRM_SPREAD / 2:g}%); "
                "the machine is noisy: probe again with more --probe-steps")

    @property
    def median_tflops(self) -> float | None:
        return statistics.median(self.tflops) if self.tflops else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the measurements; 0 with one."""
        if not self.tflops:
            return None
        return (max(self.tflops) - min(self.tflops)) / statistics.median(self.tflops)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(median_tflops=self.median_tflops, spread=self.spread, n_measurements=len(self.tflops),
                 confirmed=self.confirmed, agreement=self.agreement)
        return d


def summarize(records: list[TrialRecord]) -> list[ConfigSummary]:
    """One summary per configuration: measured ones by median TFLOPs (best first), then the failures."""
    by_config: dict[str, list[TrialRecord]] = {}
    for r in sorted(records, key=lambda r: r.number):
        if r.config and r.outcome is not None:
            by_config.setdefault(r.config, []).append(r)
    out = []
    for config, rs in by_config.items():
        measured = [r for r in rs if r.measured]
        first = measured[0] if measured else next((r for r in rs if r.final), rs[0])
        out.append(ConfigSummary(
            config=config, candidate=first.attrs.get("candidate", {}),
            outcome="ok" if measured else (first.outcome or "?"),
            reason="" if measured else first.reason,
            tflops=tuple(float(r.value) for r in measured if r.value is not None),
            step_s=statistics.median(float(r.attrs["measured_step_s"]) for r in measured) if measured else None,
            memory_gb=max((float(r.attrs["measured_memory_gb"]) for r in measured
                           if r.attrs.get("measured_memory_gb") is not None), default=None),
            pred_analytic_tflops=first.attrs.get("pred_analytic_tflops"),
            pred_before_tflops=first.attrs.get("pred_before_tflops"),
            pred_after_tflops=first.attrs.get("pred_after_tflops"),
            trials=tuple(r.number for r in rs), reprobed=any(r.phase == "confirm" for r in measured)))
    ok = sorted((s for s in out if s.tflops), key=lambda s: -(s.median_tflops or 0.0))
    failed = sorted((s for s in out if not s.tflops), key=lambda s: (s.outcome, s.config))
    return ok + failed


def best(summaries: list[ConfigSummary]) -> ConfigSummary | None:
    """The best median among confirmed configurations when any were confirmed, else the best measured."""
    confirmed = [s for s in summaries if s.confirmed]
    pool = confirmed or [s for s in summaries if s.tflops]
    return max(pool, key=lambda s: s.median_tflops or 0.0) if pool else None


REASON_WIDTH = 60
"""the reason column wraps at this width (never cut: the fix is at its end)"""


def _f(x: float | None, digits: int = 4) -> str:
    """``digits`` significant digits (CPU probes measure 0.01 TFLOPs, GPUs 150)."""
    return "N/A" if x is None else f"{x:.{digits}g}"


def short(config: str) -> str:
    return ",".join(p for p in config.split(",") if not p.startswith(("dp=", "gas=")))


def format_table(summaries: list[ConfigSummary], *, title: str = "") -> str:
    """The ranked table: measured beside predicted (analytic, before and after this probe's refit)."""
    rows = []
    rank = 0
    for s in summaries:
        if s.tflops:
            rank += 1
        n = len(s.tflops)
        spread = f"±{100 * (s.spread or 0) / 2:.1f}% (n={n})" if n > 1 else ("n=1" if n else "")
        mark = " ✓" if s.confirmed else (" ?" if s.reprobed else "")
        rows.append([rank if s.tflops else "-", short(s.config), s.outcome + mark,
                     _f(s.median_tflops), spread, _f(s.step_s), _f(s.memory_gb, 3),
                     _f(s.pred_analytic_tflops), _f(s.pred_before_tflops), _f(s.pred_after_tflops), s.reason])
    headers = ["#", "configuration", "outcome", "measured TFLOPs", "spread", "step s", "mem GB",
               "pred analytic", "pred before", "pred after", "reason"]
    table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True,
                     maxcolwidths=[None] * 10 + [REASON_WIDTH])
    note = (f"TFLOPs: model TFLOPs per GPU (median of measurements); ✓ confirmed: re-probed and all measurements "
            f"within ±{100 * CONFIRM_SPREAD / 2:g}% of each other; ? re-probed but they disagree more (noisy); "
            "pred before/after: calibrated prediction before and after that probe's measurement; "
            "mem GB = 1e9 bytes, peak per rank")
    return "\n".join(x for x in (title, table, note) if x)


def format_trials(records: list[TrialRecord]) -> str:
    """One row per trial: what each probe predicted before, after its refit, and measured."""
    rows = []
    for r in sorted(records, key=lambda r: r.number):
        a = r.attrs
        rows.append([r.number, r.phase, short(r.config or "?"), r.outcome or r.state,
                     _f(r.value if r.state == "COMPLETE" else None), _f(a.get("pred_before_tflops")),
                     _f(a.get("pred_after_tflops")), _f(a.get("probe_wall_s"), 3), r.reason])
    return tabulate(rows, headers=["trial", "phase", "configuration", "outcome", "measured TFLOPs", "pred before",
                                   "pred after", "probe s", "reason"], tablefmt="simple", disable_numparse=True,
                    maxcolwidths=[None] * 8 + [REASON_WIDTH])


def report_dict(records: list[TrialRecord], *, study: str, storage: str) -> dict:
    summaries = summarize(records)
    b = best(summaries)
    return {"study": study, "storage": storage, "best": b.to_dict() if b else None,
            "configs": [s.to_dict() for s in summaries],
            "trials": [{"number": r.number, "state": r.state, "phase": r.phase, "config": r.config,
                        "outcome": r.outcome, "reason": r.reason, "value": r.value,
                        **{k: v for k, v in r.attrs.items() if k.startswith(("measured_", "pred_", "calibration"))}}
                       for r in records],
            "dashboard": f"optuna-dashboard {storage}"}


# -- plots ------------------------------------------------------------------------------------------

def _figure(width: float = 7.0, height: float = 4.5):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def write_plots(records: list[TrialRecord], out_dir: Path, *, study: str = "") -> list[Path]:
    """history.png, predicted_vs_measured.png, tflops_by_layout.png in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    measured = [r for r in sorted(records, key=lambda r: r.number) if r.measured and r.value is not None]
    failed = [r for r in records if r.state == "FAIL" and r.outcome not in (None, "interrupted")]
    paths = []

    fig = _figure()
    ax = fig.add_subplot()
    if measured:
        xs = [r.number for r in measured]
        ys = [r.value for r in measured]
        ax.scatter(xs, ys, label="measured", color="tab:blue", zorder=3)
        best, run_x, run_y = float("-inf"), [], []
        for x, y in zip(xs, ys):
            best = max(best, y)
            run_x.append(x)
            run_y.append(best)
        ax.step(run_x, run_y, where="post", label="best so far", color="tab:green")
    if failed:
        ax.scatter([r.number for r in failed], [0.0] * len(failed), marker="x", color="tab:red",
                   label="failed (oom/timeout/crash/implied)")
    ax.set_xlabel("trial")
    ax.set_ylabel("model TFLOPs per GPU")
    ax.set_title(f"optimization history {study}".strip())
    ax.legend(loc="lower right")
    paths.append(out_dir / "history.png")
    fig.savefig(paths[-1])

    fig = _figure(5.5, 5.5)
    ax = fig.add_subplot()
    lim = 0.0
    for key, label, color in (("pred_analytic_tflops", "analytic", "tab:gray"),
                              ("pred_before_tflops", "calibrated, before the probe", "tab:orange"),
                              ("pred_after_tflops", "calibrated, after the probe", "tab:blue")):
        pts = [(float(r.attrs[key]), float(r.value)) for r in measured if r.attrs.get(key) is not None]
        if pts:
            ax.scatter([p for p, _ in pts], [m for _, m in pts], label=label, color=color, alpha=0.8)
            lim = max(lim, max(max(p, m) for p, m in pts))
    if lim:
        ax.plot([0, lim * 1.05], [0, lim * 1.05], color="black", linewidth=0.8, label="measured = predicted")
        ax.legend(loc="upper left")
    ax.set_xlabel("predicted model TFLOPs per GPU")
    ax.set_ylabel("measured model TFLOPs per GPU")
    ax.set_title("predicted vs measured")
    paths.append(out_dir / "predicted_vs_measured.png")
    fig.savefig(paths[-1])

    fig = _figure(10.0, 3.8)
    for i, name in enumerate(("tp", "pp", "mbs")):
        ax = fig.add_subplot(1, 3, i + 1)
        pts = [(r.attrs.get("candidate", {}).get(name), r.value) for r in measured]
        pts = [(x, y) for x, y in pts if x is not None]
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], color="tab:blue", alpha=0.8)
            ax.set_xscale("log", base=2)
        ax.set_xlabel(name.upper())
        if i == 0:
            ax.set_ylabel("model TFLOPs per GPU")
    fig.suptitle("measured TFLOPs by TP / PP / MBS")
    fig.tight_layout()
    paths.append(out_dir / "tflops_by_layout.png")
    fig.savefig(paths[-1])
    return paths


__all__ = ["ConfigSummary", "best", "format_table", "format_trials", "report_dict", "short", "summarize", "write_plots"]
