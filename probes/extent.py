"""Context and expert parallelism of a probe: `ProbeExtent` and its rules (no torch here).

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
    errors: list[str] = []
    if ext.cp < 1 or ext.ep < 1 or ext.num_experts < 0:
        raise LayoutError(f"cp {ext.cp} and ep {ext.ep} must be >= 1, num_experts {ext.num_experts} >= 0")
    if world % ext.cp:
        raise LayoutError(f"world size {world} is not divisible by cp {ext.cp}")
    layout = resolve_layout(spec, world=world // ext.cp,
                            local_world=None if local_world is None else max(1, local_world // ext.cp))
    m, c = model_spec(spec), candidate(spec)
    if ext.cp > 1:
        if c.tp > 1 or c.pp > 1:
            errors.append(f"cp {ext.cp} is probed with tp = pp = 1 only (got tp {c.tp}, pp {c.pp})")
        if m.seq_len % (2 * ext.cp):
            errors.append(f"seq_len {m.seq_len} is not divisible by 2 * cp = {2 * ext.cp} "
                          "(load-balanced causal chunks)")
        if c.hybrid:
            errors.append("cp with hybrid sharding is not probed: use hybrid = false")
        if ext.ep > 1:
            errors.append("cp and ep together are not probed: use one of them")
    if ext.num_experts:
        if not 1 <= ext.moe_top_k <= ext.num_experts:
            errors.append(f"moe_top_k {ext.moe_top_k} must be in 1..num_experts {ext.num_experts}")
        if c.tp > 1:
            errors.append("mixture of experts is probed with tp = 1 (no expert tensor parallelism)")
        if ext.num_experts % ext.ep:
            errors.append(f"num_experts {ext.num_experts} is not divisible by ep {ext.ep}")
    if ext.ep > 1:
        if not ext.num_experts:
            errors.append(f"ep {ext.ep} needs num_experts > 0")
        if layout.dp_run % ext.ep:
            errors.append(f"ep {ext.ep} must divide the data-parallel ranks run ({layout.dp_run})")
        if c.pp > 1 or layout.dp_impl != "ddp":
            errors.append(f"ep {ext.ep} is probed with pp = 1 and zero = 0 (DDP) only")
    if errors:
        raise LayoutError("; ".join(errors))
    return layout, ext


def probe_world(spec: ProbeSpec) -> int:
    """Processes the full candidate needs: TP·CP·PP·DP."""
    c = spec.candidate
    return int(c["tp"]) * int(c["pp"]) * int(c["dp"]) * spec.cp


__all__ = ["ProbeExtent", "probe_extent", "probe_world", "resolve_probe"]
