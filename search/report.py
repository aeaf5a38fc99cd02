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
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from tabulate import tabulate

from search._base import PICK_PHASE

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
    ok = sorted((s for s in out if s.tflops), key=rank_key)
    failed = sorted((s for s in out if not s.tflops), key=lambda s: (s.outcome, s.config))
    return ok + failed


def rank_key(s: ConfigSummary) -> tuple[bool, float]:
    """The one ranking of measured configurations (the table's rows, the final line, `tune report`, history.png):
    confirmed ones (re-probes agree) before the rest, each group by median measured TFLOPs. A once-measured or
    noisy row above a confirmed one would be ranked on a figure nobody checked."""
    return (not s.confirmed, -(s.median_tflops or 0.0))


def best(summaries: list[ConfigSummary]) -> ConfigSummary | None:
    """Row 1 of the ranking (`rank_key`): the best median among confirmed configurations when any were confirmed,
    else the best measured."""
    pool = [s for s in summaries if s.tflops]
    return min(pool, key=rank_key) if pool else None


def best_line(summaries: list[ConfigSummary]) -> str | None:
    """The best configuration in one line (tune's final line and `tune report`), or None when nothing was measured."""
    b = best(summaries)
    if b is None:
        return None
    return (f"best {b.config}: {b.median_tflops:.3g} model TFLOPs/GPU measured"
            + (f" (median of {len(b.tflops)}, {b.agreement})" if len(b.tflops) > 1 else
               " (one measurement, not confirmed)"))


REASON_WIDTH = 60
"""the reason column wraps at this width (never cut: the fix is at its end)"""


def _f(x: float | None, digits: int = 4) -> str:
    """``digits`` significant digits (CPU probes measure 0.01 TFLOPs, GPUs 150)."""
    return "N/A" if x is None else f"{x:.{digits}g}"


def short(config: str) -> str:
    """The configuration without gas (GBS / (mbs x dp) gives it); dp stays, as the layout's third degree."""
    return ",".join(p for p in config.split(",") if not p.startswith("gas="))


def format_table(summaries: list[ConfigSummary], *, title: str = "", width: int | None = None) -> str:
    """The ranked table: measured beside predicted (analytic, before and after this probe's refit). With ``width``
    (a terminal's columns) narrower than the table, `format_table_narrow`'s form."""
    if width is not None:
        wide = format_table(summaries, title=title)
        if max(len(line) for line in wide.splitlines()) > width:
            return format_table_narrow(summaries, title=title, width=width)
        return wide
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
    note = (f"#: confirmed rows first, then by measured TFLOPs: model TFLOPs per GPU (median of measurements); "
            "✓ confirmed: re-probed and all measurements "
            f"within ±{100 * CONFIRM_SPREAD / 2:g}% of each other; ? re-probed but they disagree more (noisy); "
            "pred before/after: calibrated prediction before and after that probe's measurement; "
            "mem GB = 1e9 bytes, peak per rank")
    return "\n".join(x for x in (title, table, note) if x)


def format_table_narrow(summaries: list[ConfigSummary], *, title: str = "", width: int = 80) -> str:
    """The ranked table for a narrow terminal: rank, configuration (`brief` form, wrapped), outcome, measured TFLOPs
    with its spread, the calibrated prediction after the refit; the reasons below the table, one folded paragraph
    per row that has one (the wide table's other predictions: `tune report --format json`, or a wider terminal)."""
    from search.progress import INDENT, brief, fold

    rows, reasons, rank = [], [], 0
    for s in summaries:
        if s.tflops:
            rank += 1
        n = len(s.tflops)
        mark = " ✓" if s.confirmed else (" ?" if s.reprobed else "")
        key = str(rank) if s.tflops else "-"
        rows.append([key, brief(s.config), s.outcome + mark, _f(s.median_tflops),
                     f"±{100 * (s.spread or 0) / 2:.1f}% n={n}" if n > 1 else ("n=1" if n else ""),
                     _f(s.pred_after_tflops)])
        if s.reason:
            repeats = (s.reason or "").split(" ", 1)[0].rstrip(":") == s.outcome     # "pruned after ...": said once
            said = s.reason if repeats else f"{s.outcome}: {s.reason}"
            reasons.append(f"{key} {short(s.config)}: {said}")
    headers = ["#", "configuration", "outcome", "TFLOPs", "spread", "pred"]
    others = tabulate([[r[0], *r[2:]] for r in rows] or [[""] * 5], headers=headers[:1] + headers[2:],
                      tablefmt="simple", disable_numparse=True).splitlines()[0]
    config_w = max(len("configuration"), width - len(others) - 2)
    for r in rows:                 # wrapped after a comma, never inside a "k=v"
        r[1] = fold(r[1], config_w).replace("\n" + INDENT, "\n")
    table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    note = ("#: confirmed rows first, then by measured model TFLOPs per GPU (median); ✓ confirmed, ? re-probed but "
            f"noisy (> ±{100 * CONFIRM_SPREAD / 2:g}%); pred: calibrated prediction after the refit")
    parts = [fold(title, width) if title else "", table, *(fold(INDENT[:2] + r, width) for r in reasons),
             fold(note, width)]
    return "\n".join(x for x in parts if x)


