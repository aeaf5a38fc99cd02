"""What a probe will actually run, checked before anything is launched (no torch here).

    >>> from probes.layout import resolve_layout
    >>> layout = resolve_layout(spec, world=2)          # raises LayoutError("heads 4 % tp 3 ...")

`resolve_layout` turns a `ProbeSpec` and the number of processes into a `ProbeLayout`: the
degrees, the pipeline schedule, the data-parallel implementation, and whether the probe is
reduced (fewer layers, or one DP replica of a larger candidate). The layout rules are
`planner.rules.probe_layout_violations` (the one rulebook `tune` plans with). Every refusal is a
`LayoutError` whose message names the numbers and the rule, so that the launcher can report
``status="invalid"`` without starting a process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.model import ModelSpec, Rampup
from planner import recompute as recompute_modes
from planner.rules import PP_SCHEDULES, PROBE_RECOMPUTE, probe_layout_violations
from planner.space import RECOMPUTE, Candidate
from probes.result import ProbeSpec

PRECISIONS = ("bf16", "fp16", "fp32")


class LayoutError(ValueError):
    """The probe's configuration cannot run; the message is the one-line reason."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeLayout:
    """The resolved parallel layout of one probe run (what each rank builds)."""

    tp: int
    pp: int
    vpp: int
    """model chunks per pipeline rank (Interleaved1F1B); 1 otherwise"""
    dp_run: int
    """data-parallel degree actually run (1 when probing a single replica)"""
    dp_full: int
    """the candidate's data-parallel degree"""
    dp_replicate: int
    """HSDP replicate dimension (1 unless hybrid, or DP without sharding under TP/PP)"""
    dp_shard: int
    """FSDP shard dimension"""
    dp_impl: str
    """none | ddp | fsdp (FSDP2 fully_shard, possibly on a 2-D HSDP mesh)"""
    reshard_after_forward: bool
    """FSDP2: True for ZeRO-3 / FULL_SHARD, False for ZeRO-1/2 (params kept after forward)"""
    mbs: int
    gas: int
    recompute: str
    zero: int
    sp: bool
    hybrid: bool
    schedule: str
    """pipeline schedule (1F1B | GPipe | Interleaved1F1B); "" without PP"""
    precision: str
    layers_run: int
    layers_full: int
    tied_embeddings: bool
    """tied only without TP/PP: a tied table would span two pipeline stages / two TP layouts"""

    @property
    def world_run(self) -> int:
        return self.tp * self.pp * self.dp_run

    @property
    def global_batch_run(self) -> int:
        """sequences per optimizer step across the ranks that run: mbs * dp_run * gas"""
        return self.mbs * self.dp_run * self.gas

    @property
    def reduced(self) -> bool:
        return self.layers_run < self.layers_full or self.dp_run < self.dp_full

    @property
    def stages(self) -> int:
        return self.pp * self.vpp


def model_spec(spec: ProbeSpec) -> ModelSpec:
    """The full model the spec names, as a `ModelSpec`."""
    d = dict(spec.model)
    if isinstance(d.get("rampup"), list):
        r = d["rampup"]
        d["rampup"] = Rampup(start=r[0], increment=r[1], samples=r[2])
    return ModelSpec(**d)


def candidate(spec: ProbeSpec) -> Candidate:
    """The spec's TP/PP/DP layout; its context-parallel degree is the spec's ``cp`` (`probes.extent`), so a
    candidate dict that records cp (tune passes the planner's whole candidate) is read with cp = 1 here."""
    return replace(Candidate(**spec.candidate), cp=1)


def model_run(spec: ProbeSpec, layout: ProbeLayout) -> ModelSpec:
    """The model the probe actually builds: ``layers_run`` layers, embeddings untied under TP/PP."""
    return replace(model_spec(spec), layers=layout.layers_run, tied_embeddings=layout.tied_embeddings)


