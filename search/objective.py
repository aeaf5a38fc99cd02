"""One trial: candidate -> (duplicate? implied OOM?) -> probe -> measured TFLOPs, every outcome recorded.

    >>> objective = Objective(space=space, backend=backend, settings=ProbeSettings(steps=5))
    >>> study.optimize(objective, catch=(ProbeFailed,))

The value of a trial is the measured model TFLOPs per GPU of the full configuration (FLOPs of
`planner.flops.model_flops_per_iteration`, no recompute: the planner's ``model_tflops_per_gpu``,
so measured and predicted compare directly). A probe that does not measure raises `ProbeFailed`:
Optuna records the trial FAIL and the study goes on; ``outcome`` and ``reason`` say why.

Before probing, the trial's slot (configuration, or configuration + confirmation repeat) is
checked against every earlier trial (lower number): a finished one answers the trial from its
stored result (``outcome=duplicate``, no probe); a running one (another worker) is waited for.
A configuration an earlier OOM implies out of memory (`search.space.needs_more_memory`) is
failed with ``implied_oom`` without a probe. Ctrl-C during a probe stops it (the launcher kills
the process group), records ``outcome=interrupted`` and re-raises: the trial is FAIL and the next
run probes the configuration again.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from planner import Candidate, CostParams, estimate, fsdp_parallel
from planner.flops import model_flops_per_iteration, tflops_per_gpu
from probes.backend import ProbeBackend
from probes.result import ProbeResult, ProbeSpec

from search import pruning
from search._base import DERIVED, PICK_CONSTRAINT, PROBED, BackendError
from search.calibration import Measurement, class_scales, params_dict, probe_class_seconds, refit
from search.pruning import MIN_STEPS
from search.space import PARAMS, SearchSpace, config_key, params_of, with_defaults
from search.trial_attrs import TrialAttrs

FINAL = PROBED + DERIVED
COUNTED = ("ok", "oom", "timeout", "crash", "pruned")
"""outcomes of a probe that ran processes to an end: what --max-probes and the budget's probe time count"""
RESOURCES_ATTR = "plantune_resources"
"""study attribute: the resources (`ProbeSettings.resources`) of the latest run, for `Ledger.of`"""
WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""which tuner process ran a trial (several workers may share one study)"""
WAIT_POLL_S = 1.0
PARAMS_WAIT_S = 10.0
"""how long to wait for an earlier running trial (another worker) to record its parameters"""
HOLDER_MARGIN_S = 120.0
"""waiting for another worker's probe of the same slot: its probe timeout plus this"""


def trial_phase(user_attrs: dict, system_attrs: dict) -> str:
    """analytic | sampler | confirm as enqueued; a copy made by the heartbeat retry callback is ``retry``."""
    phase = user_attrs.get("phase") or "sampler"
    if "failed_trial" in system_attrs and phase != "confirm":
        return "retry"
    return phase