def format_trials(records: list[TrialRecord]) -> str:
    """One row per trial: what each probe predicted before, after its refit, and measured."""
    rows = []
    for r in sorted(records, key=lambda r: r.number):
        a = r.attrs
        rows.append([r.number, r.phase, short(r.config or a.get("pick_config") or "?"), r.outcome or r.state,
                     _f(r.value if r.state == "COMPLETE" else None), _f(a.get("pred_before_tflops")),
                     _f(a.get("pred_after_tflops")), _f(a.get("probe_wall_s"), 3), r.reason])
    return tabulate(rows, headers=["trial", "phase", "configuration", "outcome", "measured TFLOPs", "pred before",
                                   "pred after", "probe s", "reason"], tablefmt="simple", disable_numparse=True,
                    maxcolwidths=[None] * 8 + [REASON_WIDTH])


def measured_by_line(records: list[TrialRecord]) -> str | None:
    """Which programs ran the probes and why (the trials' ``program``/``program_reason``), e.g. "measured by:
    torchtitan (4 probes: torchtitan 0.3.0 is importable ...)"; None when no trial says (a replay, an older study)."""
    from search.probe_choice import DESCRIPTION

    runs: dict[tuple[str, str], int] = {}
    for r in records:
        program = r.attrs.get("program")
        if program and r.attrs.get("probe_wall_s") is not None:
            key = (program, r.attrs.get("program_reason") or "")
            runs[key] = runs.get(key, 0) + 1
    if not runs:
        return None
    return "measured by: " + "; ".join(f"{DESCRIPTION.get(p, p)} ({n} probe{'s' if n != 1 else ''}: {why})"
                                       for (p, why), n in runs.items())


def report_dict(records: list[TrialRecord], *, study: str, storage: str) -> dict:
    """The study as JSON: ``trials`` are the probes (and what was answered without one); ``pick_trial`` is the trial
    tune added to record its pick (search.study.record_pick), Optuna's best_trial."""
    summaries = summarize(records)
    b = best(summaries)
    picks = [r.number for r in records if r.phase == PICK_PHASE]
    records = [r for r in records if r.phase != PICK_PHASE]
    return {"study": study, "storage": storage, "best": b.to_dict() if b else None,
            "pick_trial": picks[-1] if picks else None,
            "configs": [s.to_dict() for s in summaries],
            "trials": [{"number": r.number, "state": r.state, "phase": r.phase, "config": r.config,
                        "outcome": r.outcome, "reason": r.reason, "value": r.value,
                        **{k: v for k, v in r.attrs.items()
                           if k.startswith(("measured_", "pred_", "calibration", "program"))}}
                       for r in records],
            "dashboard": dashboard_command(storage)}


def dashboard_command(storage: str) -> str:
    """``optuna-dashboard URL`` that works from any folder: a relative SQLite path made absolute (sqlite:////abs),
    quoted for the shell when it needs it."""
    prefix = "sqlite:///"
    if storage.startswith(prefix) and not storage.startswith(prefix + "/"):
        path, sep, query = storage[len(prefix):].partition("?")
        if path and path != ":memory:":
            storage = prefix + str(Path(path).resolve()) + sep + query
    return f"optuna-dashboard {shlex.quote(storage)}"


# -- plots ------------------------------------------------------------------------------------------

