"""The search space: the planner's surviving candidates as structured parameters, and what an OOM implies.

    >>> from search.space import SearchSpace
    >>> space = SearchSpace.from_plan(planner.plan(model, cluster, training))
    >>> space.lookup({"tp": 1, "pp": 2, "mbs": 4, "recompute": "full", "zero": 1})   # an Estimate, or None

A configuration is a point of (tp, pp, mbs, recompute, zero, sp, vpp, hybrid, cp, ep, etp, offload, opt_offload); dp
and gas follow from the world size and the global batch. A parameter a trial does not record (a study made before
cp/ep/etp/offload/opt_offload were parameters) takes its default (`DEFAULTS`: 1, no offload). Only survivors of
`planner.plan` are points of the space: a sampler's proposal is mapped to the nearest survivor
(`SearchSpace.nearest`), so a configuration the planner ruled out is never probed. No optuna import at module level (``distributions`` imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner import Candidate, Estimate, Plan
from planner.space import DIMENSIONS, RECOMPUTE

from search._base import RECOMPUTE_MEMORY_ORDER, recompute_sort_key

PARAMS = tuple(d.name for d in DIMENSIONS if d.searched)
"""the structured parameters a trial records (Optuna param names): planner.space.DIMENSIONS but DP and GAS"""
DEFAULTS = {"cp": 1, "ep": 1, "etp": 1, "offload": "", "opt_offload": 0.0}
"""the value of a parameter a stored trial lacks (studies created before context and expert parallelism)"""
LOG2_PARAMS = tuple(d.name for d in DIMENSIONS if d.log2)
"""sizes compared on a log2 scale by the nearest-survivor distance"""


def config_key(candidate: Candidate) -> str:
    """The one key of a configuration: the candidate's label (dp and gas included)."""
    return candidate.label()


def params_of(candidate: Candidate) -> dict:
    return {name: getattr(candidate, name) for name in PARAMS}


def with_defaults(params: dict) -> dict:
    """``params`` with every parameter it lacks that has a default (`DEFAULTS`) filled in."""
    return {**{k: v for k, v in DEFAULTS.items() if k not in params}, **params}


def _key_of_params(params: dict) -> tuple:
    return tuple(params.get(name, DEFAULTS.get(name)) for name in PARAMS)


def distance(a: dict, b: dict) -> float:
    """How far two configurations are: log2 steps of sizes, ZeRO stages, recompute levels, flag flips."""
    d = 0.0
    for name in PARAMS:
        x, y = a.get(name, DEFAULTS.get(name)), b.get(name, DEFAULTS.get(name))
        if x is None or y is None or x == y:
            continue
        if name in LOG2_PARAMS:
            d += abs(math.log2(max(float(x), 1e-9)) - math.log2(max(float(y), 1e-9)))
        elif name == "recompute":
            d += abs(RECOMPUTE.index(x) - RECOMPUTE.index(y)) if x in RECOMPUTE and y in RECOMPUTE else 1.0
        elif isinstance(x, str) or isinstance(y, str):   # a named choice (the activation offload's modules)
            d += 1.0
        else:
            d += abs(float(x) - float(y))
    return d


def needs_more_memory(candidate: Candidate, than: Candidate) -> bool:
    """True when ``candidate`` needs at least the memory of ``than`` on the same layout (and is not it).

    Same layout: tp, pp, dp, vpp, hybrid, cp, ep and etp equal. At least as much memory: MBS not smaller,
    recompute not more aggressive (none > selective > full in memory), ZeRO stage not higher
    (less sharding), sequence parallelism not added. An OOM of ``than`` then implies an OOM of
    ``candidate`` (every term of the activation and model-state memory is monotone in these).
    """
    c, t = candidate, than
    if (c.tp, c.pp, c.dp, c.vpp, c.hybrid, c.cp, c.ep, c.etp) != (t.tp, t.pp, t.dp, t.vpp, t.hybrid, t.cp, t.ep, t.etp):
        return False
    if c == t:
        return False
    order = RECOMPUTE_MEMORY_ORDER
    keeps_more = (c.recompute == t.recompute if c.recompute not in order or t.recompute not in order
                  else order[c.recompute] >= order[t.recompute])
    return c.mbs >= t.mbs and keeps_more and c.zero <= t.zero and (not c.sp or t.sp)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The survivors (ranked by the analytic model) and the index from parameters to them."""

    plan: Plan
    survivors: tuple[Estimate, ...]
    """the points of the space, best predicted first"""
    restricted_out: tuple[tuple[str, str], ...] = ()
    """(config, why) for rows a restriction (e.g. a replay table) names that the planner ruled out"""
    _index: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index.update({_key_of_params(params_of(e.candidate)): e for e in self.survivors})

    @classmethod
    def from_plan(cls, plan: Plan, *, keep: set[str] | None = None,
                  restricted_out: tuple[tuple[str, str], ...] = ()) -> "SearchSpace":
        """All survivors, or those whose `config_key` is in ``keep``."""
        survivors = tuple(e for e in plan.candidates if keep is None or config_key(e.candidate) in keep)
        return cls(plan=plan, survivors=survivors, restricted_out=restricted_out)

    def __len__(self) -> int:
        return len(self.survivors)

    @property
    def keys(self) -> list[str]:
        return [config_key(e.candidate) for e in self.survivors]

    def lookup(self, params: dict) -> Estimate | None:
        """The survivor with exactly these parameters, or None (ruled out, or not in the space)."""
        return self._index.get(_key_of_params(params))

    def by_key(self, key: str) -> Estimate | None:
        return next((e for e in self.survivors if config_key(e.candidate) == key), None)

    def values(self, name: str) -> list:
        vals = {getattr(e.candidate, name) for e in self.survivors}
        if name == "recompute":
            return sorted(vals, key=recompute_sort_key)
        return sorted(vals)

    def distributions(self) -> dict:
        """Optuna distributions of every parameter: log-int sizes, int ZeRO, categorical recompute/flags."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        out = {}
        for name in PARAMS:
            vals = self.values(name)
            if len(vals) == 1 or name in ("recompute", "sp", "hybrid") or isinstance(vals[0], (str, float)):
                out[name] = CategoricalDistribution(vals)
            elif name in LOG2_PARAMS:
                out[name] = IntDistribution(min(vals), max(vals), log=True)
            else:
                out[name] = IntDistribution(min(vals), max(vals))
        return out

    def nearest(self, proposal: dict, *, exclude: set[str], order: dict[str, int] | None = None) -> Estimate | None:
        """The survivor closest to ``proposal`` whose key is not in ``exclude``; ties to the better rank."""
        order = order or {}
        best, best_score = None, None
        for i, e in enumerate(self.survivors):
            key = config_key(e.candidate)
            if key in exclude:
                continue
            score = (distance(proposal, params_of(e.candidate)), order.get(key, i))
            if best_score is None or score < best_score:
                best, best_score = e, score
        return best

    def implied_oom(self, candidate: Candidate, ooms: list[Candidate]) -> Candidate | None:
        """The OOM'd configuration that implies ``candidate`` runs out of memory too, if any."""
        return next((o for o in ooms if needs_more_memory(candidate, o)), None)


__all__ = ["DEFAULTS", "LOG2_PARAMS", "PARAMS", "SearchSpace", "config_key", "distance", "needs_more_memory", "params_of",
           "with_defaults"]