class ProbeFailed(Exception):
    """A trial's probe did not measure (oom, timeout, crash, ...); Optuna records it FAIL and goes on."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSettings:
    steps: int = 5
    warmup_steps: int = 2
    layers: int | None = None
    """--probe-layers: run a reduced model of this many layers (rounded up to a multiple of PP)"""
    timeout_s: float = 600.0
    device: str = "auto"
    max_cv: float = 0.15
    workdir: Path | None = None
    """probe folders go to workdir/trial-NNNN (None: a backend that needs none, e.g. replay)"""
    prune: bool = True
    """stop a probe clearly behind the best so far (`search.pruning`; backends that report steps)"""
    prune_min_steps: int = MIN_STEPS
    """timed steps a probe runs before it may be pruned"""
    profile: bool = True
    """one more step under torch.profiler after the timed ones: compute seconds by op class (gemm, attention,
    elementwise, optimizer), recorded in the trial (measured_class_s) and refitted per class
    (search.calibration.class_scales)"""
    program: str = ""
    """the program that measures (search.probe_choice.PROGRAMS; "" for a replay), recorded in every probed trial"""
    program_reason: str = ""
    """why that program (one line)"""
    resources: str = ""
    """where and on how many processes probes run (backend, processes, device): an ``invalid`` verdict made
    under other resources is not final (`Ledger.of` with ``resources``) and the configuration is probed again"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """What one stored trial says (read back from its state, params and user attributes)."""

    number: int
    state: str
    params: dict
    config: str | None
    slot: str | None
    phase: str
    outcome: str | None
    reason: str
    value: float | None
    attrs: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    """parameters a WAITING trial was enqueued with"""
    stale: bool = False
    """an ``invalid`` verdict made under other resources than this run's: not final, probed again"""
    started: float | None = None
    """the trial's start, seconds since the epoch"""
    reopened: bool = False
    """a pruned trial no longer clearly behind the best (`search.pruning.still_behind`): not final, probed again"""

    @classmethod
    def from_trial(cls, t: FrozenTrial, resources: str | None = None) -> "TrialRecord":
        ua = t.user_attrs
        stale = (resources is not None and ua.get("outcome") == "invalid"
                 and ua.get("resources", "") != resources)
        return cls(number=t.number, state=t.state.name, params=dict(t.params), config=ua.get("config"),
                   slot=ua.get("slot"), phase=trial_phase(ua, t.system_attrs), outcome=ua.get("outcome"),
                   reason=ua.get("reason", ""), value=t.value if t.state == TrialState.COMPLETE else None,
                   attrs=dict(ua), fixed=dict(t.system_attrs.get("fixed_params") or {}), stale=stale,
                   started=t.datetime_start.timestamp() if t.datetime_start else None)

    @property
    def final(self) -> bool:
        return (self.state in ("COMPLETE", "FAIL", "PRUNED") and self.outcome in FINAL and not self.stale
                and not self.reopened)

    @property
    def counted(self) -> bool:
        """A probe that ran on the machine to an end (what --max-probes counts)."""
        return "probe_wall_s" in self.attrs and self.outcome in COUNTED and "duplicate_of" not in self.attrs

    @property
    def measured(self) -> bool:
        """A probe of its own that measured (not a duplicate's copy)."""
        return self.state == "COMPLETE" and self.outcome == "ok" and "duplicate_of" not in self.attrs

    @property
    def candidate(self) -> Candidate | None:
        d = self.attrs.get("candidate")
        return Candidate(**d) if d else None

    @property
    def typed(self) -> TrialAttrs:
        """The user attributes as `TrialAttrs`."""
        return TrialAttrs.from_user_attrs(self.attrs)


@dataclass(frozen=True, slots=True)
class Ledger:
    """Every trial of a study, read once, and what they imply for the next proposal."""

    records: list[TrialRecord]

    @classmethod
    def of(cls, study: optuna.Study, *, exclude: int | None = None, resources: str | None = None) -> "Ledger":
        """Every trial but ``exclude``; ``invalid`` verdicts made under other ``resources`` (default: the study's
        latest run's, `RESOURCES_ATTR`) are not final."""
        if resources is None:
            resources = study.user_attrs.get(RESOURCES_ATTR)
        trials = study.get_trials(deepcopy=False)
        return cls.reopen([TrialRecord.from_trial(t, resources) for t in trials if t.number != exclude])

    @classmethod
    def reopen(cls, records: list[TrialRecord]) -> "Ledger":
        """The ledger of ``records``, pruned trials no longer clearly behind the best marked ``reopened``."""
        if any(r.outcome == "pruned" for r in records):
            ref = pruning.reference(records)
            opened = {r.number for r in records if r.outcome == "pruned" and not pruning.still_behind(r, ref)}
            # a duplicate answered from a reopened trial (another worker's race for the slot) is reopened with it
            records = [replace(r, reopened=True) if r.number in opened or r.attrs.get("duplicate_of") in opened
                       else r for r in records]
        return cls(records)

    def final_by_slot(self) -> dict[str, TrialRecord]:
        out: dict[str, TrialRecord] = {}
        for r in sorted(self.records, key=lambda r: r.number):
            if r.final and r.slot and r.slot not in out:
                out[r.slot] = r
        return out

    def ooms(self) -> list[Candidate]:
        return [r.candidate for r in self.records if r.outcome == "oom" and r.candidate is not None]

    def measurements(self) -> list[Measurement]:
        out = []
        for r in self.records:
            step = r.attrs.get("measured_step_s")
            if r.measured and r.candidate is not None and step:
                out.append(Measurement(candidate=r.candidate, step_time_s=float(step)))
        return out

    def class_pairs(self) -> list[tuple[dict, dict]]:
        """(predicted, measured) compute seconds by op class of every measured probe that profiled its step."""
        return [(r.attrs["pred_class_s"], r.attrs["measured_class_s"]) for r in self.records
                if r.measured and r.attrs.get("pred_class_s") and r.attrs.get("measured_class_s")]

    def running_keys(self, space: SearchSpace) -> set[str]:
        keys = set()
        for r in self.records:
            if r.state == "RUNNING" and r.phase != "confirm":
                est = space.lookup(r.params) if r.params else None
                if est is not None:
                    keys.add(config_key(est.candidate))
                elif r.config:
                    keys.add(r.config)
        return keys

    def waiting_keys(self, space: SearchSpace) -> set[str]:
        """Configurations already queued (enqueued top-k, retries) and not yet started."""
        keys = set()
        for r in self.records:
            if r.state == "WAITING":
                fixed = r.params or r.fixed
                est = space.lookup(fixed) if fixed else None
                if est is not None:
                    keys.add(config_key(est.candidate))
        return keys

    def done_keys(self, space: SearchSpace) -> set[str]:
        """Configurations that need no probe: finished, or implied out of memory by a finished OOM."""
        done = {slot for slot in self.final_by_slot() if "#" not in slot}
        ooms = self.ooms()
        done |= {config_key(e.candidate) for e in space.survivors if space.implied_oom(e.candidate, ooms)}
        return done