RECOMPUTE_MARKERS = {"none": "o", "selective": "s", "full": "^"}
ZERO_COLORS = {0: "tab:blue", 1: "tab:orange", 2: "tab:green", 3: "tab:red"}
OUTCOME_COLORS = {"ok": "tab:blue", "oom": "tab:red", "timeout": "tab:purple", "crash": "black",
                  "interrupted": "tab:gray", "invalid": "tab:olive"}


def _figure(width: float = 7.0, height: float = 4.5):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global backend switch), laid out to fit its legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _legend_outside(ax) -> None:
    """The legend under the axes, where it cannot cover a point: a long label (tune's pick, a layout) makes it taller,
    never the axes narrower (right of them it squeezed the plot to a strip and cut the title)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:     # a figure legend "outside": the constrained layout makes room for it under every axes and label
        ax.figure.legend(handles, labels, loc="outside lower center", fontsize=8, frameon=False)


def _log_axes(ax, span: float = 1000.0) -> None:
    """Both axes logarithmic with plain-number ticks (1, 2, 5 x 10^k; denser when ``span``, max/min, is small)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span > 20 else
                                          (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def _layout_key(candidate: dict) -> tuple[str, str]:
    return str(candidate.get("recompute", "none")), str(candidate.get("zero", 0))


def _plot_fastest(summaries: list[ConfigSummary], path: Path, study: str, top: int = 20):
    """Which layout is fastest, and how sure are we? Ranked measured TFLOPs, every measurement a dot, the range
    as a bar, the confirmed ones marked."""
    ok = [s for s in summaries if s.tflops][:top]
    fig = _figure(8.0, max(2.5, 0.38 * len(ok) + 1.4) + 1.2)     # + the legend under it
    ax = fig.add_subplot()
    for i, s in enumerate(ok):
        y = len(ok) - 1 - i
        lo, hi = min(s.tflops), max(s.tflops)
        color = "tab:green" if s.confirmed else ("tab:red" if s.reprobed else "tab:gray")
        ax.plot([lo, hi], [y, y], color=color, linewidth=6, alpha=0.35, solid_capstyle="butt")
        ax.scatter(s.tflops, [y] * len(s.tflops), color=color, s=18, zorder=3)
        ax.scatter([s.median_tflops], [y], color=color, marker="|", s=200, zorder=4)
    pick = best(summaries)         # row 1 of the ranking: tune's answer, marked so the plot says which it is
    if pick is not None and ok and ok[0].config == pick.config:
        ax.scatter([pick.median_tflops], [len(ok) - 1], marker="*", s=260, color="gold", edgecolors="black",
                   zorder=5, label=f"tune's pick ({'confirmed' if pick.confirmed else 'not confirmed'})")
    ax.set_yticks(range(len(ok)), [("★ " if pick is not None and s.config == pick.config else "") + short(s.config)
                                   for s in reversed(ok)], fontsize=7)
    for label, color in (("confirmed (re-probes agree)", "tab:green"), ("re-probed, disagree (noisy)", "tab:red"),
                         ("measured once", "tab:gray")):
        ax.scatter([], [], color=color, label=label)
    ax.set_xlabel("measured model TFLOPs per GPU (dots: each probe; |: median; bar: range)")
    # over the figure, not the axes: long layout labels push the axes right and a title over them off the edge
    fig.suptitle(f"Which layout is fastest, and how sure are we? {study}".strip(), fontsize=10)
    if ok:
        best_lo = min(ok[0].tflops)
        ax.axvline(best_lo, color="tab:green", linewidth=0.8, linestyle=":", label="slowest probe of the best")
    _legend_outside(ax)
    fig.savefig(path)
    return fig


def _plot_planner(measured: list[TrialRecord], path: Path) -> None:
    """How good was the planner? Predicted vs measured, log axes, the analytic and the calibrated prediction."""
    fig = _figure(9.5, 5.0)
    ax = fig.add_subplot()
    values = []
    for key, label, color, marker in (("pred_analytic_tflops", "analytic (planner as shipped)", "tab:gray", "o"),
                                      ("pred_before_tflops", "calibrated by the earlier probes", "tab:orange", "s")):
        pts = [(float(r.attrs[key]), float(r.value)) for r in measured
               if r.attrs.get(key) and r.value and float(r.attrs[key]) > 0 and float(r.value) > 0]
        if pts:
            errs = sorted(abs(p / m - 1) for p, m in pts)
            med = errs[len(errs) // 2]
            ax.scatter([p for p, _ in pts], [m for _, m in pts], label=f"{label}: median error {100 * med:.0f}%",
                       color=color, marker=marker, alpha=0.75, edgecolors="none")
            values += [v for pt in pts for v in pt]
    if values:
        lo, hi = min(values) / 1.3, max(values) * 1.3
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="measured = predicted")
        ax.fill_between([lo, hi], [lo / 1.2, hi / 1.2], [lo * 1.2, hi * 1.2], color="black", alpha=0.07,
                        label="within ±20%")
        _log_axes(ax, hi / lo)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted model TFLOPs per GPU (log)")
    ax.set_ylabel("measured model TFLOPs per GPU (log)")
    ax.set_title("How good was the planner?", fontsize=10)
    _legend_outside(ax)
    fig.savefig(path)


def _plot_cost(records: list[TrialRecord], path: Path) -> None:
    """What did each probe cost? Wall time per trial, by outcome, and the running total."""
    probed = [r for r in sorted(records, key=lambda r: r.number) if r.attrs.get("probe_wall_s") is not None]
    fig = _figure(8.0, 4.2)
    ax = fig.add_subplot()
    total, xs, cum = 0.0, [], []
    seen = set()
    for r in probed:
        wall = float(r.attrs["probe_wall_s"])
        outcome = r.outcome or r.state
        color = OUTCOME_COLORS.get(outcome, "tab:brown")
        ax.bar(r.number, wall, color=color, label=None if outcome in seen else outcome,
               hatch="//" if r.phase == "confirm" else None, edgecolor="white")
        seen.add(outcome)
        total += wall
        xs.append(r.number)
        cum.append(total)
    ax.add_patch(_patch(facecolor="white", edgecolor="black", hatch="//", label="confirmation re-probe"))
    ax.set_xlabel("trial")
    ax.set_ylabel("probe wall time, s")
    ax.set_ylim(bottom=0)
    if total < 0.5:
        _plot_replayed_cost(records, ax)
    elif xs:
        twin = ax.twinx()
        twin.plot(xs, cum, color="black", linewidth=1.0)
        twin.set_ylabel("total probe time, s (line)")
        twin.set_ylim(bottom=0)
        ax.plot([], [], color="black", linewidth=1.0, label=f"running total ({total:.0f} s)")
    ax.set_title("What did each probe cost?", fontsize=10)
    _legend_below(ax)
    fig.savefig(path)


def _plot_replayed_cost(records: list[TrialRecord], ax) -> None:
    """No probe ran (a replay, or answers from storage): each measured trial's step time in the recorded run, what
    one step of that configuration costs on the machine that measured it."""
    steps = [(r.number, float(r.attrs["measured_step_s"]), r.phase) for r in sorted(records, key=lambda r: r.number)
             if r.measured and r.attrs.get("measured_step_s")]
    if not steps:
        ax.text(0.5, 0.5, "no probe time and no step time recorded", transform=ax.transAxes, ha="center",
                va="center", color="gray")
        return
    ax.cla()
    for number, step, phase in steps:
        ax.bar(number, step, color="tab:cyan", hatch="//" if phase == "confirm" else None, edgecolor="white")
    ax.add_patch(_patch(facecolor="tab:cyan", label="replayed: the recorded run's step time (no probe ran)"))
    ax.add_patch(_patch(facecolor="white", edgecolor="black", hatch="//", label="confirmation re-probe"))
    ax.set_xlabel("trial")
    ax.set_ylabel("recorded step time, s")
    ax.set_ylim(bottom=0)


def _patch(**kw):
    """A legend-only patch (an empty bar() would show the colour cycle's, not the bars' look)."""
    from matplotlib.patches import Rectangle

    return Rectangle((0, 0), 0, 0, **kw)


def _legend_below(ax) -> None:
    """The legend under the axes: beside a plot with a right-hand axis it would cover that axis' ticks."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8,
                  frameon=False)


LAYOUT_DIMS = ("tp", "pp", "mbs", "cp", "ep", "dp")
"""the by-layout plot's candidate panels, in this order; `layout_dims` keeps those the measurements vary"""


def layout_dims(measured: list[TrialRecord]) -> list[str]:
    """Panels of the by-layout plot: each of TP, PP, MBS, CP, EP and DP whose measured configurations do not all share
    one value (a panel of one x value shows nothing about that dimension); DP only where the world size is not fixed
    by TP x PP x CP (else it mirrors the TP and PP panels)."""
    def values(name: str) -> set:
        return {r.attrs.get("candidate", {}).get(name, 1) for r in measured}
    return [d for d in LAYOUT_DIMS if len(values(d)) > 1 and (d != "dp" or not _dp_follows(measured))]


def _dp_follows(measured: list[TrialRecord]) -> bool:
    """DP is world / (TP x PP x CP) in every measurement: a DP panel would only mirror the TP and PP panels."""
    worlds = {c.get("tp", 1) * c.get("pp", 1) * c.get("cp", 1) * c.get("dp", 1)
              for c in (r.attrs.get("candidate", {}) for r in measured)}
    return len(worlds) <= 1


def _plot_layout(measured: list[TrialRecord], path: Path):
    """How does each parallel dimension matter? Measured TFLOPs by TP, PP and MBS (and CP, EP where the study varies
    them); marker = recompute, colour = ZeRO."""
    dims = layout_dims(measured)
    fig = _figure(max(3.7 * max(len(dims), 1), 7.0), 3.9)     # one panel still wide enough for its title
    if not dims:         # every measurement shares its TP, PP, MBS...: no dimension to show, say so
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no parallel dimension varies among the measured configurations"
                + (f"\n(all {short(measured[0].config or '?')})" if measured else "\n(nothing measured)"),
                ha="center", va="center", transform=ax.transAxes, fontsize=9, color="gray")
        fig.suptitle("Measured TFLOPs by parallel dimension", fontsize=10)
        fig.savefig(path)
        return fig
    axes = [fig.add_subplot(1, len(dims), i + 1) for i in range(len(dims))]
    for i, (ax, name) in enumerate(zip(axes, dims)):
        for r in measured:
            c = {"cp": 1, "ep": 1, **r.attrs.get("candidate", {})}
            if c.get(name) is None:
                continue
            recompute, zero = _layout_key(c)
            # a little horizontal jitter by ZeRO stage so equal layouts do not hide each other
            x = c[name] * 2 ** (0.08 * (int(zero) - 1.5))
            ax.scatter([x], [r.value], marker=RECOMPUTE_MARKERS.get(recompute, "x"),
                       color=ZERO_COLORS.get(int(zero), "tab:brown"), alpha=0.8, edgecolors="none")
        ax.set_xscale("log", base=2)
        ticks = sorted({{"cp": 1, "ep": 1, **r.attrs.get("candidate", {})}.get(name) for r in measured} - {None})
        if ticks:
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlim(min(ticks) / 1.5, max(ticks) * 1.5)
        ax.set_xlabel(name.upper())
        if i == 0:
            ax.set_ylabel("measured model TFLOPs per GPU")
    present_r = sorted({_layout_key(r.attrs.get("candidate", {}))[0] for r in measured})
    present_z = sorted({_layout_key(r.attrs.get("candidate", {}))[1] for r in measured})
    for rc in present_r:
        axes[-1].scatter([], [], marker=RECOMPUTE_MARKERS.get(rc, "x"), color="gray", label=f"recompute {rc}")
    for z in present_z:
        axes[-1].scatter([], [], marker="o", color=ZERO_COLORS.get(int(z), "tab:brown"), label=f"ZeRO {z}")
    fig.suptitle(f"Measured TFLOPs by {' / '.join(d.upper() for d in dims)} (marker: recompute; colour: ZeRO)",
                 fontsize=10)
    _legend_outside(axes[-1])
    fig.savefig(path)
    return fig


