"""Context and expert parallelism of a probe: `ProbeExtent` (no torch here; its rules: `planner.rules`).

    >>> from probes.extent import resolve_probe
    >>> layout, extent = resolve_probe(spec, world=4)     # raises LayoutError("cp 2 needs tp = 1 ...")

`probes.layout.resolve_layout` resolves TP/PP/DP; a probe spec may add context parallelism
(``cp``: ranks that split each sequence) and a mixture-of-experts layer with expert parallelism
(``num_experts``, ``moe_top_k``, ``ep``). CP multiplies the world (TP·CP·PP·DP), EP splits the DP
ranks (EP divides DP, as Megatron-Core's expert-model-parallel group). Defaults (cp 1, ep 1,
num_experts 0) leave a spec as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.rules import probe_extent_violations
from probes.layout import LayoutError, ProbeLayout, candidate, model_spec, resolve_layout
from probes.result import ProbeSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeExtent:
    cp: int = 1
    ep: int = 1
    num_experts: int = 0
    moe_top_k: int = 2

    def dp_impl(self, layout: ProbeLayout) -> str:
        """The data-parallel wrapper: under CP the gradient is averaged over DP x CP even when DP is 1."""
        if self.cp > 1 and layout.dp_impl == "none":
            return "ddp" if layout.zero == 0 else "fsdp"
        return layout.dp_impl

    def label(self) -> str:
        parts = []
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.num_experts:
            parts.append(f"experts={self.num_experts},top_k={self.moe_top_k},ep={self.ep}")
        return ",".join(parts)


def probe_extent(spec: ProbeSpec) -> ProbeExtent:
    return ProbeExtent(cp=spec.cp, ep=spec.ep, num_experts=spec.num_experts, moe_top_k=spec.moe_top_k)


def resolve_probe(spec: ProbeSpec, *, world: int, local_world: int | None = None) -> tuple[ProbeLayout, ProbeExtent]:
    """`resolve_layout` on world / CP, then the CP and EP rules; `LayoutError` naming every reason."""
    ext = probe_extent(spec)
    if ext.cp < 1 or ext.ep < 1 or ext.num_experts < 0:
        raise LayoutError(f"cp {ext.cp} and ep {ext.ep} must be >= 1, num_experts {ext.num_experts} >= 0")
    if world % ext.cp:
        raise LayoutError(f"world size {world} is not divisible by cp {ext.cp}")
    layout = resolve_layout(spec, world=world // ext.cp,
                            local_world=None if local_world is None else max(1, local_world // ext.cp))
    errors = [v.detail for v in probe_extent_violations(
        model_spec(spec), candidate(spec), cp=ext.cp, ep=ext.ep, num_experts=ext.num_experts,
        moe_top_k=ext.moe_top_k, dp_run=layout.dp_run, dp_impl=layout.dp_impl)]
    if errors:
        raise LayoutError("; ".join(errors))
    return layout, ext


def probe_world(spec: ProbeSpec) -> int:
    """Processes the full candidate needs: TP·CP·PP·DP."""
    c = spec.candidate
    return int(c["tp"]) * int(c["pp"]) * int(c["dp"]) * spec.cp


__all__ = ["ProbeExtent", "probe_extent", "probe_world", "resolve_probe"]
