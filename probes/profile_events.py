"""A profiled step's events as `probes.train.profile_split` reads them, from the profiler's raw (Kineto) list.

``torch.profiler.profile.events()`` builds a ``FunctionEvent`` for every event and links them into a tree in Python:
about 0.3 s for the ~4,000 operators of a small training step on the CPU, paid by every rank of every probe. The
split needs of each event only its name, where it ran, its duration and, for an operator on the CPU, its self time
and the names of the operators it ran inside; this reads them from the raw events (~3 ms), with the tree built as
``torch.autograd.profiler_util.EventList._populate_cpu_children`` builds it: per thread, synchronous CPU events
sorted by (start, -end), each the child of the innermost open event that contains it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORED = frozenset({"[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                     "profiler::_record_function_enter_new", "profiler::_record_function_exit", "aten::is_leaf",
                     "aten::output_nr", "aten::_version"})
"""names torch's event list leaves out (torch.autograd.profiler_util._filter_name): utility events"""


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One event of a profiled step."""

    name: str
    on_device: bool
    """a CUDA kernel or copy (else an event on the CPU: an operator, a gloo collective's span, an annotation)"""
    seconds: float
    self_seconds: float
    """CPU events: ``seconds`` less the events directly inside it (0 for an async one; on the device: ``seconds``)"""
    ancestors: tuple[str, ...] = ()
    """CPU events: the names of the events it ran inside, innermost first"""
    annotation: bool = False
    """a user annotation (record_function, 'nccl:all_reduce'), which spans events counted themselves"""


def step_events(prof: "torch.profiler.profile") -> list[StepEvent]:
    """Every event of ``prof`` (a finished torch.profiler.profile) but `IGNORED` and hidden ones, as torch's
    _parse_kineto_results keeps them (torch/autograd/profiler.py)."""
    cpu = torch.autograd.DeviceType.CPU
    out: list[StepEvent] = []
    threads: dict[int, list] = {}
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name in IGNORED or e.is_hidden_event():
            continue
        if e.device_type() != cpu:
            seconds = e.duration_ns() / 1e9
            out.append(StepEvent(name, True, seconds, seconds, annotation=e.is_user_annotation()))
        elif e.is_async() or e.start_thread_id() != e.end_thread_id():   # no place in a thread's nesting, no self
            # time (as torch's)
            out.append(StepEvent(name, False, e.duration_ns() / 1e9, 0.0, annotation=e.is_user_annotation()))
        else:
            threads.setdefault(e.start_thread_id(), []).append(e)
    for events in threads.values():
        out.extend(_nested(events))
    return out


def _nested(events: list) -> list[StepEvent]:
    """One thread's synchronous CPU events, each with its self time and ancestors: nested as torch's
    EventList._populate_cpu_children nests them (sorted by (start, -end), each the child of the innermost open event
    containing it), then its _remove_dup_nodes (an event that is the only child of one of its own name is merged
    into it: a dispatcher's repeated frame)."""
    events.sort(key=lambda e: (e.start_ns(), -e.end_ns()))
    roots: list[list] = []
    stack: list[list] = []                    # open nodes: [name, ns, children, annotation, end_ns]
    for e in events:
        start, end = e.start_ns(), e.end_ns()
        while stack and (start >= stack[-1][4] or end > stack[-1][4]):
            stack.pop()
        node = [e.name(), end - start, [], e.is_user_annotation(), end]
        (stack[-1][2] if stack else roots).append(node)
        stack.append(node)
    out: list[StepEvent] = []
    todo = [(node, ()) for node in reversed(roots)]
    while todo:
        node, ancestors = todo.pop()
        name, ns, children, annotation, _ = node
        while len(children) == 1 and children[0][0] == name:
            children = children[0][2]
        out.append(StepEvent(name, False, ns / 1e9, (ns - sum(c[1] for c in children)) / 1e9, ancestors, annotation))
        inner = (name, *ancestors)
        todo.extend((child, inner) for child in reversed(children))
    return out


__all__ = ["IGNORED", "StepEvent", "step_events"]