@dataclass(frozen=True, slots=True)
class History:
    """history.png's data, in trial order. Two running maxima, so neither line can fall:

    - ``confirmed``: the best median among configurations confirmed (re-probes agree, `ConfigSummary.confirmed`) by
      that trial, as known then; None before the first confirmation. Once confirmed, a figure stays on the line
      even if later re-probes lower it: the line is the record of what had been confirmed, not today's ranking.
    - ``single``: the best single probe so far (a measurement, confirmed or not): the upper envelope of the dots.

    ``pick`` is tune's answer now (`best`: confirmed first, by median), which the plot marks apart from both."""

    trials: tuple[int, ...]
    values: tuple[float, ...]
    confirmed: tuple[float | None, ...]
    single: tuple[float, ...]
    pick: ConfigSummary | None


def history(records: list[TrialRecord]) -> History:
    """`History` of a study's records (measured trials only carry points)."""
    ordered = sorted(records, key=lambda r: r.number)
    measured = [r for r in ordered if r.measured and r.value is not None]
    confirmed: list[float | None] = []
    single: list[float] = []
    top_c: float | None = None
    top_s = 0.0
    for r in measured:
        known = summarize([q for q in ordered if q.number <= r.number])
        now = max((s.median_tflops or 0.0 for s in known if s.confirmed), default=None)
        if now is not None:
            top_c = now if top_c is None else max(top_c, now)
        top_s = max(top_s, float(r.value))
        confirmed.append(top_c)
        single.append(top_s)
    return History(trials=tuple(r.number for r in measured), values=tuple(float(r.value) for r in measured),
                   confirmed=tuple(confirmed), single=tuple(single), pick=best(summarize(records)))