def resolve_layout(spec: ProbeSpec, *, world: int, local_world: int | None = None) -> ProbeLayout:
    """Check ``spec`` against ``world`` processes; the layout, or `LayoutError` with every reason.

    ``world`` may be the candidate's TP*PP*DP (the full layout) or TP*PP (one DP replica, reported
    as reduced). ``local_world`` (processes per node) only matters for hybrid sharding: the shard
    group is the node, the replicate group spans nodes.
    """
    m = model_spec(spec)
    c = candidate(spec)
    errors: list[str] = []
    if spec.precision not in PRECISIONS:
        errors.append(f"precision {spec.precision!r} is not one of {', '.join(PRECISIONS)}")
    if not recompute_modes.is_valid(c.recompute) or recompute_modes.kind(c.recompute) not in PROBE_RECOMPUTE:
        errors.append(f"recompute {c.recompute!r} is not one of {', '.join(RECOMPUTE)}, block-N or selective-op")
    if c.zero not in (0, 1, 2, 3):
        errors.append(f"zero {c.zero} is not a ZeRO stage 0-3")
    for name in ("tp", "pp", "dp", "mbs", "gas", "vpp"):
        if getattr(c, name) < 1:
            errors.append(f"{name} must be >= 1, got {getattr(c, name)}")
    if spec.steps < 1 or spec.warmup_steps < 0:
        errors.append(f"steps {spec.steps} must be >= 1 and warmup_steps {spec.warmup_steps} >= 0")
    if not spec.max_cv > 0:
        errors.append(f"max_cv {spec.max_cv} must be > 0")
    if errors:
        raise LayoutError("; ".join(errors))

    layers_run = spec.layers_run if spec.layers_run is not None else m.layers
    if not 1 <= layers_run <= m.layers:
        errors.append(f"layers_run {layers_run} must be in 1..{m.layers} (the model's layers)")

    if world == c.world:
        dp_run = c.dp
    elif world == c.tp * c.pp:
        dp_run = 1
    else:
        errors.append(f"world size {world} != tp({c.tp}) * pp({c.pp}) * dp({c.dp}) = {c.world} "
                      f"(or tp * pp = {c.tp * c.pp} for one DP replica)")
        dp_run = 1

    errors += [v.detail for v in probe_layout_violations(m, c, layers_run=layers_run, schedule=spec.pp_schedule)]
    schedule, vpp = "", 1
    if c.pp > 1:
        schedule = "Interleaved1F1B" if c.vpp > 1 and spec.pp_schedule == "1F1B" else spec.pp_schedule
        vpp = c.vpp if schedule == "Interleaved1F1B" else 1

    dp_replicate, dp_shard, dp_impl = 1, dp_run, "none"
    if dp_run > 1:
        if c.hybrid:
            nodes = max(1, world // (local_world or world))
            if dp_run % nodes == 0 and dp_run // nodes > 1:
                dp_replicate, dp_shard = nodes, dp_run // nodes
            else:
                dp_replicate, dp_shard = 1, dp_run
            dp_impl = "fsdp"
        elif c.zero == 0:
            if c.tp == 1 and c.pp == 1:
                dp_impl = "ddp"
            else:
                # DDP's reducer asserts under pipelining and DDP does not take DTensor (TP) params:
                # replicate with FSDP2 on an HSDP mesh whose shard dimension is 1 (= NO_SHARD).
                dp_replicate, dp_shard, dp_impl = dp_run, 1, "fsdp"
        else:
            dp_impl = "fsdp"
    if errors:
        raise LayoutError("; ".join(errors))
    return ProbeLayout(
        tp=c.tp, pp=c.pp, vpp=vpp, dp_run=dp_run, dp_full=c.dp, dp_replicate=dp_replicate, dp_shard=dp_shard,
        dp_impl=dp_impl, reshard_after_forward=c.zero == 3 or (c.hybrid and c.zero == 0),
        mbs=c.mbs, gas=c.gas, recompute=c.recompute, zero=c.zero, sp=c.sp, hybrid=c.hybrid,
        schedule=schedule, precision=spec.precision, layers_run=layers_run, layers_full=m.layers,
        tied_embeddings=m.tied_embeddings and c.tp == 1 and c.pp == 1)


__all__ = ["LayoutError", "ProbeLayout", "PP_SCHEDULES", "PRECISIONS", "candidate", "model_run", "model_spec",
           "resolve_layout"]