def worker_dead(record: TrialRecord) -> bool:
    """The trial's tuner ran on this host and its process is gone (killed): the trial will never finish.
    False when unknown (another host, no worker recorded, or a process with that pid exists)."""
    host, _, pid = str(record.attrs.get("worker", "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:                          # exists, owned by someone else
        return False
    return False


def suggest(trial: optuna.Trial, distributions: dict) -> dict:
    """Ask the trial for every parameter of the space (fixed, relative or independent, as Optuna decides)."""
    params = {}
    for name, dist in distributions.items():
        if isinstance(dist, CategoricalDistribution):
            params[name] = trial.suggest_categorical(name, dist.choices)
        elif isinstance(dist, IntDistribution):
            params[name] = trial.suggest_int(name, dist.low, dist.high, log=dist.log)
        else:
            raise TypeError(f"unsupported distribution {dist!r}")
    return params


def probe_layers(layers: int | None, candidate: Candidate, model_layers: int) -> int | None:
    """--probe-layers rounded up to a multiple of PP*VPP (each stage needs whole layers), at most the model's."""
    if layers is None:
        return None
    unit = candidate.pp * candidate.vpp
    run = max(unit, math.ceil(layers / unit) * unit)
    return None if run >= model_layers else run


class Objective:
    """Callable for `optuna.Study.optimize`; holds the space, the backend and how to probe."""

    def __init__(self, *, space: SearchSpace, backend: ProbeBackend, settings: ProbeSettings,
                 on_probe: Callable[..., None] | None = None,
                 on_probe_end: Callable[[], None] | None = None) -> None:
        self.space = space
        self.backend = backend
        self.settings = settings
        self.on_probe = on_probe
        """called as on_probe(trial number, label, timeout_s=, workdir=) when a probe starts"""
        self.on_probe_end = on_probe_end
        self.deadline: float | None = None
        """time.monotonic() at which the budget ends: a probe still running then is stopped (not final)"""
        self.gpu_budget: Callable[[], float] | None = None
        """GPU-seconds left of a --budget NNgpuh (search.study): a probe is stopped when it has held them"""
        self.on_budget_cut: Callable[[], None] | None = None
        """called when a probe was stopped at the deadline (the budget is spent, whatever the clock says)"""
        self.distributions = space.distributions()
        plan = space.plan
        self.model, self.cluster, self.training = plan.model, plan.cluster, plan.training

    # -- helpers ---------------------------------------------------------------------------------
    def measured_tflops(self, candidate: Candidate, step_s: float) -> float:
        return tflops_per_gpu(model_flops_per_iteration(self.model, candidate.global_batch), step_s, candidate.world)

    def predict(self, candidate: Candidate, params: CostParams) -> tuple[float | None, float | None]:
        est = estimate(self.model, self.cluster, self.training, candidate, params=params)
        return est.model_tflops_per_gpu, est.step_time_s

    def _calibration(self, ledger: Ledger, extra: list[Measurement] = (),
                     extra_classes: list[tuple[dict, dict]] = ()) -> CostParams:
        """The refit to every measurement so far: per-class scales from the profiled probes (`class_scales`), then
        compute and communication scales on top."""
        return refit(self.model, self.cluster, self.training, ledger.measurements() + list(extra),
                     class_scales=class_scales(ledger.class_pairs() + list(extra_classes)))

    def _ruled_out_reason(self, params: dict) -> tuple[str, str]:
        """(label, reason) of parameters that name no survivor."""
        tp, pp, mbs = int(params.get("tp", 1)), int(params.get("pp", 1)), int(params.get("mbs", 1))
        cp, ep, etp = (int(params.get(n, 1)) for n in ("cp", "ep", "etp"))
        dp = max(self.cluster.world_size // max(tp * pp * cp, 1), 1)
        cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=max(self.training.global_batch // (mbs * dp), 1),
                         recompute=params.get("recompute", "none"), zero=int(params.get("zero", 0)),
                         sp=bool(params.get("sp", False)), vpp=int(params.get("vpp", 1)),
                         hybrid=bool(params.get("hybrid", False)), cp=cp, ep=ep, etp=etp)
        est = estimate(self.model, self.cluster, self.training, cand)
        why = "; ".join(v.detail for v in est.reasons) or "outside the restricted space"
        return cand.label(), f"{cand.label()} is not a survivor of the plan ({why}); never probed"

    def _earlier_claim(self, trial: optuna.Trial, slot: str) -> TrialRecord | None:
        """The earliest other trial holding ``slot``, once it is final; None when this trial should probe.

        Lower trial numbers win: a running holder (another worker) is waited for, up to a probe
        timeout and a margin, failing stale ones on the way (a killed worker's trial then stops
        holding the slot); a running trial that has not recorded its slot yet is waited for briefly.
        """
        study = trial.study
        params_deadline = time.monotonic() + PARAMS_WAIT_S
        holder_deadline = None
        while True:
            ledger = Ledger.of(study, exclude=trial.number)
            earlier = [r for r in ledger.records if r.number < trial.number]
            final = [r for r in earlier if r.slot == slot and r.final]
            if final:
                return min(final, key=lambda r: r.number)
            holders = [r for r in earlier if r.slot == slot and r.state == "RUNNING" and not worker_dead(r)]
            # a live tuner records a trial's slot right after ask(); one without it for longer is dead
            unknown = [r for r in earlier if r.state == "RUNNING" and not r.slot and not worker_dead(r)
                       and (r.started is None or time.time() - r.started < PARAMS_WAIT_S)]
            now = time.monotonic()
            if holders:
                holder_deadline = holder_deadline or now + self.settings.timeout_s + HOLDER_MARGIN_S
                if now > holder_deadline:
                    return None
            elif not unknown or now > params_deadline:
                return None
            time.sleep(WAIT_POLL_S)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)

    # -- the trial -------------------------------------------------------------------------------
    def __call__(self, trial: optuna.Trial) -> float:
        self._set(trial, worker=WORKER)      # first: a dead tuner's RUNNING trial is known by its pid
        trial.set_constraint(PICK_CONSTRAINT, 1.0)   # a probe is not tune's answer: search.study.record_pick
        try:
            return self._run(trial)
        except KeyboardInterrupt as stop:
            by = "SIGTERM (a job time limit, or kill)" if type(stop).__name__ == "Terminated" else "Ctrl-C"
            self._set(trial, outcome="interrupted",
                      reason=f"interrupted by {by}; the next run of the same command probes it again")
            raise

    def _run(self, trial: optuna.Trial) -> float:
        ua = trial.user_attrs
        frozen = next(t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                      if t.number == trial.number)
        phase = trial_phase(ua, frozen.system_attrs)
        # enqueued or retried parameters from an older space may lie outside this one's distributions
        given = {**(frozen.system_attrs.get("fixed_params") or {}), **frozen.params}
        # one enqueued before cp/ep/etp were parameters lacks them: their defaults (1), never a sampled value
        old = bool(given) and any(n not in given for n in PARAMS if n in self.distributions)
        params = (with_defaults(given) if given and (old or self.space.lookup(given) is None)
                  else suggest(trial, self.distributions))
        est = self.space.lookup(params)
        if est is None:
            label, reason = self._ruled_out_reason(params)
            self._set(trial, config=label, phase=phase, outcome="ruled_out", reason=reason)
            raise ProbeFailed(reason)
        cand = est.candidate
        key = config_key(cand)
        slot = key if phase != "confirm" else f"{key}#confirm{ua.get('repeat', 1)}"
        self._set(trial, config=key, slot=slot, phase=phase, candidate=cand.to_dict(), worker=WORKER,
                  pred_analytic_tflops=est.model_tflops_per_gpu, pred_analytic_step_s=est.step_time_s,
                  pred_memory_gb=est.memory_gb_per_gpu)

        earlier = self._earlier_claim(trial, slot)
        if earlier is not None:
            return self._copy(trial, earlier)
        ledger = Ledger.of(trial.study, exclude=trial.number)
        if phase != "confirm":
            oom = self.space.implied_oom(cand, ledger.ooms())
            if oom is not None:
                reason = (f"implied out of memory: {oom.label()} ran out of memory and this needs at least as much "
                          "(same layout, no smaller MBS, no more recompute or sharding); never probed")
                self._set(trial, outcome="implied_oom", reason=reason, implied_by=oom.label())
                raise ProbeFailed(reason)

        before = self._calibration(ledger)
        tf_before, step_before = self.predict(cand, before)
        self._set(trial, pred_before_tflops=tf_before, pred_before_step_s=step_before,
                  calibration_before=params_dict(before))
        ref = pruning.reference(ledger.records) if self.settings.prune else None
        if ref is not None and phase == "confirm" and ref.config == key:
            ref = None                       # the best's own re-probes are the reference: never pruned
        result = self._probe(trial, cand, ref)
        return self._record(trial, cand, result, ledger)

    def probe_spec(self, cand: Candidate) -> ProbeSpec:
        """What the probe runs for ``cand``: the whole candidate (cp, ep, etp included), its context and expert
        degrees as the probe's ``cp``/``ep``, and the model's experts (``num_experts``, ``moe_top_k``)."""
        s = self.settings
        return ProbeSpec(model=self.model.to_dict(), candidate=cand.to_dict(), precision=self.training.precision,
                         warmup_steps=s.warmup_steps, steps=s.steps,
                         layers_run=probe_layers(s.layers, cand, self.model.layers), device=s.device, max_cv=s.max_cv,
                         cp=cand.cp, ep=cand.ep, num_experts=self.model.num_experts,
                         pp_schedule=fsdp_parallel.probe_schedule(self.training),   # torchtitan's --pp-schedule
                         profile=s.profile,
                         **({"moe_top_k": self.model.moe_topk} if self.model.num_experts else {}))

    def _on_step(self, trial: optuna.Trial, cand: Candidate, spec: ProbeSpec, ref: pruning.Reference | None):
        """The backend's ``on_step``: each timed step as the full configuration's TFLOPs/GPU, reported to Optuna
        (intermediate values, optuna-dashboard's curves), and the reason to stop when `pruning.verdict` gives one."""
        scale = self.model.layers / spec.layers_run if spec.layers_run else 1.0     # a reduced model's step, scaled
        seen: list[float] = []

        def on_step(index: int, seconds: float) -> str | None:
            if not seconds or seconds <= 0:
                return None
            tflops = self.measured_tflops(cand, seconds * scale)
            seen.append(tflops)
            trial.report(tflops, index)
            why = pruning.verdict(ref, seen, min_steps=self.settings.prune_min_steps)
            if why:
                self._set(trial, pruned_margin=ref.margin_after(len(seen)))
            return why

        on_step.seen = seen          # the steps reported so far (`_report_rest` adds those the probe had no time to)
        return on_step

    def _report_rest(self, trial: optuna.Trial, cand: Candidate, spec: ProbeSpec, on_step, result: ProbeResult) -> None:
        """Report the timed steps of a finished probe that its ``on_step`` did not see (a probe quicker than the
        launcher's poll), so every measured trial has its curve."""
        scale = self.model.layers / spec.layers_run if spec.layers_run else 1.0
        for i in range(len(getattr(on_step, "seen", [])), len(result.step_times_s)):
            if result.step_times_s[i] > 0:
                trial.report(self.measured_tflops(cand, result.step_times_s[i] * scale), i)

    def _probe(self, trial: optuna.Trial, cand: Candidate, ref: pruning.Reference | None = None) -> ProbeResult:
        s = self.settings
        spec = self.probe_spec(cand)
        study_dir = s.workdir or Path("tune-probes")
        workdir = study_dir / f"trial-{trial.number:04d}"
        timeout = s.timeout_s
        if self.deadline is not None:
            timeout = max(min(timeout, self.deadline - time.monotonic()), 0.0)
        if self.gpu_budget is not None:                   # what is left, held by this probe's GPUs
            timeout = max(min(timeout, self.gpu_budget() / max(cand.world, 1)), 0.0)
        if self.on_probe is not None:
            self.on_probe(trial.number, cand.label(), timeout_s=timeout, workdir=workdir if s.workdir else None)
        started = time.monotonic()
        steps = ({"on_step": self._on_step(trial, cand, spec, ref)} if getattr(self.backend, "reports_steps", False)
                 else {})
        try:
            result = self.backend.run(spec, workdir=workdir, timeout_s=timeout, **steps)
        except Exception as err:  # noqa: BLE001 -- any backend failure is recorded, then stops the study
            first = (str(err).splitlines() or [""])[0][:300]
            reason = f"{getattr(self.backend, 'name', 'probe')} backend failed: {type(err).__name__}: {first}"
            self._set(trial, outcome="backend_error", reason=reason + "; the next run probes it again")
            raise BackendError(reason) from err
        finally:
            if self.on_probe_end is not None:
                self.on_probe_end()
        wall = time.monotonic() - started
        if result.ok and steps:
            self._report_rest(trial, cand, spec, steps["on_step"], result)
        self._set(trial, probe_wall_s=round(wall, 3), phases={k: round(float(v), 3) for k, v in result.phases.items()},
                  probe_gpus=result.world_size or cand.world, device=result.device,
                  workdir=result.workdir or (str(workdir) if s.workdir else ""), layers_run=spec.layers_run,
                  **({"program": s.program, "program_reason": s.program_reason} if s.program else {}))
        if result.status == "timeout" and timeout < s.timeout_s:
            reason = (f"stopped at the end of --budget after {wall:.0f} s (its --probe-timeout is {s.timeout_s:g} s); "
                      "the next run probes it again")
            self._set(trial, outcome="interrupted", reason=reason, cut_by_budget=True)
            if self.on_budget_cut is not None:
                self.on_budget_cut()
            raise ProbeFailed(reason)
        return result

    def _record(self, trial: optuna.Trial, cand: Candidate, result: ProbeResult, ledger: Ledger) -> float:
        memory = max(result.peak_memory_bytes_per_rank) / 1e9 if result.peak_memory_bytes_per_rank else None
        if result.status == "pruned":
            scale = self.model.layers / trial.user_attrs["layers_run"] if trial.user_attrs.get("layers_run") else 1.0
            fastest = min((t for t in result.step_times_s if t > 0), default=None)
            self._set(trial, outcome="pruned", reason=result.reason, pruned_steps=len(result.step_times_s),
                      pruned_step_s=fastest * scale if fastest else None,
                      pruned_tflops=self.measured_tflops(cand, fastest * scale) if fastest else None,
                      resources=self.settings.resources)
            raise optuna.TrialPruned(result.reason)
        if not result.ok:
            outcome = "not_measured" if result.extra.get("not_measured") else result.status
            reason = result.reason or f"probe ended {result.status}"
            killed_by = result.extra.get("killed_by")
            if outcome == "crash" and killed_by:
                outcome, reason = self._killed(trial, cand, reason, killed_by, ledger)
            self._set(trial, outcome=outcome, reason=reason, measured_memory_gb=memory,
                      root_cause_rank=result.root_cause_rank, resources=self.settings.resources,
                      **({"killed_by": killed_by} if killed_by else {}))
            if outcome == "oom":
                self._record_implied(trial, cand)
            raise ProbeFailed(f"{outcome}: {reason}")
        step = (result.projected or {}).get("step_time_s") if result.reduced else result.step_time_median_s
        if not step or step <= 0:
            reason = "the probe reported no step time"
            self._set(trial, outcome="crash", reason=reason)
            raise ProbeFailed(reason)
        tflops = self.measured_tflops(cand, step)
        measured_class = {c: v for c, v in ((result.timing_split or {}).get("compute_s_by_class") or {}).items()}
        pred_class = (probe_class_seconds(self.model, self.cluster, self.training, cand,
                                          probe_layers(self.settings.layers, cand, self.model.layers))
                      if measured_class else None)
        after = self._calibration(ledger, [Measurement(candidate=cand, step_time_s=step)],
                                  [(pred_class, measured_class)] if measured_class else [])
        tf_after, step_after = self.predict(cand, after)
        times = result.step_times_s or [step]
        self._set(trial, outcome="ok", reason="", measured_tflops=tflops, measured_step_s=step,
                  measured_memory_gb=memory, memory_kind=result.memory_kind, step_cv=result.step_time_cv,
                  step_spread=(max(times) - min(times)) / statistics.median(times) if len(times) > 1 else 0.0,
                  reduced=result.reduced, pred_after_tflops=tf_after, pred_after_step_s=step_after,
                  calibration_after=params_dict(after),
                  **({"measured_class_s": measured_class, "pred_class_s": pred_class} if measured_class else {}))
        trial.study.set_user_attr("calibration", {**params_dict(after), "trial": trial.number})
        return tflops

    def _killed(self, trial: optuna.Trial, cand: Candidate, reason: str, signal_name: str,
                ledger: Ledger) -> tuple[str, str]:
        """A rank killed from outside (OOM killer, preemption, an operator): not the configuration's fault the
        first time, so (interrupted, reason) and a retry queued at once; a second kill is a final crash."""
        key = config_key(cand)
        before = [r for r in ledger.records if r.config == key and r.attrs.get("killed_by")]
        if before:
            return "crash", (f"{reason}; killed by {signal_name} again after a retry (trial {before[0].number}): "
                             "recorded as a crash (look for the kernel OOM killer in dmesg)")
        ua = trial.user_attrs
        trial.study.enqueue_trial(params_of(cand), user_attrs=TrialAttrs.user_attrs(
            phase="confirm" if ua.get("phase") == "confirm" else "retry",
            **{k: ua[k] for k in ("repeat", "slot") if k in ua and ua.get("phase") == "confirm"}))
        return "interrupted", (f"{reason}; killed by {signal_name} from outside the probe (OOM killer, preemption?): "
                               "probed once more")

    def _record_implied(self, trial: optuna.Trial, oom: Candidate) -> None:
        """Add a FAIL trial (no probe) for every configuration this OOM rules out, so reports list them."""
        ledger = Ledger.of(trial.study, exclude=trial.number)
        taken = set(ledger.final_by_slot()) | ledger.running_keys(self.space) | ledger.waiting_keys(self.space)
        for est in self.space.survivors:
            c = est.candidate
            key = config_key(c)
            if key in taken or not self.space.implied_oom(c, [oom]):
                continue
            reason = (f"implied out of memory by trial {trial.number} ({oom.label()} ran out of memory): same "
                      "layout, no smaller MBS, no more recompute or sharding; never probed")
            params = {n: v for n, v in params_of(c).items() if n in self.distributions}
            trial.study.add_trial(optuna.trial.create_trial(
                state=TrialState.FAIL, params=params, distributions=self.distributions,
                user_attrs=TrialAttrs.user_attrs(config=key, slot=key, phase="implied", candidate=c.to_dict(),
                                                 outcome="implied_oom", reason=reason, implied_by=oom.label(),
                                                 pred_analytic_tflops=est.model_tflops_per_gpu)))

    def _copy(self, trial: optuna.Trial, earlier: TrialRecord) -> float:
        """Answer the trial from an earlier trial's stored result (no probe)."""
        keep = ("measured_tflops", "measured_step_s", "measured_memory_gb", "device", "reason")
        self._set(trial, outcome="duplicate", duplicate_of=earlier.number, original_outcome=earlier.outcome,
                  **{k: earlier.attrs[k] for k in keep if k in earlier.attrs})
        if earlier.state == "COMPLETE" and earlier.value is not None:
            return earlier.value
        raise ProbeFailed(f"duplicate of trial {earlier.number} ({earlier.outcome}: {earlier.reason})")

    @staticmethod
    def _set(trial: optuna.Trial, **attrs: object) -> None:
        for k, v in TrialAttrs.user_attrs(**attrs).items():   # every name one of TrialAttrs' fields
            trial.set_user_attr(k, v)


__all__ = ["Ledger", "Objective", "ProbeFailed", "ProbeSettings", "TrialRecord", "probe_layers", "suggest"]
