"""`ProbeSpec` (what to run) and `ProbeResult` (what came back): the probes' data contract.

No torch here: `search` imports this module to read results without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATUSES = ("ok", "oom", "timeout", "crash", "invalid", "pruned")
"""``pruned``: stopped early by the caller's ``on_step`` (clearly slower than the best so far); only a backend that
was given ``on_step`` returns it"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSpec:
    """One probe: a model shape, a parallel layout and how long to measure.

    ``model`` is a `planner.model.ModelSpec` as a dict (ModelSpec.to_dict()); ``candidate`` a
    `planner.space.Candidate` as a dict. ``layers_run`` < model layers means a reduced model.
    """

    model: dict
    candidate: dict
    precision: str = "bf16"
    warmup_steps: int = 2
    steps: int = 5
    layers_run: int | None = None
    seed: int = 1234
    device: str = "auto"
    """auto | cuda | cpu"""
    pp_schedule: str = "1F1B"
    """1F1B | GPipe | Interleaved1F1B"""
    max_cv: float = 0.15
    """re-measure when the step times' coefficient of variation is above this"""
    cp: int = 1
    """context-parallel degree: ranks that split each sequence (world = TP*CP*PP*DP)"""
    ep: int = 1
    """expert-parallel degree (divides DP); needs num_experts > 0"""
    num_experts: int = 0
    """0: dense MLPs; > 0: every layer's MLP is a top-k mixture of this many experts of the MLP's shape"""
    moe_top_k: int = 2
    profile: bool = False
    """also run one profiled step and report its compute / communication split (torch.profiler)"""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ProbeSpec":
        return cls(**d)


PHASES = ("queue", "launch", "rendezvous", "build", "warmup", "steps", "teardown")
"""where a probe's wall time goes: waiting for an allocation or a slice (queue), starting the launcher and the
workers up to the probe's own code (launch), process groups (rendezvous), the model, optimizer and data (build),
the untimed warm-up steps (warmup), the timed steps (steps) and the rest up to the last process' exit (teardown)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    status: str
    """ok | oom | timeout | crash | invalid | pruned"""
    reason: str = ""
    """for non-ok: the root cause, one line (e.g. 'rank 1: RuntimeError: ...')"""
    root_cause_rank: int | None = None
    step_times_s: list[float] = field(default_factory=list)
    step_time_median_s: float | None = None
    step_time_cv: float | None = None
    stable: bool | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    model_tflops_per_device: float | None = None
    hardware_tflops_per_device: float | None = None
    peak_memory_bytes_per_rank: list[float] = field(default_factory=list)
    memory_kind: str = ""
    """cuda_max_allocated | cuda_max_reserved | rss"""
    reduced: bool = False
    """ran fewer layers or a single DP replica than the candidate names"""
    projected: dict = field(default_factory=dict)
    """the planner's projection of the full configuration from this measurement"""
    losses: list[float] = field(default_factory=list)
    device: str = ""
    world_size: int = 0
    wall_s: float | None = None
    workdir: str = ""
    memory_per_rank: list[dict] = field(default_factory=list)
    """per rank: stage (only | first | middle | last, as planner.memory.MemoryBreakdown.stage),
    params_on_gpu, measured local-shard tensor bytes (param_bytes, grads_bytes, optimizer_state_bytes),
    the same in the planner's terms (weights_bytes: None when the forward's 16-bit copy is autocast's
    cache; grads_bytes; optimizer_bytes = fp32 master + states), peak_allocated_bytes,
    peak_reserved_bytes, context_bytes, non_allocator_bytes (CUDA; None on CPU), rss_start/after_setup/
    peak bytes (CPU), materialise_peak_growth_bytes (peak rise while a chunk got storage and initial
    values: its shard plus one full parameter), peak_reset (the peak counters were reset after set-up)"""
    precision_recipe: dict = field(default_factory=dict)
    """param_dtype, compute_dtype, master_weights, grad_dtype, optimizer_state_dtype, bytes_per_param,
    differs_from_planner (what differs from the planner's 18 bytes per parameter)"""
    timing_split: dict = field(default_factory=dict)
    """one profiled step (spec.profile): step_s, compute_s and compute_s_by_class (gemm, attention, elementwise,
    optimizer: probes.train.op_class), communication seconds by collective and per parallel dimension"""
    phases: dict = field(default_factory=dict)
    """seconds of the probe's wall time by phase (`PHASES`), as far as it got: where the time went"""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown probe status {self.status!r}; one of {STATUSES}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "ProbeResult":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def read(cls, path: str | Path) -> "ProbeResult":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")