def _plot_history(records: list[TrialRecord], path: Path, study: str) -> None:
    """How fast did the search find its best? Each measurement in probe order, the best single probe and the best
    confirmed median so far (`History`: both only rise), and tune's pick."""
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    h = history(records)
    if h.trials:
        xs = list(h.trials)
        ax.scatter(xs, h.values, label="measured (one probe)", color="tab:blue", zorder=3)
        ax.step(xs, h.single, where="post", label=f"best single probe so far: {h.single[-1]:.4g}",
                color="tab:gray", linewidth=1, linestyle="--", zorder=2)
        first = next((i for i, v in enumerate(h.confirmed) if v is not None), None)
        if first is not None:
            ax.step(xs[first:], h.confirmed[first:], where="post", color="tab:green", linewidth=2, zorder=2,
                    label=f"best confirmed median so far: {h.confirmed[-1]:.4g}")
        if h.pick is not None:
            ax.scatter([max(h.pick.trials)], [h.pick.median_tflops], marker="*", s=220, color="gold",
                       edgecolors="black", zorder=5,
                       label=f"tune's pick: {short(h.pick.config)} {h.pick.median_tflops:.4g}"
                             + (" (confirmed)" if h.pick.confirmed else " (not confirmed)"))
        ax.set_ylim(0, max(h.values) * 1.1)
    failed = [r for r in records if r.state == "FAIL" and r.outcome not in (None, "interrupted", "implied_oom")]
    if failed:
        ax.scatter([r.number for r in failed], [0.0] * len(failed), marker="x", color="tab:red",
                   label="failed (oom / timeout / crash / invalid)")
    ax.set_xlabel("trial")
    ax.xaxis.get_major_locator().set_params(integer=True)     # trial numbers: no 2.5
    ax.set_ylabel("model TFLOPs per GPU")
    ax.set_ylim(bottom=0)
    ax.set_title(f"How fast did the search find its best? {study}".strip(), fontsize=10)
    _legend_outside(ax)
    fig.savefig(path)
    return fig


PLOTS = ("fastest.png", "predicted_vs_measured.png", "probe_cost.png", "tflops_by_layout.png", "history.png")


def write_plots(records: list[TrialRecord], out_dir: Path, *, study: str = "") -> list[Path]:
    """`PLOTS` in ``out_dir``, each answering one question (see each plot's title)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    measured = [r for r in sorted(records, key=lambda r: r.number) if r.measured and r.value is not None]
    paths = [out_dir / name for name in PLOTS]
    _plot_fastest(summarize(records), paths[0], study)
    _plot_planner(measured, paths[1])
    _plot_cost(records, paths[2])
    _plot_layout(measured, paths[3])
    _plot_history(records, paths[4], study)
    return paths


__all__ = ["CONFIRM_SPREAD", "ConfigSummary", "History", "PLOTS", "best", "best_line", "dashboard_command",
           "format_table", "format_table_narrow", "format_trials", "history", "layout_dims", "rank_key", "report_dict", "short", "summarize",
           "write_plots"]
